#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_timeline.cuh"
#include "kernels/stopwatch.h"
#include "parallel/comm_checks.h"
#include "parallel/watchdog.h"

namespace ulysses {

struct NcclComm::Native {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;   // the communicator's own
  cudaStream_t compute = nullptr;  // the backend's, not owned
  int device = 0;
  // While the backend's profiler times the device, each collective is timed on the stream and
  // handed to the backend's timeline (docs/profiling.md, "Device time"); both are the
  // backend's.
  Profiler* profiler = nullptr;
  CudaTimeline* timeline = nullptr;
};

namespace {

void check_cuda(cudaError_t status, const char* call, const std::string& comm_name) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " on communicator '" + comm_name +
                             "' failed: " + cudaGetErrorString(status));
}

void check_nccl(ncclResult_t result, const char* call, const std::string& comm_name,
                ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::string detail = ncclGetErrorString(result);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string(": ") + last;
  }
  throw std::runtime_error(std::string(call) + " on communicator '" + comm_name +
                           "' failed: " + detail);
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
  }
  throw std::invalid_argument("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

char* element_at(const Tensor& tensor, int64_t index) {
  return static_cast<char*>(tensor.data) + index * int64_t(dtype_size(tensor.dtype));
}

}  // namespace

// Completion of the NCCL calls of one operation: an event on the communicator's stream.
class NcclComm::Request final : public CommRequest {
 public:
  // Called after the stream was ordered behind the compute stream and before the NCCL calls.
  Request(NcclComm& comm, const std::string& comm_name, const char* operation, int64_t bytes,
          double* seconds)
      : comm_(comm),
        native_(*comm.native_),
        comm_name_(comm_name),
        operation_(operation),
        bytes_(bytes),
        seconds_(seconds) {
    if (native_.timeline && native_.profiler->device_timing()) {
      begin_event_ = native_.timeline->acquire_event();
      done_event_ = native_.timeline->acquire_event();
      check_cuda(cudaEventRecord(begin_event_, native_.stream), "cudaEventRecord", comm_name_);
    } else {
      check_cuda(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming), "cudaEventCreate",
                 comm_name_);
    }
  }

  ~Request() override {
    wait_unless_done();
    if (begin_event_) cudaEventDestroy(begin_event_);
    if (done_event_) cudaEventDestroy(done_event_);
  }

  void record() {
    check_cuda(cudaEventRecord(done_event_, native_.stream), "cudaEventRecord", comm_name_);
  }

 private:
  // The backend's later ops wait for the result on the device; the host waits too, so that
  // the seconds counted are issue to completion and errors surface here.
  void complete() override {
    check_cuda(cudaStreamWaitEvent(native_.compute, done_event_, 0), "cudaStreamWaitEvent",
               comm_name_);
    // Polled rather than synchronized, so that the watchdog can end a job whose peer is gone
    // (NCCL itself would wait forever).
    cudaError_t status = cudaSuccess;
    wait_with_watchdog(
        comm_.watchdog().get(),
        [&] {
          status = cudaEventQuery(done_event_);
          return status != cudaErrorNotReady;
        },
        "NCCL operation", comm_name_,
        [&] {
          ncclCommAbort(native_.comm);
          comm_.host_->abort(kWatchdogExitCode);
        });
    check_cuda(status, "cudaEventQuery", comm_name_);
    *seconds_ += clock_.seconds();
    ncclResult_t async_error = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(native_.comm, &async_error), "ncclCommGetAsyncError",
               comm_name_);
    check_nccl(async_error, "NCCL operation", comm_name_, native_.comm);
    if (begin_event_) {
      native_.timeline->add_span(Profiler::kDeviceCollectiveTrack, operation_, begin_event_,
                                 done_event_, bytes_);
      begin_event_ = done_event_ = nullptr;
    }
  }

  NcclComm& comm_;
  const Native& native_;
  std::string comm_name_;
  const char* operation_;
  int64_t bytes_;
  double* seconds_;
  Stopwatch clock_;                    // issue to completion
  cudaEvent_t begin_event_ = nullptr;  // only while the device is timed
  cudaEvent_t done_event_ = nullptr;
};

