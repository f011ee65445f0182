// RMSNorm and LayerNorm kernels (launched by cuda_norms.cu), apart from their launches so that
// the host emulation can run them too (tests/test_backend_ops.cpp). One block per row
// (block_per_row_launch), fp32 statistics; the weight and bias gradients are the column sums
// of cuda_column_sums.cuh.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"
#ifdef __CUDACC__
#include <cub/block/block_reduce.cuh>
#endif

namespace ulysses::cuda {

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
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

}  // namespace

}  // namespace ulysses::cuda
