// CudaBackend: device selection, memory, data movement, elementwise helpers, bias, AdamW and
// the deterministic column reductions that weight gradients use.
#include <nvtx3/nvToolsExt.h>
#include <omp.h>
#ifdef ULYSSES_WITH_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cuda_column_sums.cuh"
#include "kernels/cuda/cuda_elementwise_kernels.cuh"
#include "kernels/cuda/cuda_timeline.cuh"
#include "kernels/cuda/cuda_transfers.cuh"
#include "kernels/cuda/cudnn_attention.h"

namespace ulysses {

using cuda::bf16;
using cuda::check_cuda;
using cuda::check_launch;
using cuda::dispatch_float;
using cuda::LaunchShape;

namespace {

// The node-local rank that launchers export, so that each rank of a node takes its own GPU.
int node_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// Device memory that cuBLASLt, NCCL and the CUDA context take outside the tracker: an
// automatic limit leaves it free so that a run near the limit fails with our error.
constexpr int64_t kUntrackedReserveBytes = int64_t(512) << 20;

CudaBackend& as_cuda(Backend& backend, const char* what) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda_backend)
    throw std::invalid_argument(std::string(what) + ": backend '" + backend.name() +
                                "' is not the cuda backend");
  return *cuda_backend;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int64_t memory_limit_bytes, AttentionKernel attention) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw DeviceUnavailableError(std::string("no CUDA device: ") + (status != cudaSuccess
                                                                        ? cudaGetErrorString(status)
                                                                        : "no GPU found"));
  }
  return std::make_unique<CudaBackend>(node_local_rank() % count, memory_limit_bytes, attention);
}

void* cuda_backend_stream(Backend& backend) {
  return as_cuda(backend, "cuda_backend_stream").stream();
}

CudaTimeline& cuda_backend_timeline(Backend& backend) {
  return as_cuda(backend, "cuda_backend_timeline").timeline();
}

int cuda_backend_device(Backend& backend) {
  return as_cuda(backend, "cuda_backend_device").device();
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int64_t cuda_cudnn_version() {
#ifdef ULYSSES_WITH_CUDNN
  return int64_t(cudnnGetVersion());
#else
  return 0;
#endif
}

Backend::AvailableMemory CudaBackend::available_memory() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return {};
  return {std::max<int64_t>(int64_t(free_bytes) - kUntrackedReserveBytes, 0), false,
          "the GPU's free memory less " + format_bytes(kUntrackedReserveBytes) +
              " kept for the CUDA libraries"};
}

CudaBackend::CudaBackend(int device, int64_t memory_limit_bytes, AttentionKernel attention)
    : Backend(memory_limit_bytes), device_(device) {
#ifndef ULYSSES_WITH_CUDNN
  if (attention == AttentionKernel::cudnn)
    throw std::runtime_error(
        "kernels.attention: cudnn is not available: cuDNN was not found when this build was "
        "configured; use kernels.attention: native");
#endif
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  profiler().set_range_hooks([](const char* phase) { nvtxRangePushA(phase); },
                             [] { nvtxRangePop(); });
  if (memory_limit_bytes == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    memory().set_limit(std::max<int64_t>(int64_t(free_bytes) - kUntrackedReserveBytes, 1));
  }
  int max_pitch = 0;
  check_cuda(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device), "max pitch");
  max_copy_pitch_ = max_pitch;
  // The stream-ordered pool keeps what it freed instead of handing it back to the driver at
  // every synchronisation (the default threshold of 0 would).
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep_all = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
             "cudaMemPoolSetAttribute");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasStatus_t lt_status = cublasLtCreate(&lt_);
  if (lt_status != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream_);
    throw std::runtime_error(std::string("cuda: cublasLtCreate failed: ") +
                             cublasLtGetStatusString(lt_status));
  }
  gemm_workspace_ = cublaslt_workspace(*this);
  timeline_ = std::make_unique<CudaTimeline>(stream_);
  profiler().set_device_timeline(timeline_.get());
  transfers_ = std::make_unique<CudaTransfers>(stream_, *timeline_, profiler());
