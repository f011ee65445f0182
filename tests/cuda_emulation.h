// Just enough of CUDA's device environment to run simple kernels on the host, one std::thread
// per GPU thread: thread and block indices, __syncthreads as a block-wide barrier, warp
// shuffles as an exchange between the 32 threads of a warp, dynamic shared memory, bf16.
// Blocks run one after another. What it checks is a kernel's logic (indexing, tile edges,
// barriers, shuffles, shared-memory sizes), not its speed or GPU-specific numerics.
// Include it before a kernel header written for cuda_common.cuh's environment.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/tensor.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __align__(bytes) alignas(bytes)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_in = 1, unsigned y_in = 1, unsigned z_in = 1) : x(x_in), y(y_in), z(z_in) {}
};
struct float2 {
  float x, y;
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace ulysses::cuda {

struct bf16 {
  uint16_t bits;
};

namespace emulation {

// The block being run: its shared memory, its barrier and one barrier per warp.
struct Block {
  std::vector<unsigned char> shared;
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> lanes;  // one shuffle slot per thread
};
inline Block* block = nullptr;

}  // namespace emulation

inline unsigned char* dynamic_shared_memory() {
  return emulation::block->shared.data();
}

}  // namespace ulysses::cuda

struct __nv_bfloat162 {
  ulysses::cuda::bf16 x, y;
};

inline float __bfloat162float(ulysses::cuda::bf16 value) {
  return ulysses::bf16_to_float(value.bits);
}
inline ulysses::cuda::bf16 __float2bfloat16_rn(float value) {
  return {ulysses::float_to_bf16(value)};
}
inline ulysses::cuda::bf16 __float2bfloat16(float value) {
  return __float2bfloat16_rn(value);
}
inline float2 __bfloat1622float2(__nv_bfloat162 pair) {
  return {__bfloat162float(pair.x), __bfloat162float(pair.y)};
}
inline float __expf(float value) {
  return std::exp(value);
}

inline void __syncthreads() {
  ulysses::cuda::emulation::block->all->arrive_and_wait();
}

// Every lane of the warp must take part, as with a full mask on the GPU.
inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  ulysses::cuda::emulation::Block& block = *ulysses::cuda::emulation::block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  block.lanes[threadIdx.x] = value;
  block.warps[warp]->arrive_and_wait();
  const float partner = block.lanes[warp * 32 + (lane ^ unsigned(lane_mask))];
  block.warps[warp]->arrive_and_wait();
  return partner;
}

namespace ulysses::cuda::emulation {

// Runs body as kernel<<<grid, threads, shared_bytes>>>. Shared memory starts as 0xff bytes
// (a bf16 NaN, a float NaN), so a read of anything not written shows up in the results.
inline void launch(dim3 grid, unsigned threads, size_t shared_bytes,
                   const std::function<void()>& body) {
  gridDim = grid;
  blockDim = dim3(threads);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block current;
        current.shared.assign(shared_bytes, 0xff);
        current.all = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w < (threads + 31) / 32; ++w)
          current.warps.push_back(
              std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
        current.lanes.resize(threads);
        block = &current;
        std::vector<std::thread> workers;
        for (unsigned t = 0; t < threads; ++t)
          workers.emplace_back([&, t] {
            threadIdx = dim3(t);
            blockIdx = dim3(x, y, z);
            body();
          });
        for (std::thread& worker : workers) worker.join();
        block = nullptr;
      }
}

}  // namespace ulysses::cuda::emulation
