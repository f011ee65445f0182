// Where the time of a training step goes (docs/profiling.md). Phases are named spans timed
// on the host; they nest, and time is charged to the innermost open phase (self time), so
// the phases of a step add up to the step. A phase may carry the bytes it moved and the
// FLOPs it computed. Operations that run on their own between an issue and a completion
// (non-blocking collectives) are recorded as spans of their own on a second track. With
// tracing on, every span is also kept for a Chrome trace-event file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ulysses {

// The phases of a training step, one name each wherever they are timed.
namespace phase {
inline constexpr const char* kStep = "step";  // self time: norms, RoPE, residual copies
inline constexpr const char* kData = "data";
inline constexpr const char* kEmbedding = "embedding";
inline constexpr const char* kQkvProjection = "qkv projection";
inline constexpr const char* kAllToAllCopies = "all-to-all copies";
inline constexpr const char* kAllToAllWait = "all-to-all wait";
inline constexpr const char* kAttentionForward = "attention forward";
inline constexpr const char* kAttentionBackward = "attention backward";
inline constexpr const char* kOutputProjection = "output projection";
inline constexpr const char* kMlp = "mlp";
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kRecompute = "recompute";
inline constexpr const char* kWeightGatherWait = "weight gather wait";
inline constexpr const char* kGradientReductionWait = "gradient reduction wait";
inline constexpr const char* kScalarAllReduce = "scalar all-reduce";
inline constexpr const char* kOptimizer = "optimizer";
// Spans of collectives from issue to completion (kCommTrack); they overlap the phases above.
inline constexpr const char* kAllToAllInFlight = "all-to-all (in flight)";
inline constexpr const char* kWeightGatherInFlight = "weight gather (in flight)";
inline constexpr const char* kGradientReductionInFlight = "gradient reduction (in flight)";
}  // namespace phase

struct PhaseTotals {
  double seconds = 0.0;  // self time
  int64_t bytes = 0;
  double flops = 0.0;
  int64_t count = 0;  // spans
};

struct TraceSpan {
  std::string name;
  double begin_us = 0.0;  // since the profiler's origin
  double duration_us = 0.0;
  // 0: the compute thread; 1: collectives in flight; 2: the device stream; 3: the
  // collectives' device stream
  int track = 0;
  int64_t bytes = 0;
  double flops = 0.0;
};

// Times on a device stream, for a backend whose ops run asynchronously (cuda): while the
// profiler traces, it says where each phase opens and closes, and the timeline returns the
// spans as the device ran them when the trace is taken.
class DeviceTimeline {
 public:
  virtual ~DeviceTimeline() = default;
  virtual void reset_origin() = 0;  // at the profiler's origin
  virtual void open(const char* phase) = 0;
  virtual void close() = 0;
  // Waits for the device; the spans recorded since the last call, on the device tracks.
  virtual std::vector<TraceSpan> take() = 0;
};

class Profiler {
 public:
  static constexpr int kComputeTrack = 0;
  static constexpr int kCommTrack = 1;
  static constexpr int kDeviceTrack = 2;            // the backend's stream, where it has one
  static constexpr int kDeviceCollectiveTrack = 3;  // a device communicator's stream (NCCL)

  // Inline: the backends construct one without linking this library's objects.
  Profiler() : origin_(std::chrono::steady_clock::now()) {}

  // Times from now on are measured from here (ranks call it right after a barrier, so
  // their traces line up).
  void reset_origin();
  double now() const;  // seconds since the origin

  void set_trace(bool on) { trace_ = on; }
  bool tracing() const { return trace_; }

  // Called as each phase opens and closes: the CUDA backend makes them NVTX ranges, so the
  // same names appear in Nsight Systems.
  void set_range_hooks(void (*open)(const char* phase), void (*close)()) {
    open_range_ = open;
    close_range_ = close;
  }
  void set_device_timeline(DeviceTimeline* timeline) { device_ = timeline; }

  // Inside an absorbing phase (recompute) nested phases are not opened: their time is the
  // absorbing phase's, except for phases marked as waiting on communication.
  enum class Kind { compute, communication, absorbing };

  // A phase from construction to destruction.
  class Scope {
   public:
    Scope(Profiler& profiler, const char* phase, Kind kind = Kind::compute, int64_t bytes = 0,
          double flops = 0.0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler& profiler_;
    bool open_;
  };

  // A span that ran by itself from begin to end (seconds since the origin): it goes on the
  // communication track and into the totals under its name, without touching the nesting.
  void record_in_flight(const std::string& name, double begin, double end, int64_t bytes);

  // Totals by phase since the last call, then cleared.
  std::map<std::string, PhaseTotals> take_totals();
  // Trace spans since the last call, then cleared.
  std::vector<TraceSpan> take_trace();

 private:
  struct Open {
    const char* phase;
    double begin;
    double child_seconds;
    int64_t bytes;
    double flops;
    Kind kind;
    bool on_device;  // the device timeline has it open
  };
  bool push(const char* phase, Kind kind, int64_t bytes, double flops);
  void pop();

  std::chrono::steady_clock::time_point origin_;
  bool trace_ = false;
  std::vector<Open> stack_;
  std::map<std::string, PhaseTotals> totals_;
  std::vector<TraceSpan> trace_spans_;
  void (*open_range_)(const char*) = nullptr;
  void (*close_range_)() = nullptr;
  DeviceTimeline* device_ = nullptr;
};

}  // namespace ulysses
