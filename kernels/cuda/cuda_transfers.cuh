// Copies of offloaded layer inputs between device and pinned host memory on a side stream,
// beside the compute (memory.offload_checkpoints, docs/memory.md). Each copy starts once the
// compute stream has reached the point where it was issued, and the compute stream waits for
// it only where wait() is called: the copies of one layer overlap the compute of the next.
// While the profiler times the device, each copy is a span of the transfer stream's row
// (docs/profiling.md, "Device time").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>

namespace ulysses {

class CudaTimeline;
class Profiler;

class CudaTransfers {
 public:
  // The timeline and the profiler are the backend's; they outlive this.
  CudaTransfers(cudaStream_t compute, CudaTimeline& timeline, const Profiler& profiler);
  ~CudaTransfers();
  CudaTransfers(const CudaTransfers&) = delete;
  CudaTransfers& operator=(const CudaTransfers&) = delete;

  // bytes from src to dst (either may be device or pinned host memory); returns its ticket.
  int64_t copy(void* dst, const void* src, size_t bytes);
  // The compute stream's later work waits for copy `ticket` and every earlier one (the side
  // stream runs them in order); tickets already waited for, and 0, cost nothing.
  void wait(int64_t ticket);

 private:
  struct Pending {
    int64_t ticket;
    cudaEvent_t done;
  };
  cudaStream_t compute_;
  CudaTimeline& timeline_;
  const Profiler& profiler_;
  cudaStream_t side_ = nullptr;
  std::deque<Pending> pending_;  // oldest first
  int64_t issued_ = 0;
};

}  // namespace ulysses
