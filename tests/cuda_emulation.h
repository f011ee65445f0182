// Just enough of CUDA's device environment to run the backend's kernels on the host, one
// std::thread per GPU thread: thread and block indices, __syncthreads as a block-wide barrier,
// warp shuffles as an exchange between the 32 threads of a warp, dynamic and static shared
// memory, bf16, the math intrinsics the kernels call and cub::BlockReduce. Blocks run one
// after another, so a static variable is the block's __shared__ one. What it checks is a
// kernel's logic (indexing, tile edges, grid-stride loops, barriers, shuffles, shared-memory
// sizes, the ordering of cp.async copies by waits and barriers), not its speed or GPU-specific
// numerics. No kernel of the backend uses atomics (docs/cuda.md, "Determinism"), so none are
// emulated. Include it before a kernel header written for kernels/cuda/cuda_device.cuh's
// environment.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
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

// Who last wrote and read a 16-byte piece of shared memory through the tensor-core
// instructions (see "Shared-memory hazards" below). Epochs count a thread's __syncthreads.
struct SharedPiece {
  static constexpr unsigned kNobody = ~0u, kSeveral = ~0u - 1, kNotYet = ~0u;
  unsigned writer = kNobody;   // the thread whose cp.async wrote it last
  unsigned visible_epoch = 0;  // from when other threads may read it (kNotYet: in flight)
  unsigned reader = kNobody;   // a thread, or kSeveral
  unsigned read_epoch = kNotYet;
};

// The block being run: its shared memory, its barrier and one barrier per warp.
struct Block {
  std::vector<unsigned char> shared;
  std::vector<SharedPiece> pieces;  // one per 16 bytes of shared
  std::mutex pieces_mutex;
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> lanes;  // one shuffle slot per thread
  // The warp exchanges of mma_m16n8k16 (a and b registers, 6 per thread) and ldmatrix (a row
  // address per thread), in two sets used in turn (see exchange_set).
  std::vector<uint32_t> fragments;
  std::vector<const bf16*> matrix_rows;
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

namespace ulysses::cuda::emulation {
inline thread_local unsigned barrier_epoch = 0;  // the __syncthreads this thread has passed
}

inline void __syncthreads() {
  ulysses::cuda::emulation::block->all->arrive_and_wait();
  ++ulysses::cuda::emulation::barrier_epoch;
}

// Every lane of the warp must take part, as with a full mask on the GPU.
inline void __syncwarp(unsigned = 0xffffffffu) {
  ulysses::cuda::emulation::block->warps[threadIdx.x / 32]->arrive_and_wait();
}

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

// The host twins of kernels/cuda/cuda_mma.cuh: the tensor-core mma, ldmatrix and cp.async,
// with the PTX ISA's fragment layouts (docs/cuda.md, "Fragment layouts"), so that a kernel that
// puts a value in the wrong register or lane computes a wrong product here as on the GPU.
namespace ulysses::cuda {

namespace emulation {

// A kernel bug (a misaligned or out-of-block shared address) ends the test run, naming it.
inline void fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s (thread %u of block %u,%u,%u)\n", what, threadIdx.x,
               blockIdx.x, blockIdx.y, blockIdx.z);
  std::abort();
}

inline void check_shared(const void* address, size_t bytes, size_t alignment, const char* op) {
  const unsigned char* begin = block->shared.data();
  const auto* p = static_cast<const unsigned char*>(address);
  if (p < begin || p + bytes > begin + block->shared.size()) fail(op);
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) fail(op);
}

// Shared-memory hazards. On the GPU another thread's cp.async data may land at any moment
// between its issue and its wait_group, and is ordered for the block only by a __syncthreads
// after the wait; here it lands at the wait, so a missing barrier would usually go unseen (the
// threads happen to run in a safe order). So the pieces that the tensor-core instructions
// touch keep who wrote and read them in which barrier epoch, and a kernel fails, naming the
// hazard, whatever the order the threads ran in:
//   - ldmatrix reads a piece that another thread's cp.async writes and no __syncthreads has
//     followed its wait (read after write), or a piece whose copy by this thread is not waited for;
//   - cp.async writes a piece that another thread read since the last __syncthreads (write
//     after read: a double buffer refilled while a warp still reads it), or that another
//     thread's copy still writes.
// Plain loads and stores are not tracked; the tensor-core kernels keep them to per-row
// statistics ordered by the same barriers as their tiles (docs/cuda.md, "Checked on the host").
inline SharedPiece& piece_at(const void* address) {
  const auto* p = static_cast<const unsigned char*>(address);
  return block->pieces[size_t(p - block->shared.data()) / 16];
}

