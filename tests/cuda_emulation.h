// Just enough of CUDA's device environment to run the backend's kernels on the host, one
// std::thread per GPU thread: thread and block indices, __syncthreads as a block-wide barrier,
// warp shuffles as an exchange between the 32 threads of a warp, dynamic and static shared
// memory, bf16, the math intrinsics the kernels call and cub::BlockReduce. Blocks run one
// after another, so a static variable is the block's __shared__ one. What it checks is a
// kernel's logic (indexing, tile edges, grid-stride loops, barriers, shuffles, shared-memory
// sizes), not its speed or GPU-specific numerics. No kernel of the backend uses atomics
// (docs/cuda.md, "Determinism"), so none are emulated. Include it before a kernel header
// written for kernels/cuda/cuda_device.cuh's environment.
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
#define __host__
#define __shared__ static
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
inline float rsqrtf(float value) {
  return 1.0f / std::sqrt(value);
}
inline void sincos(double angle, double* sine, double* cosine) {
  *sine = std::sin(angle);
  *cosine = std::cos(angle);
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

// CUB's block-wide reduction, as the kernels use it: every thread of the block calls Sum or
// Reduce, and the result is defined in thread 0 only (the others get their own input back, so
// a kernel that reads it elsewhere fails). There is no barrier at the end, as in CUB: a kernel
// that reuses the storage without __syncthreads races here too. Thread 0 adds in thread
// order, which differs from CUB's tree: results agree to rounding.
namespace cub {

template <typename T, int kBlockThreads>
class BlockReduce {
 public:
  struct TempStorage {
    T slots[kBlockThreads];
  };
  explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

  T Sum(T value) {
    return Reduce(value, [](const T& a, const T& b) { return a + b; });
  }

  template <typename Op>
  T Reduce(T value, Op op) {
    storage_.slots[threadIdx.x] = value;
    __syncthreads();
    if (threadIdx.x != 0) return value;
    T result = storage_.slots[0];
    for (unsigned t = 1; t < blockDim.x; ++t) result = op(result, storage_.slots[t]);
    return result;
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub

namespace ulysses::cuda::emulation {

// Runs body as kernel<<<grid, threads, shared_bytes>>>: one std::thread per GPU thread for the
// whole launch, running the blocks in order (x fastest). A thread that returns from the kernel
// leaves the block's barriers, as an exited GPU thread no longer holds up __syncthreads.
// Shared memory starts as 0xff bytes (a bf16 NaN, a float NaN), so a read of anything not
// written shows up in the results.
inline void launch(dim3 grid, unsigned threads, size_t shared_bytes,
                   const std::function<void()>& body) {
  gridDim = grid;
  blockDim = dim3(threads);
  const unsigned blocks = grid.x * grid.y * grid.z;
  Block current;
  std::barrier<> between_blocks(threads);
  auto prepare = [&] {
    current.shared.assign(shared_bytes, 0xff);
    current.all = std::make_unique<std::barrier<>>(threads);
    current.warps.clear();
    for (unsigned w = 0; w < (threads + 31) / 32; ++w)
      current.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
    current.lanes.assign(threads, 0.0f);
  };
  block = &current;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      threadIdx = dim3(t);
      for (unsigned index = 0; index < blocks; ++index) {
        if (t == 0) prepare();
        between_blocks.arrive_and_wait();
        blockIdx = dim3(index % grid.x, index / grid.x % grid.y, index / (grid.x * grid.y));
        body();
        current.warps[t / 32]->arrive_and_drop();
        current.all->arrive_and_drop();
        between_blocks.arrive_and_wait();
      }
    });
  for (std::thread& worker : workers) worker.join();
  block = nullptr;
}

// The same with a kernel's LaunchShape (kernels/cuda/cuda_device.cuh), as its real launch.
template <typename Shape>
void launch(const Shape& shape, const std::function<void()>& body) {
  launch(shape.grid, shape.threads, shape.shared_bytes, body);
}

// launch(shape, kernel, args...) as the host-side code shared with the backend calls it
// (sum_squares_passes, lm_head_loss_tiles): where the backend's StreamLaunch
// (kernels/cuda/cuda_common.cuh) runs kernel<<<shape>>>(args...) on its stream, this runs it
// on the host.
struct HostLaunch {
  template <typename Shape, typename Kernel, typename... Args>
  void operator()(const Shape& shape, Kernel kernel, Args... args) const {
    launch(shape, [&] { kernel(args...); });
  }
};

}  // namespace ulysses::cuda::emulation
