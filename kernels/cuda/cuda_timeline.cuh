// The device timeline of the CUDA backend (docs/profiling.md, "Device time"): a CUDA event is
// recorded on the backend's stream where the host opens and closes each phase, and the spans
// that other streams ran (NCCL's, the offload copies') are handed over as pairs of events
// recorded there. Once per step, after the step's synchronisation, take reads them back and
// places them on the host's clock. Events come from a pool, so a step creates none once the
// pool has grown to a step's worth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/profiler.h"

namespace ulysses {

class CudaTimeline final : public DeviceTimeline {
 public:
  explicit CudaTimeline(cudaStream_t stream) : stream_(stream) {}
  ~CudaTimeline() override;
  CudaTimeline(const CudaTimeline&) = delete;
  CudaTimeline& operator=(const CudaTimeline&) = delete;

  void open(const char* phase, Clock::time_point issued) override;
  void close(Clock::time_point issued) override;
  DeviceRecord take(Clock::time_point origin) override;

  // An event created with timing, for another stream's span; it comes back through add_span.
  cudaEvent_t acquire_event();
  // A span that another stream ran between two events from acquire_event recorded there
  // (track: Profiler::kDeviceCollectiveTrack or kDeviceTransferTrack); take waits for its
  // end. The timeline owns both events from here on.
  void add_span(int track, const char* name, cudaEvent_t begin, cudaEvent_t end, int64_t bytes);

 private:
  struct Mark {
    cudaEvent_t event = nullptr;
    Clock::time_point issued;  // when the host recorded it; unused on the other streams
  };
  struct Span {
    const char* name;
    const char* parent;
    int track;
    Mark begin, end;
    int64_t bytes;
  };
  // Seconds since origin at which the device reached the event, as if the anchor (recorded
  // at anchor_issued and waited for) had been reached when it was issued.
  double reached(cudaEvent_t event, cudaEvent_t anchor, double anchor_issued) const;

  cudaStream_t stream_;
  std::vector<Span> open_;  // innermost last; their end is not recorded yet
  std::vector<Span> closed_;
  std::vector<cudaEvent_t> free_events_;
  int64_t enqueued_at_take_ = 0;  // the process's enqueued operations at the last take
};

}  // namespace ulysses
