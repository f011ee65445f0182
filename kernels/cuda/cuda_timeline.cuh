// The device tracks of a trace (docs/profiling.md): the phases as the backend's stream ran
// them, timed by CUDA events recorded on the stream where the host opens and closes each
// phase, and the collectives as a device communicator's stream ran them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/profiler.h"

namespace ulysses {

class CudaTimeline final : public DeviceTimeline {
 public:
  explicit CudaTimeline(cudaStream_t stream) : stream_(stream) {}
  ~CudaTimeline() override;
  CudaTimeline(const CudaTimeline&) = delete;
  CudaTimeline& operator=(const CudaTimeline&) = delete;

  void reset_origin() override;
  void open(const char* phase) override;
  // Called from a phase's destructor: it never throws; a failed record shows up in take.
  void close() override;
  std::vector<TraceSpan> take() override;

  // A collective as another stream ran it, between two events (created with timing) that
  // were recorded there; the timeline owns them from here on.
  void add_collective(const char* name, cudaEvent_t begin, cudaEvent_t end, int64_t bytes);

 private:
  struct Span {
    const char* name;
    cudaEvent_t begin, end;
    int track;
    int64_t bytes;
  };
  cudaEvent_t reuse_or_create_event();

  cudaStream_t stream_;
  cudaEvent_t origin_ = nullptr;  // recorded where the profiler's origin is
  std::vector<Span> open_;        // innermost last; their end is not recorded yet
  std::vector<Span> closed_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace ulysses