NcclComm::NcclComm(std::unique_ptr<Comm> host_comm, Backend& backend)
    : host_(std::move(host_comm)), native_(std::make_unique<Native>()) {
  set_watchdog(host_->watchdog());
  native_->compute = static_cast<cudaStream_t>(cuda_backend_stream(backend));
  native_->device = cuda_backend_device(backend);
  native_->profiler = &backend.profiler();
  native_->timeline = &cuda_backend_timeline(backend);
  check_cuda(cudaSetDevice(native_->device), "cudaSetDevice", name());
  ncclUniqueId id{};
  if (host_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", name());
  host_->broadcast_host(&id, int64_t(sizeof(id)), 0);
  check_nccl(ncclCommInitRank(&native_->comm, host_->size(), id, host_->rank()), "ncclCommInitRank",
             name());
  check_cuda(cudaStreamCreateWithFlags(&native_->stream, cudaStreamNonBlocking), "cudaStreamCreate",
             name());
}

NcclComm::NcclComm(std::unique_ptr<Comm> host_comm, std::unique_ptr<Native> native)
    : host_(std::move(host_comm)), native_(std::move(native)) {
  set_watchdog(host_->watchdog());
}

NcclComm::~NcclComm() {
  // Destructors cannot throw: statuses are ignored on the way out.
  if (native_->stream) {
    cudaStreamSynchronize(native_->stream);
    cudaStreamDestroy(native_->stream);
  }
  if (native_->comm) ncclCommDestroy(native_->comm);
}

template <typename Enqueue>
std::unique_ptr<NcclComm::Request> NcclComm::issue(const char* operation, int64_t bytes,
                                                   double* seconds, Enqueue enqueue) {
  cudaEvent_t ready = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", name());
  cudaError_t status = cudaEventRecord(ready, native_->compute);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(native_->stream, ready, 0);
  cudaEventDestroy(ready);  // released once the wait is satisfied
  check_cuda(status, "ordering after the compute stream", name());
  auto request = std::make_unique<Request>(*this, name(), operation, bytes, seconds);
  check_nccl(ncclGroupStart(), "ncclGroupStart", name());
  try {
    enqueue();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  check_nccl(ncclGroupEnd(), operation, name(), native_->comm);
  request->record();
  stats_.calls += 1;
  return request;
}

// ---- all-to-all ----------------------------------------------------------------------------

CommHandle NcclComm::all_to_all_async(const Tensor& send, const Tensor& recv) {
  check_all_to_all_args(*this, send, recv);
  const int64_t block = send.numel() / size();
  const ncclDataType_t type = nccl_type(send.dtype);
  const int64_t bytes = int64_t(send.bytes()) / size() * (size() - 1);
  auto request = issue("all_to_all", bytes, &stats_.all_to_all_seconds, [&] {
    for (int peer = 0; peer < size(); ++peer) {
      check_nccl(ncclSend(element_at(send, peer * block), size_t(block), type, peer, native_->comm,
                          native_->stream),
                 "ncclSend", name());
      check_nccl(ncclRecv(element_at(recv, peer * block), size_t(block), type, peer, native_->comm,
                          native_->stream),
                 "ncclRecv", name());
    }
  });
  stats_.all_to_all_bytes += bytes;
  return request;
}

// ---- reductions ----------------------------------------------------------------------------

CommHandle NcclComm::all_reduce_async(const Tensor& data, ReduceOp op) {
  auto request = issue("all_reduce", int64_t(data.bytes()), &stats_.reduce_seconds, [&] {
    check_nccl(ncclAllReduce(data.data, data.data, size_t(data.numel()), nccl_type(data.dtype),
                             nccl_op(op), native_->comm, native_->stream),
               "ncclAllReduce", name());
  });
  stats_.reduce_bytes += int64_t(data.bytes());
  return request;
}

void NcclComm::all_reduce_host(double* values, int count, ReduceOp op) {
  const CommStats before = host_->stats();
  host_->all_reduce_host(values, count, op);
  stats_ += host_->stats() - before;
}

CommHandle NcclComm::reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_reduce_scatter_args(*this, send, recv);
  auto request = issue("reduce_scatter", int64_t(send.bytes()), &stats_.reduce_seconds, [&] {
    check_nccl(ncclReduceScatter(send.data, recv.data, size_t(recv.numel()), nccl_type(send.dtype),
                                 nccl_op(op), native_->comm, native_->stream),
               "ncclReduceScatter", name());
  });
  stats_.reduce_bytes += int64_t(send.bytes());
  return request;
}

// ---- gathers -------------------------------------------------------------------------------

CommHandle NcclComm::all_gather_async(const Tensor& send, const Tensor& recv) {
  check_all_gather_args(*this, send, recv);
  auto request = issue("all_gather", int64_t(send.bytes()), &stats_.gather_seconds, [&] {
    check_nccl(ncclAllGather(send.data, recv.data, size_t(send.numel()), nccl_type(send.dtype),
                             native_->comm, native_->stream),
               "ncclAllGather", name());
  });
  stats_.gather_bytes += int64_t(send.bytes());
  return request;
}

void NcclComm::broadcast_host(void* data, int64_t bytes, int root) {
  const CommStats before = host_->stats();
  host_->broadcast_host(data, bytes, root);
  stats_ += host_->stats() - before;
}

void NcclComm::barrier() {
  // Device work queued before the barrier is part of what the barrier waits for.
  check_cuda(cudaStreamSynchronize(native_->compute), "cudaStreamSynchronize", name());
  host_->barrier();
  stats_.calls += 1;
}

// ---- groups and failure --------------------------------------------------------------------

std::unique_ptr<Comm> NcclComm::split(int color, int key, const std::string& name) {
  std::unique_ptr<Comm> host = host_->split(color, key, name);
  auto native = std::make_unique<Native>();
  native->compute = native_->compute;
  native->device = native_->device;
  native->profiler = native_->profiler;
  native->timeline = native_->timeline;
  check_nccl(ncclCommSplit(native_->comm, color, key, &native->comm, nullptr), "ncclCommSplit",
             this->name(), native_->comm);
  check_cuda(cudaStreamCreateWithFlags(&native->stream, cudaStreamNonBlocking), "cudaStreamCreate",
             name);
  return std::unique_ptr<Comm>(new NcclComm(std::move(host), std::move(native)));
}

void NcclComm::abort(int exit_code) {
  host_->abort(exit_code);
  std::abort();  // not reached: the host communicator's abort ends the process
}

}  // namespace ulysses
