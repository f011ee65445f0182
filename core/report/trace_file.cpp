#include "core/report/trace_file.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "core/checkpoint/file_util.h"
#include "parallel/agreement.h"

namespace ulysses {

std::string trace_events_json(const std::vector<TraceSpan>& spans, int rank) {
  using nlohmann::json;
  std::string text;
  auto add = [&](const json& event) {
    if (!text.empty()) text += ",\n";
    text += event.dump();
  };
  add({{"name", "process_name"},
       {"ph", "M"},
       {"pid", rank},
       {"args", {{"name", "rank " + std::to_string(rank)}}}});
  add({{"name", "process_sort_index"},
       {"ph", "M"},
       {"pid", rank},
       {"args", {{"sort_index", rank}}}});
  add({{"name", "thread_name"},
       {"ph", "M"},
       {"pid", rank},
       {"tid", Profiler::kComputeTrack},
       {"args", {{"name", "compute"}}}});
  add({{"name", "thread_name"},
       {"ph", "M"},
       {"pid", rank},
       {"tid", Profiler::kCommTrack},
       {"args", {{"name", "collectives in flight"}}}});
  // Only a backend with streams (cuda) puts spans on the device tracks: they are named only
  // where they have spans.
  const std::pair<int, const char*> device_tracks[] = {
      {Profiler::kDeviceTrack, "device stream"},
      {Profiler::kDeviceCollectiveTrack, "collectives stream"},
      {Profiler::kDeviceTransferTrack, "transfer stream"}};
  for (const auto& [track, track_name] : device_tracks) {
    const bool used =
        std::any_of(spans.begin(), spans.end(),
                    [track = track](const TraceSpan& span) { return span.track == track; });
    if (!used) continue;
    add({{"name", "thread_name"},
         {"ph", "M"},
         {"pid", rank},
         {"tid", track},
         {"args", {{"name", track_name}}}});
  }
  for (const TraceSpan& span : spans) {
    json args = {{"bytes", span.bytes}};
    if (span.flops > 0) args["flops"] = span.flops;
    add({{"name", span.name == phase::kStep ? "step" : span.name},
         {"ph", "X"},
         {"ts", span.begin_us},
         {"dur", span.duration_us},
         {"pid", rank},
         {"tid", span.track},
         {"args", args}});
  }
  return text;
}

void write_trace_file(Comm& world, const std::vector<TraceSpan>& spans, const std::string& path) {
  const std::vector<std::string> per_rank =
      all_gather_strings(world, trace_events_json(spans, world.rank()));
  if (world.rank() != 0) return;
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t rank = 0; rank < per_rank.size(); ++rank)
    text += (rank > 0 ? ",\n" : "") + per_rank[rank];
  text += "\n]}\n";
  try {
    create_parent_folders(path);
    replace_file_durably(path, text);
  } catch (const std::exception& problem) {
    throw std::runtime_error("writing log.trace_file '" + path + "' failed: " + problem.what());
  }
}

}  // namespace ulysses
