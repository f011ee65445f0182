// CpuBackend causal attention: forward (out and lse) against a double-precision reference,
// backward against central finite differences of it, GQA/MQA head sharing, sequence lengths
// that are not multiples of the tile, and bit-identical results across runs and threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_ops_common.h"

namespace ulysses {
namespace {

using ops_test::expect_gradient_matches;
using ops_test::make_f32;
using ops_test::random_floats;
using ops_test::read_f32;
using ops_test::relative_error;
using ops_test::to_double;
using ops_test::weighted_sum;

struct AttentionCase {
  int64_t batch, seq_len, q_heads, kv_heads, dim;
  size_t max_checks;  // finite-difference coordinates per input tensor
};

std::ostream& operator<<(std::ostream& out, const AttentionCase& c) {
  return out << "B" << c.batch << " T" << c.seq_len << " Hq" << c.q_heads << " Hkv" << c.kv_heads
             << " d" << c.dim;
}

// Causal softmax attention in double; q[B, T, Hq, d], k/v[B, T, Hkv, d].
std::vector<double> reference_attention(const AttentionCase& c, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        std::vector<double>* lse = nullptr) {
  const int64_t T = c.seq_len, Hq = c.q_heads, Hkv = c.kv_heads, d = c.dim;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> out(q.size(), 0.0);
  if (lse) lse->assign(size_t(c.batch * Hq * T), 0.0);
  std::vector<double> scores(static_cast<size_t>(T));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv_h = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        const double* q_row = &q[((b * T + i) * Hq + h) * d];
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const double* k_row = &k[((b * T + j) * Hkv + kv_h) * d];
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e) dot += q_row[e] * k_row[e];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - max_score);
        double* out_row = &out[((b * T + i) * Hq + h) * d];
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[j] - max_score) / sum;
          const double* v_row = &v[((b * T + j) * Hkv + kv_h) * d];
          for (int64_t e = 0; e < d; ++e) out_row[e] += p * v_row[e];
        }
        if (lse) (*lse)[(b * Hq + h) * T + i] = max_score + std::log(sum);
      }
    }
  return out;
}

class CpuAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CpuAttention, ForwardAndBackwardMatchReference) {
  const AttentionCase c = GetParam();
  CpuBackend backend;
  const size_t q_size = size_t(c.batch * c.seq_len * c.q_heads * c.dim);
  const size_t kv_size = size_t(c.batch * c.seq_len * c.kv_heads * c.dim);
  // Spread of ±2 gives peaked softmax rows, so a wrong max or lse would show.
  const std::vector<float> q = random_floats(q_size, 1, -2.0f, 2.0f);
  const std::vector<float> k = random_floats(kv_size, 2, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(kv_size, 3);
  const std::vector<float> dout = random_floats(q_size, 4);

  Buffer qb = make_f32(backend, {c.batch, c.seq_len, c.q_heads, c.dim}, q);
  Buffer kb = make_f32(backend, {c.batch, c.seq_len, c.kv_heads, c.dim}, k);
  Buffer vb = make_f32(backend, {c.batch, c.seq_len, c.kv_heads, c.dim}, v);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32,
                             {c.batch, c.seq_len, c.q_heads, c.dim}, "out");
  Buffer lse =
      backend.alloc(MemCategory::activations, DType::f32, {c.batch, c.q_heads, c.seq_len}, "lse");
  backend.attention_forward(out, lse, qb, kb, vb);

  std::vector<double> expected_lse;
  const std::vector<double> expected =
      reference_attention(c, to_double(q), to_double(k), to_double(v), &expected_lse);
  EXPECT_LT(relative_error(read_f32(backend, out), expected), 1e-5) << c;
  EXPECT_LT(relative_error(read_f32(backend, lse), expected_lse), 1e-5) << c;

  Buffer db = make_f32(backend, {c.batch, c.seq_len, c.q_heads, c.dim}, dout);
  // Filled with garbage first: the backward must overwrite, not accumulate.
  Buffer dq = make_f32(backend, {c.batch, c.seq_len, c.q_heads, c.dim}, random_floats(q_size, 5));
  Buffer dk = make_f32(backend, {c.batch, c.seq_len, c.kv_heads, c.dim}, random_floats(kv_size, 6));
  Buffer dv = make_f32(backend, {c.batch, c.seq_len, c.kv_heads, c.dim}, random_floats(kv_size, 7));
  backend.attention_backward(dq, dk, dv, db, qb, kb, vb, out, lse);

