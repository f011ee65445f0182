// CudaBackend: RMSNorm and LayerNorm over rows of width C. One block per row with fp32
// statistics; weight and bias gradients go through the deterministic column sums.
#include <cstdio>
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cuda_column_sums.cuh"

namespace ulysses {

using cuda::check_launch;
using cuda::from_float;
using cuda::kThreads;
using cuda::to_float;

namespace {

// The block-wide sum, returned to every thread.
__device__ float block_sum(float value) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ float total;
  const float sum = Reduce(storage).Sum(value);
  if (threadIdx.x == 0) total = sum;
  __syncthreads();
  const float result = total;
  __syncthreads();  // total and storage may be reused by the next call
  return result;
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* weight,
                                       int64_t width, float eps) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * width;
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float value = to_float(in[j]);
    sum_sq += value * value;
  }
  const float row_rstd = rsqrtf(block_sum(sum_sq) / float(width) + eps);
  if (threadIdx.x == 0) rstd[row] = row_rstd;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    out[row * width + j] = from_float<T>(to_float(in[j]) * row_rstd * to_float(weight[j]));
}

// dx_j += r w_j g_j − (r³ / C) x_j Σ_i g_i w_i x_i
template <typename T>
__global__ void rmsnorm_backward_kernel(T* dx, const T* dout, const T* x, const T* weight,
                                        const float* rstd, int64_t width) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * width;
  const T* grad = dout + row * width;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    dot += to_float(grad[j]) * to_float(weight[j]) * to_float(in[j]);
  dot = block_sum(dot);
  const float row_rstd = rstd[row];
  const float coefficient = row_rstd * row_rstd * row_rstd * dot / float(width);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const int64_t i = row * width + j;
    dx[i] = from_float<T>(to_float(dx[i]) + row_rstd * to_float(weight[j]) * to_float(grad[j]) -
                          coefficient * to_float(in[j]));
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* x,
                                         const T* weight, const T* bias, int64_t width, float eps) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * width;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) sum += to_float(in[j]);
  const float row_mean = block_sum(sum) / float(width);
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float centered = to_float(in[j]) - row_mean;
    sum_sq += centered * centered;
  }
  const float row_rstd = rsqrtf(block_sum(sum_sq) / float(width) + eps);
  if (threadIdx.x == 0) {
    mean[row] = row_mean;
    rstd[row] = row_rstd;
  }
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    out[row * width + j] = from_float<T>(
        (to_float(in[j]) - row_mean) * row_rstd * to_float(weight[j]) + to_float(bias[j]));
}

// With x̂ = (x − mean) r and ĝ = g w: dx += r (ĝ − mean(ĝ) − x̂ mean(ĝ x̂)).
template <typename T>
__global__ void layernorm_backward_kernel(T* dx, const T* dout, const T* x, const T* weight,
                                          const float* mean, const float* rstd, int64_t width) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * width;
  const T* grad = dout + row * width;
  const float row_mean = mean[row], row_rstd = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float g_hat = to_float(grad[j]) * to_float(weight[j]);
    sum_g += g_hat;
    sum_g_xhat += g_hat * (to_float(in[j]) - row_mean) * row_rstd;
  }
  const float mean_g = block_sum(sum_g) / float(width);
  const float mean_g_xhat = block_sum(sum_g_xhat) / float(width);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const int64_t i = row * width + j;
    const float xhat = (to_float(in[j]) - row_mean) * row_rstd;
    const float g_hat = to_float(grad[j]) * to_float(weight[j]);
    dx[i] = from_float<T>(to_float(dx[i]) + row_rstd * (g_hat - mean_g - xhat * mean_g_xhat));
  }
}

// Rows go to blockIdx.x, which allows 2^31 − 1 of them.
void check_rows(int64_t rows, const char* op) {
  if (rows > int64_t(0x7fffffff))
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) +
                                " rows exceed one launch");
}

}  // namespace

void CudaBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                  const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(out, x, op, "out", "x");
  cuda::require_same_dtype(weight, x, op, "weight", "x");
  cuda::require_dtype(rstd, DType::f32, op, "rstd");
  const int64_t width = weight.numel();
  const int64_t rows = cuda::rows_of(x, width, op, "x");
  cuda::require_numel(out, x.numel(), op, "out");
  cuda::require_numel(rstd, rows, op, "rstd");
  check_rows(rows, op);
  if (rows == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(
        static_cast<T*>(out.data), rstd.f32(), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), width, eps);
  });
  check_launch(op);
}

void CudaBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                   const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(dx, x, op, "dx", "x");
  cuda::require_same_dtype(dout, x, op, "dout", "x");
  cuda::require_same_dtype(weight, x, op, "weight", "x");
  cuda::require_dtype(dweight, DType::f32, op, "dweight");
  cuda::require_dtype(rstd, DType::f32, op, "rstd");
  const int64_t width = weight.numel();
  const int64_t rows = cuda::rows_of(x, width, op, "x");
  cuda::require_numel(dx, x.numel(), op, "dx");
  cuda::require_numel(dout, x.numel(), op, "dout");
  cuda::require_numel(dweight, width, op, "dweight");
  cuda::require_numel(rstd, rows, op, "rstd");
  check_rows(rows, op);
  if (rows == 0) return;
  const ColumnChunks chunks = column_chunks(rows);
  Buffer parts = alloc(MemCategory::workspace, DType::f32, {chunks.chunks, width},
                       "rmsnorm_backward partial sums");
  const dim3 grid(cuda::blocks_for(width), unsigned(chunks.chunks));
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    // Column sums first, so that dx may be the same buffer as dout (as on the cpu).
    cuda::column_partials_kernel<cuda::ColumnTerm::times_rms_input, T>
        <<<grid, kThreads, 0, stream_>>>(parts.f32(), static_cast<const T*>(dout.data),
                                         static_cast<const T*>(x.data), nullptr, rstd.f32(), rows,
                                         width, chunks.rows_per_chunk);
    rmsnorm_backward_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(
        static_cast<T*>(dx.data), static_cast<const T*>(dout.data), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), rstd.f32(), width);
  });
  check_launch(op);
  reduce_columns(dweight.f32(), parts.f32(), chunks.chunks, width);
}

void CudaBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    float eps) {
  const char* op = "layernorm_forward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(out, x, op, "out", "x");
  cuda::require_same_dtype(weight, x, op, "weight", "x");
  cuda::require_same_dtype(bias, x, op, "bias", "x");
  cuda::require_dtype(mean, DType::f32, op, "mean");
  cuda::require_dtype(rstd, DType::f32, op, "rstd");
  const int64_t width = weight.numel();
  const int64_t rows = cuda::rows_of(x, width, op, "x");
  cuda::require_numel(out, x.numel(), op, "out");
  cuda::require_numel(mean, rows, op, "mean");
  cuda::require_numel(rstd, rows, op, "rstd");
  cuda::require_numel(bias, width, op, "bias");
  check_rows(rows, op);
  if (rows == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(
        static_cast<T*>(out.data), mean.f32(), rstd.f32(), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), static_cast<const T*>(bias.data), width, eps);
  });
  check_launch(op);
}

void CudaBackend::layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                     const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(dx, x, op, "dx", "x");
  cuda::require_same_dtype(dout, x, op, "dout", "x");
  cuda::require_same_dtype(weight, x, op, "weight", "x");
  cuda::require_dtype(dweight, DType::f32, op, "dweight");
  cuda::require_dtype(dbias, DType::f32, op, "dbias");
  cuda::require_dtype(mean, DType::f32, op, "mean");
  cuda::require_dtype(rstd, DType::f32, op, "rstd");
  const int64_t width = weight.numel();
  const int64_t rows = cuda::rows_of(x, width, op, "x");
  cuda::require_numel(dx, x.numel(), op, "dx");
  cuda::require_numel(dout, x.numel(), op, "dout");
  cuda::require_numel(dweight, width, op, "dweight");
  cuda::require_numel(dbias, width, op, "dbias");
  cuda::require_numel(mean, rows, op, "mean");
  cuda::require_numel(rstd, rows, op, "rstd");
  check_rows(rows, op);
  if (rows == 0) return;
  const ColumnChunks chunks = column_chunks(rows);
  Buffer parts = alloc(MemCategory::workspace, DType::f32, {2, chunks.chunks, width},
                       "layernorm_backward partial sums");
  float* weight_parts = parts.f32();
  float* bias_parts = weight_parts + chunks.chunks * width;
  const dim3 grid(cuda::blocks_for(width), unsigned(chunks.chunks));
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dout.data);
    const T* in = static_cast<const T*>(x.data);
    // Column sums first, so that dx may be the same buffer as dout (as on the cpu).
    cuda::column_partials_kernel<cuda::ColumnTerm::times_normed_input, T>
        <<<grid, kThreads, 0, stream_>>>(weight_parts, g, in, mean.f32(), rstd.f32(), rows, width,
                                         chunks.rows_per_chunk);
    cuda::column_partials_kernel<cuda::ColumnTerm::value, T><<<grid, kThreads, 0, stream_>>>(
        bias_parts, g, nullptr, nullptr, nullptr, rows, width, chunks.rows_per_chunk);
    layernorm_backward_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(
        static_cast<T*>(dx.data), g, in, static_cast<const T*>(weight.data), mean.f32(), rstd.f32(),
        width);
  });
  check_launch(op);
  reduce_columns(dweight.f32(), weight_parts, chunks.chunks, width);
  reduce_columns(dbias.f32(), bias_parts, chunks.chunks, width);
}

}  // namespace ulysses