inline void fail_hazard(const char* what, unsigned other) {
  char message[256];
  if (other == SharedPiece::kSeveral)
    std::snprintf(message, sizeof message, "%s; the others: several threads", what);
  else
    std::snprintf(message, sizeof message, "%s; the other: thread %u", what, other);
  fail(message);
}

inline void note_async_write(const void* address) {
  std::lock_guard<std::mutex> lock(block->pieces_mutex);
  SharedPiece& piece = piece_at(address);
  const unsigned self = threadIdx.x, epoch = barrier_epoch;
  if (piece.read_epoch == epoch && piece.reader != self)
    fail_hazard(
        "cp.async overwrites shared memory that another thread read with no __syncthreads "
        "between",
        piece.reader);
  if (piece.writer != SharedPiece::kNobody && piece.writer != self && epoch < piece.visible_epoch)
    fail_hazard("cp.async writes shared memory that another thread's cp.async still writes",
                piece.writer);
  piece = {self, SharedPiece::kNotYet, SharedPiece::kNobody, SharedPiece::kNotYet};
}

inline void note_async_landed(const void* address) {
  std::lock_guard<std::mutex> lock(block->pieces_mutex);
  piece_at(address).visible_epoch = barrier_epoch + 1;  // for the others, after a barrier
}

inline void note_read(const void* address) {
  std::lock_guard<std::mutex> lock(block->pieces_mutex);
  SharedPiece& piece = piece_at(address);
  const unsigned self = threadIdx.x, epoch = barrier_epoch;
  if (piece.writer == self && piece.visible_epoch == SharedPiece::kNotYet)
    fail("ldmatrix reads shared memory that this thread's cp.async has not been waited for");
  if (piece.writer != SharedPiece::kNobody && piece.writer != self && epoch < piece.visible_epoch)
    fail_hazard(
        "ldmatrix reads shared memory that another thread's cp.async writes, with no "
        "wait and __syncthreads between",
        piece.writer);
  if (piece.read_epoch != epoch) {
    piece.read_epoch = epoch;
    piece.reader = self;
  } else if (piece.reader != self) {
    piece.reader = SharedPiece::kSeveral;
  }
}

inline uint16_t low_half(uint32_t word) {
  return uint16_t(word & 0xffffu);
}
inline uint16_t high_half(uint32_t word) {
  return uint16_t(word >> 16);
}
inline uint32_t pack_bits(uint16_t lo, uint16_t hi) {
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// cp.async's state per thread: the copies issued since the last commit, and the committed
// groups in order. A copy lands in shared memory only when cp_async_wait retires its group: a
// kernel that reads a tile without waiting for it reads what was there before (NaN bytes, or
// the previous tile of a double buffer).
struct AsyncCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};
struct AsyncCopies {
  std::vector<AsyncCopy> open;
  std::deque<std::vector<AsyncCopy>> committed;
};
inline thread_local AsyncCopies async_copies;

// Every lane of a warp makes the same sequence of mma and ldmatrix exchanges. Exchange n
// writes set n % 2 and waits once for the warp; a lane can then write exchange n + 1 (the
// other set) while the others still read set n % 2, and set n % 2 is written again only after
// the barrier of exchange n + 1, which every lane reaches after reading exchange n. One
// barrier per exchange, not two.
inline thread_local unsigned exchanges = 0;
inline unsigned exchange_set() {
  return exchanges++ % 2;
}

}  // namespace emulation

inline uint32_t pack_bf16(float lo, float hi) {
  return emulation::pack_bits(float_to_bf16(lo), float_to_bf16(hi));
}