#ifdef ULYSSES_WITH_CUDNN
  if (attention == AttentionKernel::cudnn)
    cudnn_attention_ = std::make_unique<CudnnAttention>(*this, stream_);
#endif
}

CudaBackend::~CudaBackend() {
  // Destructors cannot throw: statuses are ignored on the way out.
  cudaStreamSynchronize(stream_);
  for (auto& [ticket, done] : uploads_) cudaEventDestroy(done);
  for (auto& [key, plan] : gemm_plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  profiler().set_device_timeline(nullptr);
  transfers_.reset();
  timeline_.reset();
  gemm_workspace_.reset();
  cudnn_attention_.reset();
  cudaStreamSynchronize(stream_);
  cublasLtDestroy(lt_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::set_num_threads(int threads) {
  if (threads < 1) throw std::invalid_argument("set_num_threads: threads must be >= 1");
  // The host's own work, the initial weights above all, takes the rank's share of the cores.
  omp_set_num_threads(threads);
}

// ---- memory ------------------------------------------------------------------------------

void* CudaBackend::raw_alloc(size_t bytes) {
  // Stream-ordered allocation: the many short-lived workspace buffers of the ops neither
  // synchronise the device (cudaFree would) nor go back to the driver each time. A zero-byte
  // request still gets a distinct pointer so that an empty tensor is not a missing one.
  void* pointer = nullptr;
  cudaError_t status = cudaMallocAsync(&pointer, bytes == 0 ? 256 : bytes, stream_);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError("cuda: device allocation of " + format_bytes(int64_t(bytes)) +
                           " failed (the device is full; tracked: " + memory().describe_current() +
                           ")");
  }
  check_cuda(status, "cudaMallocAsync");
  return pointer;
}

void CudaBackend::raw_free(void* pointer) {
  // Runs in destructors (also while an earlier CUDA error unwinds the stack), so it must not
  // throw; a failure stays sticky for the next checked call.
  (void)cudaFreeAsync(pointer, stream_);
}

void* CudaBackend::host_staging_alloc(size_t bytes) {
  void* pointer = nullptr;
  cudaError_t status = cudaHostAlloc(&pointer, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError("cuda: page-locked host allocation of " + format_bytes(int64_t(bytes)) +
                           " for staging failed");
  }
  check_cuda(status, "cudaHostAlloc");
  return pointer;
}

void CudaBackend::host_staging_free(void* pointer) {
  // Runs in destructors, so it must not throw; a failure stays sticky for the next checked call.
  (void)cudaFreeHost(pointer);
}

int64_t CudaBackend::transfer(const Tensor& dst, const Tensor& src) {
  if (dst.bytes() != src.bytes())
    throw std::invalid_argument("transfer: " + std::to_string(src.bytes()) + " bytes into " +
                                std::to_string(dst.bytes()));
  return transfers_->copy(dst.data, src.data, src.bytes());
}

void CudaBackend::wait_transfer(int64_t ticket) {
  transfers_->wait(ticket);
}

// ---- data movement -----------------------------------------------------------------------

int64_t CudaBackend::upload_async(const Tensor& dst, const void* host_src) {
  if (dst.bytes() > 0)
    check_cuda(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, stream_),
               "upload_async (cudaMemcpyAsync)");
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t status = cudaEventRecord(done, stream_);
  if (status != cudaSuccess) {
    cudaEventDestroy(done);
    check_cuda(status, "cudaEventRecord (upload_async)");
  }
  uploads_.emplace_back(++upload_tickets_, done);
  return upload_tickets_;
}

void CudaBackend::wait_upload(int64_t ticket) {
  // The stream runs the uploads in order: the newest at or before ticket covers the others.
  cudaEvent_t newest = nullptr;
  while (!uploads_.empty() && uploads_.front().first <= ticket) {
    if (newest) cudaEventDestroy(newest);
    newest = uploads_.front().second;
    uploads_.pop_front();
  }
  if (!newest) return;
  const cudaError_t status = cudaEventSynchronize(newest);
  cudaEventDestroy(newest);
  check_cuda(status, "wait_upload (cudaEventSynchronize)");
}

std::string CudaBackend::take_plans_built() {
  std::string built;
  if (gemm_plans_built_ > 0) {
    char text[96];
    std::snprintf(text, sizeof text, "%d cuBLASLt plans in %.2f s", gemm_plans_built_,
                  gemm_plan_seconds_);
    built = text;
  }
#ifdef ULYSSES_WITH_CUDNN
  if (cudnn_attention_) {
    const std::string graphs = cudnn_attention_->take_graphs_built();
    if (!graphs.empty()) built += (built.empty() ? "" : ", ") + graphs;
  }
#endif
  gemm_plans_built_ = 0;
  gemm_plan_seconds_ = 0.0;
  return built;
}

void CudaBackend::upload_impl(const Tensor& dst, const void* host_src) {
  if (dst.bytes() == 0) return;
  cuda::count_enqueued();
  check_cuda(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, stream_),
             "upload (cudaMemcpyAsync)");
  // The caller may reuse its host memory as soon as this returns.
  check_cuda(cudaStreamSynchronize(stream_), "upload (synchronize)");
}