  auto loss_q = [&](const std::vector<double>& x) {
    return weighted_sum(reference_attention(c, x, to_double(k), to_double(v)), dout);
  };
  auto loss_k = [&](const std::vector<double>& x) {
    return weighted_sum(reference_attention(c, to_double(q), x, to_double(v)), dout);
  };
  auto loss_v = [&](const std::vector<double>& x) {
    return weighted_sum(reference_attention(c, to_double(q), to_double(k), x), dout);
  };
  std::ostringstream name;
  name << c;
  expect_gradient_matches(read_f32(backend, dq), to_double(q), loss_q, 1e-4, name.str() + " dq",
                          c.max_checks);
  expect_gradient_matches(read_f32(backend, dk), to_double(k), loss_k, 1e-4, name.str() + " dk",
                          c.max_checks);
  expect_gradient_matches(read_f32(backend, dv), to_double(v), loss_v, 1e-4, name.str() + " dv",
                          c.max_checks);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuAttention,
    ::testing::Values(AttentionCase{2, 37, 2, 2, 8, 400},     // one partial tile
                      AttentionCase{1, 150, 4, 2, 16, 120},   // GQA 2:1, three tiles, last partial
                      AttentionCase{1, 130, 4, 1, 20, 120},   // one kv head, padded head dim
                      AttentionCase{2, 128, 2, 1, 32, 80}));  // whole tiles, batch 2

struct AttentionRun {
  std::vector<float> out, lse, dq, dk, dv;
};

AttentionRun run_attention(CpuBackend& backend, int threads) {
  backend.set_num_threads(threads);
  const int64_t B = 1, T = 200, Hq = 4, Hkv = 2, d = 32;
  const size_t q_size = size_t(B * T * Hq * d), kv_size = size_t(B * T * Hkv * d);
  Buffer q = make_f32(backend, {B, T, Hq, d}, random_floats(q_size, 11, -2.0f, 2.0f));
  Buffer k = make_f32(backend, {B, T, Hkv, d}, random_floats(kv_size, 12, -2.0f, 2.0f));
  Buffer v = make_f32(backend, {B, T, Hkv, d}, random_floats(kv_size, 13));
  Buffer dout = make_f32(backend, {B, T, Hq, d}, random_floats(q_size, 14));
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {B, T, Hq, d}, "out");
  Buffer lse = backend.alloc(MemCategory::activations, DType::f32, {B, Hq, T}, "lse");
  Buffer dq = backend.alloc(MemCategory::activations, DType::f32, {B, T, Hq, d}, "dq");
  Buffer dk = backend.alloc(MemCategory::activations, DType::f32, {B, T, Hkv, d}, "dk");
  Buffer dv = backend.alloc(MemCategory::activations, DType::f32, {B, T, Hkv, d}, "dv");
  backend.attention_forward(out, lse, q, k, v);
  backend.attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  return {read_f32(backend, out), read_f32(backend, lse), read_f32(backend, dq),
          read_f32(backend, dk), read_f32(backend, dv)};
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CpuAttentionDeterminism, BitIdenticalAcrossRunsAndThreadCounts) {
  CpuBackend backend;
  const AttentionRun first = run_attention(backend, 2);
  const AttentionRun second = run_attention(backend, 2);
  EXPECT_TRUE(bit_identical(first.out, second.out));
  EXPECT_TRUE(bit_identical(first.lse, second.lse));
  EXPECT_TRUE(bit_identical(first.dq, second.dq));
  EXPECT_TRUE(bit_identical(first.dk, second.dk));
  EXPECT_TRUE(bit_identical(first.dv, second.dv));
  // Every output element is produced by one task in a fixed order, whatever the threads.
  const AttentionRun single = run_attention(backend, 1);
  EXPECT_TRUE(bit_identical(first.out, single.out));
  EXPECT_TRUE(bit_identical(first.dq, single.dq));
  EXPECT_TRUE(bit_identical(first.dk, single.dk));
  EXPECT_TRUE(bit_identical(first.dv, single.dv));
}

TEST(CpuAttentionShapes, RejectsHeadsThatDoNotGroup) {
  CpuBackend backend;
  Buffer q = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 3, 8}, "q");
  Buffer k = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 2, 8}, "k");
  Buffer v = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 2, 8}, "v");
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 3, 8}, "out");
  Buffer lse = backend.alloc(MemCategory::activations, DType::f32, {1, 3, 4}, "lse");
  EXPECT_THROW(backend.attention_forward(out, lse, q, k, v), std::invalid_argument);
  Buffer small_lse = backend.alloc(MemCategory::activations, DType::f32, {1, 3, 3}, "lse");
  Buffer k3 = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 3, 8}, "k");
  Buffer v3 = backend.alloc(MemCategory::activations, DType::f32, {1, 4, 3, 8}, "v");
  EXPECT_THROW(backend.attention_forward(out, small_lse, q, k3, v3), std::invalid_argument);
}

}  // namespace
}  // namespace ulysses
