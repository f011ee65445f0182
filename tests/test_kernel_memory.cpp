// Memory claims of the cpu kernels, proven with tracked bytes: attention scratch does not
// grow with T² (doubling T doubles the attention peak), and the fused LM-head loss never
// holds [R, V] logits.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_ops_common.h"

namespace ulysses {
namespace {

using ops_test::make_f32;
using ops_test::make_i32;
using ops_test::random_floats;

struct AttentionPeak {
  int64_t tensors = 0;  // bytes of q, k, v, out, lse, dout, dq, dk, dv
  int64_t peak = 0;     // peak of MemCategory::attention during forward + backward
};

AttentionPeak measure_attention(int64_t seq_len) {
  CpuBackend backend;
  // Scratch is per thread: fix the count so that the bounds below hold on any machine.
  backend.set_num_threads(2);
  const int64_t B = 1, Hq = 4, Hkv = 2, d = 64;
  const MemCategory attention = MemCategory::attention;
  const size_t q_size = size_t(B * seq_len * Hq * d), kv_size = size_t(B * seq_len * Hkv * d);
  Buffer q = make_f32(backend, {B, seq_len, Hq, d}, random_floats(q_size, 1), attention);
  Buffer k = make_f32(backend, {B, seq_len, Hkv, d}, random_floats(kv_size, 2), attention);
  Buffer v = make_f32(backend, {B, seq_len, Hkv, d}, random_floats(kv_size, 3), attention);
  Buffer dout = make_f32(backend, {B, seq_len, Hq, d}, random_floats(q_size, 4), attention);
  Buffer out = backend.alloc(attention, DType::f32, {B, seq_len, Hq, d}, "out");
  Buffer lse = backend.alloc(attention, DType::f32, {B, Hq, seq_len}, "lse");
  Buffer dq = backend.alloc(attention, DType::f32, {B, seq_len, Hq, d}, "dq");
  Buffer dk = backend.alloc(attention, DType::f32, {B, seq_len, Hkv, d}, "dk");
  Buffer dv = backend.alloc(attention, DType::f32, {B, seq_len, Hkv, d}, "dv");
  AttentionPeak result;
  result.tensors = backend.memory().current(attention);
  backend.memory().reset_peaks();
  backend.attention_forward(out, lse, q, k, v);
  backend.attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  result.peak = backend.memory().peak(attention);
  EXPECT_EQ(backend.memory().current(attention), result.tensors) << "scratch was not released";
  return result;
}

TEST(KernelMemory, AttentionPeakGrowsLinearlyWithSequenceLength) {
  const int64_t T = 1024;
  const AttentionPeak single = measure_attention(T);
  const AttentionPeak twice = measure_attention(2 * T);
  EXPECT_GT(single.peak, single.tensors) << "the kernels charged no scratch at all";
  const double ratio = double(twice.peak) / double(single.peak);
  EXPECT_LE(ratio, 2.05) << "peaks " << single.peak << " and " << twice.peak;
  // One [T, T] score matrix in f32 would be T²·4 bytes; the scratch must be far below it.
  for (const auto& [length, run] : {std::pair{T, single}, std::pair{2 * T, twice}}) {
    const int64_t scratch = run.peak - run.tensors;
    EXPECT_LT(scratch, length * length * 4 / 8) << "T " << length << " scratch " << scratch;
  }
}

TEST(KernelMemory, LmHeadLossNeverHoldsAllLogits) {
  CpuBackend backend;
  const int64_t rows = 256, width = 64, vocab = 2048, tile_rows = 32;
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[r] = int32_t((r * 7) % vocab);
  Buffer hidden = make_f32(backend, {rows, width}, random_floats(size_t(rows * width), 5));
  Buffer weight = make_f32(backend, {vocab, width}, random_floats(size_t(vocab * width), 6));
  Buffer ids = make_i32(backend, {rows}, targets);
  Buffer dhidden = backend.alloc(MemCategory::grads, DType::f32, {rows, width}, "dhidden");
  Buffer dweight = backend.alloc(MemCategory::grads, DType::f32, {vocab, width}, "dweight");
  backend.fill_zero(dweight);
  backend.memory().reset_peaks();
  const LossResult result =
      backend.lm_head_loss(hidden, weight, ids, tile_rows, 1.0f / float(rows), dhidden, dweight);
  EXPECT_EQ(result.count, rows);
  const int64_t peak = backend.memory().peak(MemCategory::workspace);
  EXPECT_GE(peak, tile_rows * vocab * 4) << "the logits tile was not charged to workspace";
  EXPECT_LT(peak, rows * vocab * 4);
  EXPECT_LE(peak, 2 * tile_rows * vocab * 4);
  EXPECT_EQ(backend.memory().current(MemCategory::workspace), 0);
}

}  // namespace
}  // namespace ulysses