// d[16×8] += a[16×16]·b[16×8] for the warp. Lane l (group g = l / 4, t = l % 4) holds
//   a: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, +9], a[3] = A[g+8][2t+8,
//   +9] b: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g] d: d[0], d[1] = D[g][2t, 2t+1], d[2],
//   d[3] = D[g+8][2t, 2t+1]
// The products of bf16 are exact in fp32; the sum runs in k order, then adds d.
inline void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  emulation::Block& block = *emulation::block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t* set = &block.fragments[size_t(emulation::exchange_set()) * blockDim.x * 6];
  uint32_t* mine = set + size_t(threadIdx.x) * 6;
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  block.warps[warp]->arrive_and_wait();
  const uint32_t* warp_fragments = set + size_t(warp) * 32 * 6;
  auto half_of = [](uint32_t word, int k) {
    return bf16_to_float(k % 2 == 0 ? emulation::low_half(word) : emulation::high_half(word));
  };
  auto a_at = [&](int row, int k) {
    const int holder = (row % 8) * 4 + (k % 8) / 2, reg = row / 8 + 2 * (k / 8);
    return half_of(warp_fragments[holder * 6 + reg], k);
  };
  auto b_at = [&](int k, int column) {
    const int holder = column * 4 + (k % 8) / 2, reg = 4 + k / 8;
    return half_of(warp_fragments[holder * 6 + reg], k);
  };
  for (int i = 0; i < 4; ++i) {
    const int row = int(lane / 4) + 8 * (i / 2), column = 2 * int(lane % 4) + i % 2;
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, column);
    d[i] += sum;
  }
}

namespace emulation {

// ldmatrix .x4: lanes 8i..8i+7 give matrix i's row addresses (16-byte aligned, in shared
// memory); r[i] = row lane / 4, columns 2·(lane % 4), +1; transposed, rows 2·(lane % 4), +1 of
// column lane / 4.
inline void ldmatrix(uint32_t r[4], const bf16* row, bool transposed) {
  check_shared(row, 16, 16, "ldmatrix row address outside shared memory or not 16-byte aligned");
  Block& b = *block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  note_read(row);
  const bf16** set = &b.matrix_rows[size_t(exchange_set()) * blockDim.x];
  set[threadIdx.x] = row;
  b.warps[warp]->arrive_and_wait();
  const bf16* const* rows = set + size_t(warp) * 32;
  for (unsigned i = 0; i < 4; ++i) {
    if (!transposed) {
      const bf16* source = rows[8 * i + lane / 4] + 2 * (lane % 4);
      r[i] = pack_bits(source[0].bits, source[1].bits);
    } else {
      const unsigned first = 8 * i + 2 * (lane % 4);
      r[i] = pack_bits(rows[first][lane / 4].bits, rows[first + 1][lane / 4].bits);
    }
  }
}

}  // namespace emulation

inline void ldmatrix_x4(uint32_t r[4], const bf16* row) {
  emulation::ldmatrix(r, row, false);
}
inline void ldmatrix_x4_trans(uint32_t r[4], const bf16* row) {
  emulation::ldmatrix(r, row, true);
}

// The 16 bytes are read now (global memory does not change during a kernel) and written to
// shared memory when a wait retires the group they are committed in.
inline void cp_async_16(void* dst, const void* src, bool inside) {
  emulation::check_shared(dst, 16, 16, "cp.async destination outside shared memory or unaligned");
  if (inside && reinterpret_cast<uintptr_t>(src) % 16 != 0)
    emulation::fail("cp.async source not 16-byte aligned");
  emulation::note_async_write(dst);
  emulation::AsyncCopy copy{static_cast<unsigned char*>(dst), {}};
  if (inside) std::memcpy(copy.bytes, src, 16);
  emulation::async_copies.open.push_back(copy);
}

inline void cp_async_commit() {
  emulation::async_copies.committed.push_back(std::move(emulation::async_copies.open));
  emulation::async_copies.open.clear();
}

template <int kPending>
void cp_async_wait() {
  emulation::AsyncCopies& copies = emulation::async_copies;
  while (copies.committed.size() > size_t(kPending)) {
    for (const emulation::AsyncCopy& copy : copies.committed.front()) {
      std::memcpy(copy.dst, copy.bytes, 16);
      emulation::note_async_landed(copy.dst);
    }
    copies.committed.pop_front();
  }
}

}  // namespace ulysses::cuda

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
    current.pieces.assign((shared_bytes + 15) / 16, SharedPiece{});
    current.all = std::make_unique<std::barrier<>>(threads);
    current.warps.clear();
    for (unsigned w = 0; w < (threads + 31) / 32; ++w)
      current.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
    current.lanes.assign(threads, 0.0f);
    current.fragments.assign(size_t(threads) * 6 * 2, 0u);
    current.matrix_rows.assign(size_t(threads) * 2, nullptr);
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
        async_copies = AsyncCopies{};  // what a previous block left in flight is not this block's
        exchanges = 0;
        barrier_epoch = 0;
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