void CudaBackend::download_impl(void* host_dst, const Tensor& src) {
  if (src.bytes() == 0) return;
  cuda::count_enqueued();
  check_cuda(cudaMemcpyAsync(host_dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_),
             "download (cudaMemcpyAsync)");
  check_cuda(cudaStreamSynchronize(stream_), "download (synchronize)");
}

void CudaBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  if (dst.bytes() == 0 || dst.data == src.data) return;
  cuda::count_enqueued();
  check_cuda(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_),
             "copy (cudaMemcpyAsync)");
}

void CudaBackend::fill_zero_impl(const Tensor& dst) {
  if (dst.bytes() == 0) return;
  cuda::count_enqueued();
  check_cuda(cudaMemsetAsync(dst.data, 0, dst.bytes(), stream_), "fill_zero (cudaMemsetAsync)");
}

void CudaBackend::copy_2d_impl(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                               int64_t row_bytes, int64_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  if (rows == 1) {
    cuda::count_enqueued();
    check_cuda(cudaMemcpyAsync(dst, src, size_t(row_bytes), cudaMemcpyDeviceToDevice, stream_),
               "copy_2d (cudaMemcpyAsync)");
    return;
  }
  if (std::max(dst_pitch, src_pitch) > max_copy_pitch_) {
    // Pitches of full-sequence rows (Ulysses at millions of tokens) pass the 2-D copy's limit;
    // rows are few there (the batch), so one copy each.
    cuda::count_enqueued(int(rows));
    for (int64_t row = 0; row < rows; ++row)
      check_cuda(cudaMemcpyAsync(static_cast<char*>(dst) + row * dst_pitch,
                                 static_cast<const char*>(src) + row * src_pitch, size_t(row_bytes),
                                 cudaMemcpyDeviceToDevice, stream_),
                 "copy_2d (cudaMemcpyAsync per row)");
    return;
  }
  cuda::count_enqueued();
  check_cuda(cudaMemcpy2DAsync(dst, size_t(dst_pitch), src, size_t(src_pitch), size_t(row_bytes),
                               size_t(rows), cudaMemcpyDeviceToDevice, stream_),
             "copy_2d (cudaMemcpy2DAsync)");
}

void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "synchronize");
}

// ---- elementwise -------------------------------------------------------------------------

void CudaBackend::cast_impl(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) {
    copy(dst, src);
    return;
  }
  const int64_t n = src.numel();
  if (n == 0) return;
  const LaunchShape shape = cuda::elementwise_launch(n);
  if (src.dtype == DType::f32) {
    cuda::cast_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<bf16*>(dst.data), static_cast<const float*>(src.data), n);
  } else {
    cuda::cast_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<float*>(dst.data), static_cast<const bf16*>(src.data), n);
  }
  check_launch("cast");
}

