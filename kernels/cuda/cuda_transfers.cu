#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_timeline.cuh"
#include "kernels/cuda/cuda_transfers.cuh"

namespace ulysses {

using cuda::check_cuda;

CudaTransfers::CudaTransfers(cudaStream_t compute, CudaTimeline& timeline, const Profiler& profiler)
    : compute_(compute), timeline_(timeline), profiler_(profiler) {
  check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
             "cudaStreamCreate (offload transfers)");
}

CudaTransfers::~CudaTransfers() {
  // Destructors cannot throw: statuses are ignored on the way out.
  cudaStreamSynchronize(side_);
  for (const Pending& pending : pending_) cudaEventDestroy(pending.done);
  cudaStreamDestroy(side_);
}

int64_t CudaTransfers::copy(void* dst, const void* src, size_t bytes) {
  // Ordered after what the compute stream has been given so far: the source is written, and a
  // device destination is no longer read.
  cudaEvent_t reached = nullptr;
  check_cuda(cudaEventCreateWithFlags(&reached, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t status = cudaEventRecord(reached, compute_);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(side_, reached, 0);
  cudaEventDestroy(reached);  // released once the wait is satisfied
  check_cuda(status, "ordering an offload copy after the compute stream");
  const bool timed = profiler_.device_timing();
  cudaEvent_t begin = nullptr, end = nullptr;
  if (timed) {
    begin = timeline_.acquire_event();
    end = timeline_.acquire_event();
    // Handed over at once, so that the timeline owns them whatever fails below.
    timeline_.add_span(Profiler::kDeviceTransferTrack, "offload copy", begin, end, int64_t(bytes));
    check_cuda(cudaEventRecord(begin, side_), "cudaEventRecord (offload transfer)");
  }
  cuda::count_enqueued();
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side_),
             "cudaMemcpyAsync (offload transfer)");
  if (timed) check_cuda(cudaEventRecord(end, side_), "cudaEventRecord (offload transfer)");
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  status = cudaEventRecord(done, side_);
  if (status != cudaSuccess) {
    cudaEventDestroy(done);
    check_cuda(status, "cudaEventRecord (offload transfer)");
  }
  pending_.push_back({++issued_, done});
  return issued_;
}

void CudaTransfers::wait(int64_t ticket) {
  // The newest pending copy at or before ticket covers the older ones: the side stream runs
  // them in order.
  cudaEvent_t newest = nullptr;
  while (!pending_.empty() && pending_.front().ticket <= ticket) {
    if (newest) cudaEventDestroy(newest);
    newest = pending_.front().done;
    pending_.pop_front();
  }
  if (!newest) return;
  const cudaError_t status = cudaStreamWaitEvent(compute_, newest, 0);
  cudaEventDestroy(newest);  // released once the wait is satisfied
  check_cuda(status, "cudaStreamWaitEvent (offload transfer)");
}

}  // namespace ulysses
