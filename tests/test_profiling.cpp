// Per-phase timing, the verdict and the trace file (docs/profiling.md), as a user sees them:
// the phases of every step add up to the step, every all-to-all moves the bytes the layout
// says, the trace is valid Chrome trace-event JSON whose spans nest and whose step spans match
// the metrics, and the verdict names what bounds three runs built to be bound by
// communication, compute and memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/trace_file.h"
#include "kernels/profiler.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

#define EXPECT_MENTIONS(text, fragment) \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) << (text)

// llama, n_layers 2, d 64, 4 heads (2 kv heads), B 2, T 256.
std::string job_yaml(const TempDir& dir, int sp, const std::string& extra = "") {
  return "model: {family: llama, n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ff: 128}\n"
         "train: {steps: 6, batch_size: 2, seq_len: 256, seed: 3}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
         "parallel: {sp: " +
         std::to_string(sp) + "}\nlog: {metrics_file: " + dir.file("m.jsonl") +
         ", trace_file: " + dir.file("trace.json") + ", trace_steps: 3}\n" + extra;
}

testing::CommandResult train(const TempDir& dir, int ranks, const std::string& args = "") {
  return run_command("timeout 300 " + testing::mpirun(ranks) + kTrain + " --config " +
                     dir.file("c.yaml") + args);
}

std::vector<json> step_lines(const TempDir& dir) {
  std::vector<json> steps;
  for (const json& line : testing::read_metrics_lines(dir.file("m.jsonl")))
    if (line.contains("phases")) steps.push_back(line);
  return steps;
}

TEST(Profiling, PhasesAddUpToTheStepAndAllToAllBytesFollowTheLayout) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 4));
  auto result = train(dir, 4);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<json> steps = step_lines(dir);
  ASSERT_EQ(steps.size(), 6u);
  // One all-to-all sends (P-1)/P of a [P, B, Tl, h·d] f32 buffer: per rank B·Tl·h·d·4·(P-1).
  const int64_t P = 4, B = 2, Tl = 256 / P, d = 16, layers = 2;
  const int64_t q_bytes = B * Tl * (4 / P) * d * 4 * (P - 1);
  const int64_t kv_bytes = B * Tl * 1 * d * 4 * (P - 1);  // 2 kv heads on 4 ranks: replicated
  // Forward: q, k, v in, out back; backward: dout in, dq, dk, dv back.
  const int64_t per_layer = 2 * (2 * q_bytes + 2 * kv_bytes);
  for (const json& step : steps) {
    double sum = 0.0;
    for (const auto& [name, phase] : step["phases"].items())
      if (name.find("(in flight)") == std::string::npos) sum += phase["s"].get<double>();
    const double step_seconds = step["step_ms"].get<double>() / 1e3;
    EXPECT_NEAR(sum, step_seconds, 0.05 * step_seconds) << step.dump();
    EXPECT_EQ(step["phases"]["all-to-all wait"]["bytes"].get<int64_t>(), layers * per_layer);
    EXPECT_EQ(step["phases"]["all-to-all (in flight)"]["bytes"].get<int64_t>(), layers * per_layer);
    EXPECT_EQ(step["all_to_all_bytes"].get<int64_t>(), layers * per_layer);
    EXPECT_GT(step["phases"]["qkv projection"]["flops"].get<double>(), 0.0);
    EXPECT_GE(step["phases_max_s"]["all-to-all wait"].get<double>(),
              step["phases"]["all-to-all wait"]["s"].get<double>());
  }
  EXPECT_MENTIONS(result.output, "where the step time went (mean over 4 ranks and 6 steps)");
  EXPECT_MENTIONS(result.output, "all-to-all wait");
  EXPECT_MENTIONS(result.output, "verdict: ");
}

TEST(Profiling, TraceIsValidJsonWhoseSpansNestAndWhoseStepsMatchTheMetrics) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 2));
  auto result = train(dir, 2);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const json trace = json::parse(testing::read_text_file(dir.file("trace.json")));
  std::map<int, std::vector<json>> compute_spans;  // by rank
  std::map<int, int> in_flight;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] != "X") continue;
    if (event["tid"] == 0) compute_spans[event["pid"].get<int>()].push_back(event);
    if (event["tid"] == 1) in_flight[event["pid"].get<int>()] += 1;
  }
  ASSERT_EQ(compute_spans.size(), 2u);
  const std::vector<json> steps = step_lines(dir);
  for (auto& [rank, spans] : compute_spans) {
    EXPECT_GT(in_flight[rank], 0) << "rank " << rank;
    std::sort(spans.begin(), spans.end(), [](const json& a, const json& b) {
      return a["ts"].get<double>() < b["ts"].get<double>();
    });
    // Spans nest: each one ends before the innermost open span that contains its start.
    std::vector<double> open_ends;
    int step_spans = 0;
    for (const json& span : spans) {
      const double begin = span["ts"].get<double>(), end = begin + span["dur"].get<double>();
      while (!open_ends.empty() && open_ends.back() <= begin) open_ends.pop_back();
      if (!open_ends.empty()) EXPECT_LE(end, open_ends.back() + 1e-3) << span.dump();
      open_ends.push_back(end);
      if (span["name"] == "step") {
        ASSERT_LT(step_spans, 3) << "only the first 3 steps are traced";
        if (rank == 0) {
          const double metrics_ms = steps[size_t(step_spans)]["step_ms"].get<double>();
          EXPECT_NEAR(span["dur"].get<double>() / 1e3, metrics_ms, 0.05 * metrics_ms + 0.5);
        }
        ++step_spans;
      }
    }
    EXPECT_EQ(step_spans, 3) << "rank " << rank;
  }
}

