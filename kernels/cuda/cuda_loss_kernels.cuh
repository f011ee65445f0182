// The LM head + loss kernels (launched by cuda_loss.cu around its cuBLASLt GEMMs), apart from
// their launches so that the host emulation can run them too (tests/test_backend_ops.cpp):
// gathering counted rows into a tile and scattering their gradients back (grid-stride,
// elementwise_launch), and per row of the tile the max, argmax, log-sum-exp and dlogits (one
// block per row, block_per_row_launch).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"
#ifdef __CUDACC__
#include <cub/block/block_reduce.cuh>
#endif

namespace ulysses::cuda {

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
namespace {

struct ArgMax {
  float value;
  int64_t index;
};

// The larger value; on ties the smaller index (the first maximum, as the cpu backend).
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index < b.index ? a : b;
  }
};

template <typename T>
__global__ void gather_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t count,
                                   int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count * width;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[int64_t(rows[i / width]) * width + i % width];
}

template <typename T>
__global__ void scatter_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t count,
                                    int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count * width;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[int64_t(rows[i / width]) * width + i % width] = src[i];
}

// One block per row of the tile.
template <typename T>
__global__ void loss_rows_kernel(const float* logits, int64_t vocab, const int32_t* targets,
                                 float* row_loss, int32_t* row_correct, T* dlogits,
                                 float grad_scale) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  ArgMax best{-INFINITY, vocab};
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (x[j] > best.value) best = {x[j], j};
  }
  using MaxReduce = cub::BlockReduce<ArgMax, kThreads>;
  using SumReduce = cub::BlockReduce<float, kThreads>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename SumReduce::TempStorage sum;
  } storage;
  __shared__ ArgMax row_best;
  __shared__ float row_sum;
  const ArgMax reduced = MaxReduce(storage.max).Reduce(best, ArgMaxOp());
  if (threadIdx.x == 0) row_best = reduced;
  __syncthreads();
  const float max_logit = row_best.value;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += __expf(x[j] - max_logit);
  const float reduced_sum = SumReduce(storage.sum).Sum(sum);
  if (threadIdx.x == 0) row_sum = reduced_sum;
  __syncthreads();
  const int32_t target = targets[row];
  if (threadIdx.x == 0) {
    row_loss[row] = max_logit + logf(row_sum) - x[target];
    row_correct[row] = row_best.index == target;
  }
  if (!dlogits) return;
  const float factor = grad_scale / row_sum;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float grad = __expf(x[j] - max_logit) * factor - (j == target ? grad_scale : 0.0f);
    dlogits[row * vocab + j] = from_float<T>(grad);
  }
}

}  // namespace

}  // namespace ulysses::cuda
