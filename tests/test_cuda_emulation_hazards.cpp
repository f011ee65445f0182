// The emulation's shared-memory hazard checks (tests/cuda_emulation.h, "Shared-memory
// hazards"): a cp.async copy is ordered for the other threads of the block only by its
// wait_group and a __syncthreads after it, and a buffer may be refilled only after a
// __syncthreads that follows every read of it. The emulation lands copies at the wait, so
// without these checks a missing barrier passes whenever the threads happen to run in a safe
// order (as dropping the forward kernel's last __syncthreads did, three runs of three). Each
// case is one warp copying rows of 8 bf16 and reading them back with ldmatrix, once as a
// kernel should and once with one step left out; the second must end the kernel, naming the
// hazard, in whatever order the threads run.
//
// In the attention kernels (kernels/cuda/cuda_attention_mma.cuh) these checks fail cases of
// test_cuda_attention_emulated (TensorCores/, and EitherForwardFeedsEitherBackward) when
// (each tried, then reverted):
//   the forward's or dQ's loop drops its last __syncthreads (write after read): the two cases
//   with three key tiles or more (T 130 d 64, T 200 d 128), the first whose buffer is refilled;
//   the dK/dV loop drops its last __syncthreads: four of the seven cases and Interface;
//   stream_key_tiles drops its __syncthreads (read after write), the dK/dV loop drops its
//   cp_async_wait<1>, or stream_key_tiles waits with <2>: every case and Interface.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/cuda_emulation.h"

namespace ulysses {
namespace {

using cuda::bf16;
using cuda::emulation::launch;

constexpr int kRowElements = 8;  // one 16-byte row: one cp.async, one ldmatrix row address
constexpr int kRows = 32;

// Row r of the source holds r·8 .. r·8 + 7.
std::vector<bf16> numbered_rows() {
  std::vector<bf16> rows(kRows * kRowElements);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = __float2bfloat16_rn(float(i));
  return rows;
}

enum class Leave { nothing_out, the_barrier, the_wait, the_barrier_before_refilling };

// Thread t copies row t into shared memory; then lane l hands ldmatrix row (l + 1) % 32, one
// that another thread copied; with refill, each thread then copies its row again. Returns
// lane 0's first register: elements 0 and 1 of the row lane 0 handed, row 1.
uint32_t copy_then_read(const std::vector<bf16>& source, Leave leave, bool refill) {
  uint32_t first_register = 0;
  launch(dim3(1), 32, kRows * kRowElements * sizeof(bf16), [&] {
    bf16* rows = reinterpret_cast<bf16*>(cuda::dynamic_shared_memory());
    const int lane = int(threadIdx.x);
    cuda::cp_async_16(rows + lane * kRowElements, source.data() + lane * kRowElements, true);
    cuda::cp_async_commit();
    if (leave != Leave::the_wait) cuda::cp_async_wait<0>();
    if (leave != Leave::the_barrier) __syncthreads();
    uint32_t r[4];
    cuda::ldmatrix_x4(r, rows + (lane + 1) % kRows * kRowElements);
    if (lane == 0) first_register = r[0];
    if (!refill) return;
    if (leave != Leave::the_barrier_before_refilling) __syncthreads();
    cuda::cp_async_16(rows + lane * kRowElements, source.data() + lane * kRowElements, true);
    cuda::cp_async_commit();
    cuda::cp_async_wait<0>();
  });
  return first_register;
}

class EmulatedHazards : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  const std::vector<bf16> source_ = numbered_rows();
};

TEST_F(EmulatedHazards, AWaitThenABarrierMakeACopyVisibleToTheBlock) {
  const uint32_t first = copy_then_read(source_, Leave::nothing_out, true);
  EXPECT_EQ(bf16_to_float(uint16_t(first & 0xffffu)), 8.0f);
  EXPECT_EQ(bf16_to_float(uint16_t(first >> 16)), 9.0f);
}

TEST_F(EmulatedHazards, ReadingAnotherThreadsCopyWithoutABarrierFails) {
  EXPECT_DEATH(copy_then_read(source_, Leave::the_barrier, false),
               "ldmatrix reads shared memory that another thread's cp.async writes|"
               "cp.async overwrites shared memory that another thread read");
}

// Without the wait, even a barrier does not order the copy.
TEST_F(EmulatedHazards, ReadingACopyNobodyWaitedForFails) {
  EXPECT_DEATH(copy_then_read(source_, Leave::the_wait, false),
               "ldmatrix reads shared memory that another thread's cp.async writes");
}

TEST_F(EmulatedHazards, RefillingABufferOthersStillReadFails) {
  EXPECT_DEATH(copy_then_read(source_, Leave::the_barrier_before_refilling, true),
               "cp.async overwrites shared memory that another thread read");
}

// A thread's own copy is there for it after its wait, and not before.
TEST_F(EmulatedHazards, ReadingOnesOwnCopyBeforeItsWaitFails) {
  auto own_row_before_wait = [&] {
    launch(dim3(1), 32, kRows * kRowElements * sizeof(bf16), [&] {
      bf16* rows = reinterpret_cast<bf16*>(cuda::dynamic_shared_memory());
      const int lane = int(threadIdx.x);
      cuda::cp_async_16(rows + lane * kRowElements, source_.data() + lane * kRowElements, true);
      cuda::cp_async_commit();
      uint32_t r[4];
      cuda::ldmatrix_x4(r, rows + lane * kRowElements);
    });
  };
  EXPECT_DEATH(own_row_before_wait(),
               "ldmatrix reads shared memory that this thread's cp.async has not been waited for");
}

}  // namespace
}  // namespace ulysses
