// Where the time of a training step goes (docs/profiling.md). Phases are named spans; they
// nest, and time is charged to the innermost open phase (self time), so the phases of a step
// add up to the step. A phase may carry the bytes it moved and the FLOPs it computed. Each
// phase is timed on the host and, where the backend has a device timeline (cuda), also where
// its work ran on the device: there the device time is the phase's time. Operations that run
// on their own between an issue and a completion (non-blocking collectives) are recorded as
// spans of their own on a second track. With tracing on, every span is also kept for a
// Chrome trace-event file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
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
inline constexpr const char* kRingWait = "ring p2p wait";  // parallel.ring > 1
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
inline constexpr const char* kRingInFlight = "ring p2p (in flight)";
inline constexpr const char* kWeightGatherInFlight = "weight gather (in flight)";
inline constexpr const char* kGradientReductionInFlight = "gradient reduction (in flight)";
// What the device's other streams ran (device timeline only); they overlap the phases too.
inline constexpr const char* kCollectivesStream = "collectives stream";  // NCCL
inline constexpr const char* kTransferStream = "transfer stream";        // offload copies
}  // namespace phase

struct PhaseTotals {
  // Self time: on the device while device timing is on, else on the host.
  double seconds = 0.0;
  double host_seconds = 0.0;  // self time on the host (equal to seconds without a device)
  // Of seconds, the time during which the device had work queued (device timing only).
  double busy_seconds = 0.0;
  int64_t bytes = 0;
  double flops = 0.0;
  int64_t count = 0;  // spans
};

// What the profiler measured since the last take.
struct ProfileTotals {
  std::map<std::string, PhaseTotals> phases;
  bool device_timed = false;         // the phases' seconds are device time
  double device_busy_seconds = 0.0;  // some device stream had work queued (docs/profiling.md)
  int64_t launches = 0;              // operations enqueued on the device
};

struct TraceSpan {
  std::string name;
  double begin_us = 0.0;  // since the profiler's origin
  double duration_us = 0.0;
  // Profiler::kComputeTrack, kCommTrack, kDeviceTrack, kDeviceCollectiveTrack or
  // kDeviceTransferTrack
  int track = 0;
  int64_t bytes = 0;
  double flops = 0.0;
};

// A span as a device stream ran it, on the host's clock: seconds since the profiler's origin.
struct DeviceSpan {
  const char* name = nullptr;
  // The phase it ran inside, on the same stream; nullptr at the top and on the other streams.
  const char* parent = nullptr;
  int track = 0;  // Profiler::kDeviceTrack for phases; the other device tracks for the rest
  double begin = 0.0, end = 0.0;
  int64_t bytes = 0;
};

// What a device timeline measured since its last take.
struct DeviceRecord {
  std::vector<DeviceSpan> spans;  // closed since the last take
  // Intervals (seconds since the origin; they may overlap) during which some stream of the
  // device had work it had not finished: what the busy time is made of.
  std::vector<std::pair<double, double>> busy;
  int64_t launches = 0;  // operations enqueued on the device since the last take
};

// Times on a device that runs work asynchronously (cuda): the profiler says where each phase
// opens and closes on the host, the timeline marks the same points on the device stream, and
// the take, after the step's synchronisation, returns where the device reached them.
class DeviceTimeline {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~DeviceTimeline() = default;
  // issued: when the host opened or closed the phase.
  virtual void open(const char* phase, Clock::time_point issued) = 0;
  // Called from a phase's destructor: it never throws; a failed record shows up in take.
  virtual void close(Clock::time_point issued) = 0;
  // Waits for the device; what it measured since the last call, relative to origin.
  virtual DeviceRecord take(Clock::time_point origin) = 0;
};

class Profiler {
 public:
  static constexpr int kComputeTrack = 0;
  static constexpr int kCommTrack = 1;
  static constexpr int kDeviceTrack = 2;            // the backend's stream, where it has one
  static constexpr int kDeviceCollectiveTrack = 3;  // a device communicator's stream (NCCL)
  static constexpr int kDeviceTransferTrack = 4;    // the offload copies' stream

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
  // The backend's device timeline, where phases are timed while device timing is on.
  void set_device_timeline(DeviceTimeline* timeline) { device_ = timeline; }
  // Off until the trainer turns it on (log.device_timing): only a caller that takes the totals
  // once per step may, or the timeline's spans would pile up. Off, phases are timed on the host
  // only and the device records nothing. Turning it off drops what the timeline has not handed
  // over yet.
  void set_device_timing(bool on);
  // Whether phases are timed on a device: what the streams beside the backend's ask before
  // handing spans to the timeline.
  bool device_timing() const { return device_ != nullptr && device_timing_; }

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

  // A span that ran by itself from begin to end (seconds since the origin, on the host): it
  // goes on the communication track and into the totals under its name, without touching the
  // nesting.
  void record_in_flight(const std::string& name, double begin, double end, int64_t bytes);

  // Totals since the last call, then cleared. With a device timeline this waits for the device
  // (call it after the step's synchronisation) and the phases' seconds are device time.
  ProfileTotals take_totals();
  // Trace spans since the last call, then cleared; like take_totals, it reads the device.
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
  // Folds what the device timeline measured into the totals (and the trace).
  void collect_device();

  std::chrono::steady_clock::time_point origin_;
  bool trace_ = false;
  std::vector<Open> stack_;
  ProfileTotals totals_;
  std::vector<TraceSpan> trace_spans_;
  void (*open_range_)(const char*) = nullptr;
  void (*close_range_)() = nullptr;
  DeviceTimeline* device_ = nullptr;
  bool device_timing_ = false;
};

}  // namespace ulysses