void CudaBackend::axpy_impl(const Tensor& y, const Tensor& x, float alpha) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y, "axpy", [&](auto y_tag) {
    using TY = decltype(y_tag);
    dispatch_float(x, "axpy", [&](auto x_tag) {
      using TX = decltype(x_tag);
      const LaunchShape shape = cuda::elementwise_launch(n);
      cuda::axpy_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          static_cast<TY*>(y.data), static_cast<const TX*>(x.data), alpha, n);
    });
  });
  check_launch("axpy");
}

void CudaBackend::scale_impl(const Tensor& x, float alpha) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x, "scale", [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n);
    cuda::scale_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(x.data), alpha, n);
  });
  check_launch("scale");
}

double CudaBackend::sum_squares_impl(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int blocks = cuda::sum_squares_blocks(n);
  Buffer partial =
      alloc(MemCategory::workspace, DType::f32, {2 * (blocks + 1)}, "sum_squares partials");
  double* partial_data = static_cast<double*>(partial.tensor().data);
  dispatch_float(x, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    cuda::sum_squares_passes(cuda::StreamLaunch{stream_, "sum_squares"}, partial_data,
                             static_cast<const T*>(x.data), n);
  });
  double total = 0.0;
  cuda::count_enqueued();
  check_cuda(cudaMemcpyAsync(&total, partial_data + blocks, sizeof(double), cudaMemcpyDeviceToHost,
                             stream_),
             "sum_squares (cudaMemcpyAsync)");
  check_cuda(cudaStreamSynchronize(stream_), "sum_squares (synchronize)");
  return total;
}

// ---- bias --------------------------------------------------------------------------------

void CudaBackend::bias_forward_impl(const Tensor& out, const Tensor& bias) {
  const int64_t width = bias.numel();
  const int64_t rows = out.numel() / width;
  if (rows == 0) return;
  dispatch_float(out, "bias_forward", [&](auto out_tag) {
    using T = decltype(out_tag);
    dispatch_float(bias, "bias_forward", [&](auto bias_tag) {
      using TB = decltype(bias_tag);
      const LaunchShape shape = cuda::elementwise_launch(rows * width);
      cuda::bias_forward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          static_cast<T*>(out.data), static_cast<const TB*>(bias.data), rows, width);
    });
  });
  check_launch("bias_forward");
}

void CudaBackend::reduce_columns(float* dst, const float* parts, int64_t rows, int64_t width) {
  const LaunchShape shape = cuda::add_column_partials_launch(width);
  cuda::add_column_partials_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
      dst, parts, rows, width);
  check_launch("column reduction");
}

void CudaBackend::bias_backward_impl(const Tensor& dbias, const Tensor& dout) {
  const int64_t width = dbias.numel();
  const int64_t rows = dout.numel() / width;
  if (rows == 0) return;
  const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
  Buffer parts = alloc(MemCategory::workspace, DType::f32, {chunks.chunks, width},
                       "bias_backward partial sums");
  const LaunchShape columns = cuda::column_partials_launch(width, chunks);
  dispatch_float(dout, "bias_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::column_partials_kernel<cuda::ColumnTerm::value, T>
        <<<columns.grid, columns.threads, columns.shared_bytes, stream_>>>(
            parts.f32(), static_cast<const T*>(dout.data), nullptr, nullptr, nullptr, rows, width,
            chunks.rows_per_chunk);
  });
  check_launch("bias_backward");
  reduce_columns(dbias.f32(), parts.f32(), chunks.chunks, width);
}

// ---- optimizer ---------------------------------------------------------------------------

void CudaBackend::adamw_impl(const Tensor& param, const Tensor& grad, const Tensor& m,
                             const Tensor& v, const AdamWStep& step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  // The scalars and the update are the cpu backend's (kernels/op_formulas.h).
  const formulas::AdamWScalars s = formulas::adamw_scalars(step);
  const LaunchShape shape = cuda::elementwise_launch(n);
  cuda::adamw_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
      param.f32(), grad.f32(), m.f32(), v.f32(), s, n);
  check_launch("adamw");
}

}  // namespace ulysses