TEST(Profiling, VerdictSaysCommunicationForATinyModelOnFourRanks) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 4));
  auto result = train(dir, 4, " --set train.seq_len=64");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "verdict: communication-bound: waiting on other ranks is");
  EXPECT_MENTIONS(result.output, "a bare all-to-all of");
}

TEST(Profiling, VerdictSaysComputeForAWideModelOnOneRank) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 1));
  auto result =
      train(dir, 1, " --set model.d_model=256 --set model.d_ff=1024 --set train.batch_size=4");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "verdict: compute-bound: compute phases are");
}

TEST(Profiling, VerdictSaysMemoryWhenThePeakIsNearTheLimit) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 1));
  auto first = train(dir, 1, " --set train.steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const int64_t peak = step_lines(dir).back()["mem_peak_bytes"]["total"].get<int64_t>();
  // A limit 5% above the peak the same run reached.
  const double limit_gib = 1.05 * double(peak) / (1024.0 * 1024.0 * 1024.0);
  auto tight =
      train(dir, 1, " --set train.steps=2 --set memory.limit_gib=" + std::to_string(limit_gib));
  ASSERT_EQ(tight.exit_code, 0) << tight.output;
  EXPECT_MENTIONS(tight.output, "verdict: memory-bound: peak tracked memory is 9");
}

// A device timeline that records what the profiler tells it, and returns one span per closed
// phase with made-up device times, so the wiring is checked without a GPU.
class RecordingTimeline final : public DeviceTimeline {
 public:
  void reset_origin() override { calls.push_back("origin"); }
  void open(const char* phase) override {
    calls.push_back(std::string("open ") + phase);
    open_.push_back(phase);
  }
  void close() override {
    calls.push_back("close " + open_.back());
    TraceSpan span;
    span.name = open_.back();
    span.begin_us = double(closed_.size());
    span.track = Profiler::kDeviceTrack;
    closed_.push_back(span);
    open_.pop_back();
  }
  std::vector<TraceSpan> take() override { return std::exchange(closed_, {}); }
  std::vector<std::string> calls;

 private:
  std::vector<std::string> open_;
  std::vector<TraceSpan> closed_;
};

TEST(Profiling, DeviceTimelineSeesEveryTracedPhaseAndItsSpansJoinTheTrace) {
  Profiler profiler;
  RecordingTimeline timeline;
  profiler.set_device_timeline(&timeline);
  { Profiler::Scope untraced(profiler, "before tracing"); }
  profiler.set_trace(true);
  profiler.reset_origin();
  {
    Profiler::Scope forward(profiler, "forward");
    Profiler::Scope attention(profiler, "attention");
  }
  {
    Profiler::Scope recompute(profiler, "recompute", Profiler::Kind::absorbing);
    Profiler::Scope absorbed(profiler, "mlp");  // its time is recompute's: not opened
  }
  const std::vector<std::string> expected = {"origin",          "open forward",  "open attention",
                                             "close attention", "close forward", "open recompute",
                                             "close recompute"};
  EXPECT_EQ(timeline.calls, expected);

  const std::vector<TraceSpan> spans = profiler.take_trace();
  std::vector<std::string> device_names;
  for (const TraceSpan& span : spans)
    if (span.track == Profiler::kDeviceTrack) device_names.push_back(span.name);
  EXPECT_EQ(device_names, (std::vector<std::string>{"attention", "forward", "recompute"}));
  EXPECT_EQ(spans.size(), 6u);  // the same three on the compute track

  std::vector<TraceSpan> host_spans;
  for (const TraceSpan& span : spans)
    if (span.track != Profiler::kDeviceTrack) host_spans.push_back(span);
  const json with_device = json::parse("[" + trace_events_json(spans, 0) + "]");
  const json without_device = json::parse("[" + trace_events_json(host_spans, 0) + "]");
  auto names_device_track = [](const json& events, int track, const std::string& name) {
    for (const json& event : events)
      if (event["ph"] == "M" && event.contains("tid") && event["tid"] == track &&
          event["args"]["name"] == name)
        return true;
    return false;
  };
  EXPECT_TRUE(names_device_track(with_device, Profiler::kDeviceTrack, "device stream"));
  EXPECT_FALSE(names_device_track(without_device, Profiler::kDeviceTrack, "device stream"));
  // A device communicator's collectives get their own named track, only when present.
  EXPECT_FALSE(
      names_device_track(with_device, Profiler::kDeviceCollectiveTrack, "collectives stream"));
  TraceSpan collective;
  collective.name = "all_to_all";
  collective.track = Profiler::kDeviceCollectiveTrack;
  collective.bytes = 4096;
  host_spans.push_back(collective);
  const json with_collective = json::parse("[" + trace_events_json(host_spans, 0) + "]");
  EXPECT_TRUE(
      names_device_track(with_collective, Profiler::kDeviceCollectiveTrack, "collectives stream"));
  EXPECT_FALSE(names_device_track(with_collective, Profiler::kDeviceTrack, "device stream"));
  profiler.set_device_timeline(nullptr);
}

}  // namespace
}  // namespace ulysses
