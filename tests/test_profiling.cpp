// Per-phase timing, the verdict and the trace file (docs/profiling.md), as a user sees them:
// the phases of every step add up to the step, every all-to-all moves the bytes the layout
// says, the trace is valid Chrome trace-event JSON whose spans nest and whose step spans match
// the metrics, and the verdict names what bounds three runs built to be bound by
// communication, compute and memory. Device time without a GPU: a fake device timeline with
// known spans drives the totals, the metrics, the table and the verdict (launch-bound, native
// attention and collectives cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/report/step_report.h"
#include "core/report/trace_file.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

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

// The LM head computes only the rows whose targets count, on the synthetic task the answers
// (n_queries per sequence): the loss phase's FLOPs are theirs, so its rate is what it reached.
TEST(Profiling, TheLossPhaseCarriesTheFlopsOfTheRowsThatCount) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 1));
  const auto dry = run_command(kTrain + " --config " + dir.file("c.yaml") + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  const size_t vocab_at = dry.output.find("vocab_size: ");
  ASSERT_NE(vocab_at, std::string::npos) << dry.output;
  const double vocab = std::stod(dry.output.substr(vocab_at + 12));
  auto result = train(dir, 1);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const double batch = 2, answers = 2, d_model = 64;  // job_yaml's batch, n_queries, d_model
  const std::vector<json> steps = step_lines(dir);
  ASSERT_EQ(steps.size(), 6u);
  for (const json& step : steps)  // forward and the two gradient products: 3 × 2·rows·C·V
    EXPECT_EQ(step["phases"]["loss"]["flops"].get<double>(),
              3.0 * 2.0 * batch * answers * d_model * vocab);
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

// scripts/plot-trace.py draws the trace; a file that is not one is named, with status 2, not a
// Python traceback.
TEST(Profiling, PlotTraceDrawsTheTraceAndNamesAFileThatIsNotOne) {
  if (!std::filesystem::exists("/usr/bin/gnuplot"))
    GTEST_SKIP() << "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)";
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 1));
  auto result = train(dir, 1);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string plot = "/usr/bin/python3 " ULYSSES_SOURCE_DIR "/scripts/plot-trace.py ";
  auto drawn = run_command(plot + dir.file("trace.json") + " " + dir.file("trace.png"));
  EXPECT_EQ(drawn.exit_code, 0) << drawn.output;
  EXPECT_NE(drawn.output.find("spans of 1 ranks drawn"), std::string::npos) << drawn.output;
  EXPECT_GT(std::filesystem::file_size(dir.file("trace.png")), 0u);
  for (const std::string& name : {"m.jsonl", "missing.json"}) {
    auto refused = run_command(plot + dir.file(name) + " " + dir.file("other.png"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_EQ(refused.output.rfind("plot-trace: ", 0), 0u) << refused.output;
    EXPECT_EQ(refused.output.find("Traceback"), std::string::npos) << refused.output;
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

double seconds_between(DeviceTimeline::Clock::time_point from,
                       DeviceTimeline::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A device timeline that records what the profiler tells it, and hands back one span per
// closed phase where the host issued its marks (an idle device), so the wiring is checked
// without a GPU.
class RecordingTimeline final : public DeviceTimeline {
 public:
  void open(const char* phase, Clock::time_point issued) override {
    calls.push_back(std::string("open ") + phase);
    open_.push_back({phase, open_.empty() ? nullptr : open_.back().name, issued});
  }
  void close(Clock::time_point issued) override {
    calls.push_back(std::string("close ") + open_.back().name);
    closed_.push_back({open_.back(), issued});
    open_.pop_back();
  }
  DeviceRecord take(Clock::time_point origin) override {
    DeviceRecord record;
    for (const auto& [open, end] : closed_)
      record.spans.push_back({open.name, open.parent, Profiler::kDeviceTrack,
                              seconds_between(origin, open.begin), seconds_between(origin, end),
                              0});
    closed_.clear();
    return record;
  }
  std::vector<std::string> calls;

 private:
  struct Open {
    const char* name;
    const char* parent;
    Clock::time_point begin;
  };
  std::vector<Open> open_;
  std::vector<std::pair<Open, Clock::time_point>> closed_;
};

TEST(Profiling, DeviceTimelineSeesEveryOpenedPhaseAndItsSpansJoinTheTrace) {
  Profiler profiler;
  RecordingTimeline timeline;
  profiler.set_device_timeline(&timeline);
  { Profiler::Scope off(profiler, "before device timing"); }
  EXPECT_TRUE(timeline.calls.empty()) << "device timing is off until it is turned on";
  profiler.set_device_timing(true);
  { Profiler::Scope untraced(profiler, "before tracing"); }
  const ProfileTotals before = profiler.take_totals();
  EXPECT_TRUE(before.device_timed);
  EXPECT_EQ(before.phases.at("before tracing").count, 1);
  profiler.set_trace(true);
  profiler.reset_origin();
  {
    Profiler::Scope forward(profiler, "forward");
    Profiler::Scope attention(profiler, "attention");
  }
  {
    Profiler::Scope recompute(profiler, "recompute", Profiler::Kind::absorbing);
    Profiler::Scope absorbed(profiler, "mlp");  // its time is recompute's: not opened
    Profiler::Scope wait(profiler, "wait", Profiler::Kind::communication);  // opened
  }
  const std::vector<std::string> expected = {
      "open before tracing", "close before tracing", "open forward",   "open attention",
      "close attention",     "close forward",        "open recompute", "open wait",
      "close wait",          "close recompute"};
  EXPECT_EQ(timeline.calls, expected);

  const std::vector<TraceSpan> spans = profiler.take_trace();
  std::vector<std::string> device_names;
  for (const TraceSpan& span : spans)
    if (span.track == Profiler::kDeviceTrack) device_names.push_back(span.name);
  EXPECT_EQ(device_names, (std::vector<std::string>{"attention", "forward", "wait", "recompute"}));
  EXPECT_EQ(spans.size(), 8u);  // the same four on the compute track
  // The absorbed phase is nowhere; the device's seconds are self time, as the host's.
  const ProfileTotals totals = profiler.take_totals();
  EXPECT_EQ(totals.phases.count("mlp"), 0u);
  for (const char* name : {"forward", "attention", "recompute", "wait"})
    EXPECT_NEAR(totals.phases.at(name).seconds, totals.phases.at(name).host_seconds, 1e-9) << name;

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
  // A device communicator's collectives and the offload copies get their own named tracks,
  // only when present.
  EXPECT_FALSE(
      names_device_track(with_device, Profiler::kDeviceCollectiveTrack, "collectives stream"));
  TraceSpan collective;
  collective.name = "all_to_all";
  collective.track = Profiler::kDeviceCollectiveTrack;
  collective.bytes = 4096;
  host_spans.push_back(collective);
  TraceSpan copy = collective;
  copy.name = "offload copy";
  copy.track = Profiler::kDeviceTransferTrack;
  host_spans.push_back(copy);
  const json with_streams = json::parse("[" + trace_events_json(host_spans, 0) + "]");
  EXPECT_TRUE(
      names_device_track(with_streams, Profiler::kDeviceCollectiveTrack, "collectives stream"));
  EXPECT_TRUE(names_device_track(with_streams, Profiler::kDeviceTransferTrack, "transfer stream"));
  EXPECT_FALSE(names_device_track(with_streams, Profiler::kDeviceTrack, "device stream"));
  profiler.set_device_timeline(nullptr);
}

TEST(Profiling, DeviceTimingOffTimesOnTheHostAndRecordsNothingOnTheDevice) {
  Profiler profiler;
  RecordingTimeline timeline;
  profiler.set_device_timeline(&timeline);
  profiler.set_device_timing(true);
  EXPECT_TRUE(profiler.device_timing());
  profiler.set_device_timing(false);
  EXPECT_FALSE(profiler.device_timing());
  { Profiler::Scope phase(profiler, "mlp"); }
  EXPECT_TRUE(timeline.calls.empty());
  const ProfileTotals totals = profiler.take_totals();
  EXPECT_FALSE(totals.device_timed);
  EXPECT_EQ(totals.phases.at("mlp").seconds, totals.phases.at("mlp").host_seconds);
  profiler.set_device_timeline(nullptr);
}

// A device with known spans: what take hands back is what the test sets.
class FakeTimeline final : public DeviceTimeline {
 public:
  void open(const char*, Clock::time_point) override {}
  void close(Clock::time_point) override {}
  DeviceRecord take(Clock::time_point) override { return std::exchange(next, {}); }
  DeviceRecord next;
};

DeviceSpan device_span(const char* name, const char* parent, double begin, double end,
                       int track = Profiler::kDeviceTrack, int64_t bytes = 0) {
  DeviceSpan span;
  span.name = name;
  span.parent = parent;
  span.track = track;
  span.begin = begin;
  span.end = end;
  span.bytes = bytes;
  return span;
}

// One step of a profiler whose device timeline hands back `record`; `host_ms` is how long the
// host spends in each of the listed phases (nested in the step).
ProfileTotals fake_step(DeviceRecord record,
                        const std::vector<std::pair<const char*, int>>& host_ms) {
  Profiler profiler;
  FakeTimeline timeline;
  profiler.set_device_timeline(&timeline);
  profiler.set_device_timing(true);
  {
    Profiler::Scope step(profiler, phase::kStep);
    for (const auto& [name, ms] : host_ms) {
      Profiler::Scope phase(profiler, name);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
  }
  timeline.next = std::move(record);
  ProfileTotals totals = profiler.take_totals();
  profiler.set_device_timeline(nullptr);
  return totals;
}

TEST(Profiling, DeviceSecondsAreSelfTimeOfTheSpansAndBusyTimeIsTheirQueuedPart) {
  DeviceRecord record;
  record.spans = {
      device_span("mlp", "step", 0.010, 0.040),
      device_span("all-to-all wait", "recompute", 0.050, 0.060),
      device_span("recompute", "step", 0.045, 0.080), device_span("step", nullptr, 0.0, 0.100),
      device_span("all_to_all", nullptr, 0.050, 0.058, Profiler::kDeviceCollectiveTrack, 8000000)};
  // Overlapping and out of order: the union is [0, 0.055] and [0.090, 0.095].
  record.busy = {{0.020, 0.055}, {0.0, 0.030}, {0.090, 0.095}};
  record.launches = 42;
  const ProfileTotals totals = fake_step(record, {{"mlp", 0}});
  EXPECT_TRUE(totals.device_timed);
  EXPECT_NEAR(totals.device_busy_seconds, 0.060, 1e-12);
  EXPECT_EQ(totals.launches, 42);
  const auto& phases = totals.phases;
  EXPECT_NEAR(phases.at("mlp").seconds, 0.030, 1e-12);
  EXPECT_NEAR(phases.at("all-to-all wait").seconds, 0.010, 1e-12);
  EXPECT_NEAR(phases.at("recompute").seconds, 0.035 - 0.010, 1e-12);
  EXPECT_NEAR(phases.at(phase::kStep).seconds, 0.100 - 0.030 - 0.035, 1e-12);
  EXPECT_NEAR(phases.at("mlp").busy_seconds, 0.030, 1e-12);
  EXPECT_NEAR(phases.at("all-to-all wait").busy_seconds, 0.005, 1e-12);
  EXPECT_NEAR(phases.at("recompute").busy_seconds, 0.010 - 0.005, 1e-12);
  EXPECT_NEAR(phases.at(phase::kStep).busy_seconds, 0.060 - 0.030 - 0.010, 1e-12);
  EXPECT_NEAR(phases.at(phase::kCollectivesStream).seconds, 0.008, 1e-12);
  EXPECT_EQ(phases.at(phase::kCollectivesStream).bytes, 8000000);
  // The host's own seconds are kept apart: the phases the host opened have them.
  EXPECT_GT(phases.at(phase::kStep).host_seconds, 0.0);
  EXPECT_EQ(phases.at("mlp").count, 1);

  const json metrics = phases_json(totals);
  EXPECT_NEAR(metrics["other"]["s"].get<double>(), 0.035, 1e-12);
  EXPECT_EQ(metrics["other"]["host_s"].get<double>(), phases.at(phase::kStep).host_seconds);
  EXPECT_NEAR(metrics["mlp"]["busy_s"].get<double>(), 0.030, 1e-12);
  EXPECT_EQ(metrics["collectives stream"]["bytes"].get<int64_t>(), 8000000);
}

TEST(Profiling, WithoutADeviceSecondsAreTheHostsAndTheMetricsSaySoTwice) {
  Profiler profiler;
  {
    Profiler::Scope step(profiler, phase::kStep);
    Profiler::Scope mlp(profiler, "mlp");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const ProfileTotals totals = profiler.take_totals();
  EXPECT_FALSE(totals.device_timed);
  const json metrics = phases_json(totals);
  for (const char* name : {"mlp", "other"}) {
    EXPECT_EQ(metrics[name]["s"], metrics[name]["host_s"]) << name;
    EXPECT_FALSE(metrics[name].contains("busy_s")) << name;
  }
  EXPECT_GE(metrics["mlp"]["s"].get<double>(), 0.002);
}

// The table and the verdict of one step over a one-rank world, as the trainer makes them.
struct Report {
  std::string table;
  Verdict verdict;
};

Report report(const ProfileTotals& totals, double step_seconds, const VerdictContext& context) {
  auto world = make_local_comm();
  RunProfile profile;
  profile.add_step(totals, step_seconds);
  return {profile.table(*world),
          judge(profile.mean_over_ranks(*world), step_seconds, profile.steps(), context)};
}

TEST(Profiling, VerdictSaysLaunchBoundWhenTheDeviceIsIdleAndNamesTheHostHeavyPhases) {
  // 100 ms of step; the device had work queued 20 ms of it, 5 of them in the mlp, 1 in the
  // qkv projection, while the host spent at least 50 and 5 ms there (far apart, so that a
  // sleep that overruns on a loaded machine does not swap them).
  DeviceRecord record;
  record.spans = {device_span("qkv projection", "step", 0.000, 0.040),
                  device_span("mlp", "step", 0.040, 0.090),
                  device_span("step", nullptr, 0.0, 0.100)};
  record.busy = {{0.039, 0.040}, {0.085, 0.090}, {0.090, 0.104}};
  record.launches = 500;
  const ProfileTotals totals = fake_step(record, {{"qkv projection", 5}, {"mlp", 50}});
  VerdictContext context;
  context.native_attention = true;
  const Report result = report(totals, 0.100, context);
  EXPECT_EQ(result.verdict.kind, "launch-bound") << result.verdict.line;
  EXPECT_MENTIONS(result.verdict.line, "work queued for only 20% of the step");
  EXPECT_MENTIONS(result.verdict.line, "500 launches per step, 200.0 us of the step per launch");
  const size_t mlp = result.verdict.line.find("mlp (host ");
  const size_t qkv = result.verdict.line.find("qkv projection (host ");
  ASSERT_NE(mlp, std::string::npos) << result.verdict.line;
  ASSERT_NE(qkv, std::string::npos) << result.verdict.line;
  EXPECT_LT(mlp, qkv) << "the host's 50 ms in the mlp exceed the device's 5 the most: "
                      << result.verdict.line;
  EXPECT_MENTIONS(result.verdict.line, "device busy 5.00 ms per step");
  EXPECT_EQ(result.verdict.line.find("more threads per rank"), std::string::npos);
  // The table: device time with the host's beside it, the busy share and the launches.
  EXPECT_MENTIONS(result.table, "where the step time went (device time; mean over 1 ranks");
  EXPECT_MENTIONS(result.table, "host ms/step");
  EXPECT_MENTIONS(result.table, "device busy (work queued) 20% of the step; 500 launches per step");
  EXPECT_NE(result.table.find("  mlp                             50.00     50%"), std::string::npos)
      << result.table;
}

TEST(Profiling, VerdictOnADeviceBusyWithNativeAttentionAdvisesCudnn) {
  DeviceRecord record;
  record.spans = {device_span("attention forward", "step", 0.000, 0.030),
                  device_span("attention backward", "step", 0.030, 0.070),
                  device_span("mlp", "step", 0.070, 0.090),
                  device_span("step", nullptr, 0.0, 0.100)};
  record.busy = {{0.0, 0.098}};
  record.launches = 80;
  const ProfileTotals totals =
      fake_step(record, {{"attention forward", 0}, {"attention backward", 0}, {"mlp", 0}});
  VerdictContext context;
  context.native_attention = true;
  const Report native = report(totals, 0.100, context);
  EXPECT_EQ(native.verdict.kind, "compute-bound") << native.verdict.line;
  EXPECT_MENTIONS(native.verdict.line, "the largest is attention backward at 40%");
  EXPECT_MENTIONS(native.verdict.line, "Attention is 70% of the device's step");
  EXPECT_MENTIONS(native.verdict.line, "kernels.attention: cudnn");
  EXPECT_EQ(native.verdict.line.find("more threads per rank"), std::string::npos);
  EXPECT_MENTIONS(native.table, "device busy (work queued) 98% of the step; 80 launches per step");
  context.native_attention = false;  // already cuDNN's
  const Report cudnn = report(totals, 0.100, context);
  EXPECT_EQ(cudnn.verdict.kind, "compute-bound");
  EXPECT_EQ(cudnn.verdict.line.find("kernels.attention"), std::string::npos);
  EXPECT_MENTIONS(cudnn.verdict.line, "more sp ranks");
  EXPECT_EQ(cudnn.verdict.line.find("more threads per rank"), std::string::npos);
}

TEST(Profiling, VerdictOnADeviceWaitingForCollectivesGivesTheirBytesAndBandwidth) {
  // 60 ms of 100 waiting for the all-to-alls; the collectives stream moved 50 MB in 20 ms.
  DeviceRecord record;
  record.spans = {
      device_span("all-to-all wait", "step", 0.010, 0.070),
      device_span("mlp", "step", 0.070, 0.095), device_span("step", nullptr, 0.0, 0.100),
      device_span("all_to_all", nullptr, 0.040, 0.060, Profiler::kDeviceCollectiveTrack, 50000000)};
  record.busy = {{0.0, 0.100}};
  record.launches = 120;
  const ProfileTotals totals = fake_step(record, {{"all-to-all wait", 0}, {"mlp", 0}});
  VerdictContext context;
  context.ranks_on_node = 4;  // more ranks than cores: a cpu backend's trouble, not a device's
  context.cores_on_node = 2;
  const Report result = report(totals, 0.100, context);
  EXPECT_EQ(result.verdict.kind, "communication-bound") << result.verdict.line;
  EXPECT_MENTIONS(result.verdict.line, "waiting on other ranks is 60% of the step");
  EXPECT_MENTIONS(result.verdict.line,
                  "on the device the collectives moved 50.0 MB per step in 20.00 ms, 2.50 GB/s");
  EXPECT_EQ(result.verdict.line.find("ranks share"), std::string::npos);
  EXPECT_MENTIONS(result.table, "collectives stream (beside)");
}

TEST(Profiling, VerdictOnTheCpuStillAdvisesThreads) {
  ProfileTotals totals;
  totals.phases["mlp"].seconds = totals.phases["mlp"].host_seconds = 0.090;
  totals.phases[phase::kStep].seconds = totals.phases[phase::kStep].host_seconds = 0.010;
  const Report result = report(totals, 0.100, VerdictContext());
  EXPECT_EQ(result.verdict.kind, "compute-bound");
  EXPECT_MENTIONS(result.verdict.line, "more threads per rank");
  EXPECT_EQ(result.table.find("host ms/step"), std::string::npos) << result.table;
  EXPECT_EQ(result.table.find("device busy"), std::string::npos) << result.table;
}

// The row of the table that begins with name.
std::string table_row(const std::string& table, const std::string& name) {
  const size_t at = table.find("\n  " + name + " ");
  if (at == std::string::npos) return "";
  return table.substr(at + 1, table.find('\n', at + 1) - at - 1);
}

// Each phase that carries FLOPs gets its rate beside its share; the step row the rate of all
// of them (the model FLOP/s); the unit follows the fastest phase.
// The step line's "comm wait" and the metrics' comm_wait_s: the step's wait phases, not the
// collectives' in-flight spans, which overlap compute and each other (ZeRO-3 prefetch on 4
// ranks had them at 209% of the step).
TEST(Profiling, CommWaitIsTheWaitPhasesNotTheCollectivesInFlight) {
  ProfileTotals totals;
  const std::vector<std::pair<const char*, double>> phases = {
      {phase::kAllToAllWait, 0.010},         {phase::kRingWait, 0.003},
      {phase::kWeightGatherWait, 0.020},     {phase::kGradientReductionWait, 0.005},
      {phase::kScalarAllReduce, 0.001},      {phase::kMlp, 0.050},
      {phase::kAllToAllCopies, 0.004},       {phase::kAllToAllInFlight, 0.200},
      {phase::kWeightGatherInFlight, 0.300}, {phase::kGradientReductionInFlight, 0.100}};
  for (const auto& [name, seconds] : phases) totals.phases[name].seconds = seconds;
  EXPECT_NEAR(waiting_seconds(totals), 0.039, 1e-15);
}

TEST(Profiling, TheTableGivesEachPhaseItsFlopRate) {
  ProfileTotals device;
  device.device_timed = true;
  auto set = [](ProfileTotals& totals, const char* name, double seconds, double flops) {
    PhaseTotals& phase = totals.phases[name];
    phase.seconds = phase.host_seconds = seconds;
    phase.flops = flops;
  };
  set(device, "mlp", 0.050, 2.0e12);                // 40 TFLOP/s
  set(device, "attention forward", 0.020, 0.2e12);  // 10 TFLOP/s
  set(device, phase::kStep, 0.030, 0.0);
  const std::string table = report(device, 0.100, VerdictContext()).table;
  EXPECT_MENTIONS(table, "share   TFLOP/s  max ms/step");
  EXPECT_MENTIONS(table_row(table, "mlp"), "50.00     50%     40.00");
  EXPECT_MENTIONS(table_row(table, "attention forward"), "20.00     20%     10.00");
  EXPECT_MENTIONS(table_row(table, "other (norms, RoPE, copies)"), "30%         -");
  EXPECT_MENTIONS(table_row(table, "step"), "100.00    100%     22.00");

  ProfileTotals cpu;
  set(cpu, "mlp", 0.050, 1.0e9);  // 20 GFLOP/s
  set(cpu, phase::kStep, 0.050, 0.0);
  const std::string cpu_table = report(cpu, 0.100, VerdictContext()).table;
  EXPECT_MENTIONS(cpu_table, "share   GFLOP/s  max ms/step");
  EXPECT_MENTIONS(table_row(cpu_table, "mlp"), "50%     20.00");

  ProfileTotals no_flops;
  set(no_flops, "mlp", 0.050, 0.0);
  const std::string plain = report(no_flops, 0.100, VerdictContext()).table;
  EXPECT_EQ(plain.find("FLOP/s"), std::string::npos) << plain;
}

}  // namespace
}  // namespace ulysses
