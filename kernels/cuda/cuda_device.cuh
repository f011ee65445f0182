// The device environment that every kernel header (kernels/cuda/*_kernels.cuh) is written
// against, and the launch shapes that the real launches and the host emulation share. Under
// nvcc bf16, dim3 and the intrinsics come from CUDA; on the host tests/cuda_emulation.h
// provides them and must be included first (docs/cuda.md, "Checked on the host").
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

namespace ulysses::cuda {

#ifdef __CUDACC__
using bf16 = __nv_bfloat16;

// The block's dynamic shared memory (its size is the launch's third parameter).
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
  extern __shared__ __align__(16) unsigned char shared[];
  return shared;
}
#endif

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(bf16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements; capped, since the loop covers the rest.
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 16 ? 65535 * 16 : blocks));
}

// A kernel's <<<grid, threads, shared_bytes>>>: computed once per kernel by a function next
// to it, used by the launch in the .cu and by the host emulation alike.
struct LaunchShape {
  dim3 grid;
  unsigned threads;
  size_t shared_bytes;
};

// A grid-stride loop over n elements.
inline LaunchShape elementwise_launch(int64_t n) {
  return {dim3(blocks_for(n)), unsigned(kThreads), 0};
}

// One block per row (rows < 2^31: blockIdx.x).
inline LaunchShape block_per_row_launch(int64_t rows) {
  return {dim3(unsigned(rows)), unsigned(kThreads), 0};
}

}  // namespace ulysses::cuda
