// The tensor-core and asynchronous-copy instructions the attention kernels use
// (kernels/cuda/cuda_attention_mma.cuh), as inline PTX for sm_80 and sm_90. Each has a host
// twin in tests/cuda_emulation.h with the same name and meaning, so the kernels run on the host
// too (docs/cuda.md, "Checked on the host"). Fragment layouts are the PTX ISA's
// (docs/cuda.md, "Fragment layouts"); a register holds two bf16, the lower index in the lower
// 16 bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"

namespace ulysses::cuda {

#ifdef __CUDACC__

// d = a·b + d for one warp: a 16×16 bf16 (4 registers), b 16×8 bf16 (2 registers), d 16×8
// fp32 (4 registers), mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32.
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8×8 bf16 matrices from shared memory: lanes 8i..8i+7 give the addresses of matrix i's
// rows, and r[i] receives row lane / 4, columns 2·(lane % 4) and +1 (ldmatrix .x4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* row) {
  const unsigned address = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The same, transposed: r[i] receives rows 2·(lane % 4) and +1 of column lane / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16* row) {
  const unsigned address = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Starts copying 16 bytes from global src to shared dst (both 16-byte aligned); with
// inside false nothing is read and dst gets zeros. The copy belongs to the thread's open group.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool inside) {
  const unsigned address = unsigned(__cvta_generic_to_shared(dst));
  const int src_bytes = inside ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(src_bytes));
}

// Closes the thread's open group of copies (cp.async.commit_group).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most kPending of the thread's committed groups are still in flight
// (cp.async.wait_group); the others' data is then in shared memory for this thread, and for
// the block after a __syncthreads.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Two floats rounded to bf16 in one register, lo in the lower half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

#endif

}  // namespace ulysses::cuda
