// The CUDA backend's elementwise kernels (launched by cuda_backend.cu): cast, axpy, scale,
// sum of squares, bias and AdamW, apart from their launches so that the host emulation can
// run them too (tests/test_backend_ops.cpp). All are grid-stride loops (elementwise_launch)
// except the sum of squares (sum_squares_partial_launch, sum_partials_launch).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/op_formulas.h"
#ifdef __CUDACC__
#include <cub/block/block_reduce.cuh>
#endif

namespace ulysses::cuda {

// Partial sums of the sum of squares: one per block, at most 1024, a number that depends
// only on n (so every run adds in the same order).
inline LaunchShape sum_squares_partial_launch(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return {dim3(unsigned(blocks < 1024 ? blocks : 1024)), unsigned(kThreads), 0};
}
// Adds the partials of sum_squares_partial_launch: one block.
inline LaunchShape sum_partials_launch() {
  return {dim3(1), unsigned(kThreads), 0};
}
// The partials of the sum of squares of n elements.
inline int sum_squares_blocks(int64_t n) {
  return int(sum_squares_partial_launch(n).grid.x);
}

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
namespace {

template <typename In, typename Out>
__global__ void cast_kernel(Out* out, const In* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<Out>(to_float(in[i]));
}

template <typename TY, typename TX>
__global__ void axpy_kernel(TY* y, const TX* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<TY>(to_float(y[i]) + alpha * to_float(x[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(alpha * to_float(x[i]));
}

// Partial sums of squares, one per block, over a grid-stride loop: the grid size depends
// only on n, so every run adds in the same order.
template <typename T>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double value = to_float(x[i]);
    sum += value * value;
  }
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const double block_sum = Reduce(storage).Sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
}

__global__ void sum_partials_kernel(double* total, const double* partial, int count) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const double block_sum = Reduce(storage).Sum(sum);
  if (threadIdx.x == 0) *total = block_sum;
}

// The sum of squares' two passes, shared by the backend and the host emulation: the partials
// into partial[0, blocks), then their sum into partial[blocks], where blocks is
// sum_squares_blocks(n). launch(shape, kernel, args...) runs one kernel, on the stream
// (StreamLaunch, kernels/cuda/cuda_common.cuh) or on the host (tests/cuda_emulation.h).
template <typename T, typename Launch>
void sum_squares_passes(const Launch& launch, double* partial, const T* x, int64_t n) {
  const int blocks = sum_squares_blocks(n);
  launch(sum_squares_partial_launch(n), sum_squares_partial_kernel<T>, partial, x, n);
  launch(sum_partials_launch(), sum_partials_kernel, partial + blocks, partial, blocks);
}

template <typename T, typename TB>
__global__ void bias_forward_kernel(T* out, const TB* bias, int64_t rows, int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % width]));
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v,
                             formulas::AdamWScalars s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    formulas::adamw_update(param[i], grad[i], m[i], v[i], s);
}

}  // namespace

}  // namespace ulysses::cuda
