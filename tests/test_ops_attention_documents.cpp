// CpuBackend attention with packed documents (kernels/documents.h): forward against a
// double-precision block-diagonal causal reference, backward against finite differences of
// it, documents that start inside, at and across the 64-row tiles; a document's outputs and
// gradients do not depend on another document's inputs at all (bit for bit); no documents
// and one document are the same bits; bad document starts are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/op_scratch.h"
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

struct DocumentCase {
  int64_t batch, seq_len, q_heads, kv_heads, dim;
  std::vector<std::vector<int64_t>> starts;  // per sequence
  size_t max_checks;
};

std::ostream& operator<<(std::ostream& out, const DocumentCase& c) {
  out << "B" << c.batch << " T" << c.seq_len << " Hq" << c.q_heads << " Hkv" << c.kv_heads << " d"
      << c.dim << " starts";
  for (const auto& starts : c.starts) {
    out << " {";
    for (int64_t s : starts) out << " " << s;
    out << " }";
  }
  return out;
}

// Attention in double where query i sees keys j with start(i) <= j <= i.
std::vector<double> reference(const DocumentCase& c, const std::vector<double>& q,
                              const std::vector<double>& k, const std::vector<double>& v,
                              std::vector<double>* lse = nullptr) {
  const int64_t T = c.seq_len, Hq = c.q_heads, Hkv = c.kv_heads, d = c.dim;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> out(q.size(), 0.0);
  std::vector<double> scores(static_cast<size_t>(T));
  if (lse) lse->assign(size_t(c.batch * Hq * T), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv_h = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t first = document_start(c.starts[size_t(b)], i);
        const double* q_row = &q[size_t(((b * T + i) * Hq + h) * d)];
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= i; ++j) {
          const double* k_row = &k[size_t(((b * T + j) * Hkv + kv_h) * d)];
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e) dot += q_row[e] * k_row[e];
          scores[size_t(j)] = dot * scale;
          max_score = std::max(max_score, scores[size_t(j)]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= i; ++j) sum += std::exp(scores[size_t(j)] - max_score);
        double* out_row = &out[size_t(((b * T + i) * Hq + h) * d)];
        for (int64_t j = first; j <= i; ++j) {
          const double p = std::exp(scores[size_t(j)] - max_score) / sum;
          const double* v_row = &v[size_t(((b * T + j) * Hkv + kv_h) * d)];
          for (int64_t e = 0; e < d; ++e) out_row[e] += p * v_row[e];
        }
        if (lse) (*lse)[size_t((b * Hq + h) * T + i)] = max_score + std::log(sum);
      }
    }
  return out;
}

// One forward and backward of the cpu backend on given inputs.
struct AttentionRun {
  std::vector<float> out, lse, dq, dk, dv;
};

AttentionRun run(const DocumentCase& c, const Documents& documents, const std::vector<float>& q,
                 const std::vector<float>& k, const std::vector<float>& v,
                 const std::vector<float>& dout) {
  CpuBackend backend;
  const int64_t B = c.batch, T = c.seq_len, Hq = c.q_heads, Hkv = c.kv_heads, d = c.dim;
  Buffer qb = make_f32(backend, {B, T, Hq, d}, q);
  Buffer kb = make_f32(backend, {B, T, Hkv, d}, k);
  Buffer vb = make_f32(backend, {B, T, Hkv, d}, v);
  Buffer db = make_f32(backend, {B, T, Hq, d}, dout);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {B, T, Hq, d}, "out");
  Buffer lse = backend.alloc(MemCategory::activations, DType::f32, {B, Hq, T}, "lse");
  // Garbage first: the backward must overwrite every row, also those of skipped tiles.
  Buffer dq = make_f32(backend, {B, T, Hq, d}, random_floats(q.size(), 5));
  Buffer dk = make_f32(backend, {B, T, Hkv, d}, random_floats(k.size(), 6));
  Buffer dv = make_f32(backend, {B, T, Hkv, d}, random_floats(k.size(), 7));
  backend.attention_forward(out, lse, qb, kb, vb, documents);
  backend.attention_backward(dq, dk, dv, db, qb, kb, vb, out, lse, documents);
  return {read_f32(backend, out), read_f32(backend, lse), read_f32(backend, dq),
          read_f32(backend, dk), read_f32(backend, dv)};
}

class CpuDocumentAttention : public ::testing::TestWithParam<DocumentCase> {};

TEST_P(CpuDocumentAttention, ForwardAndBackwardMatchBlockDiagonalReference) {
  const DocumentCase c = GetParam();
  const size_t q_size = size_t(c.batch * c.seq_len * c.q_heads * c.dim);
  const size_t kv_size = size_t(c.batch * c.seq_len * c.kv_heads * c.dim);
  const std::vector<float> q = random_floats(q_size, 1, -2.0f, 2.0f);
  const std::vector<float> k = random_floats(kv_size, 2, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(kv_size, 3);
  const std::vector<float> dout = random_floats(q_size, 4);
  const AttentionRun got = run(c, Documents{c.starts}, q, k, v, dout);

  std::vector<double> expected_lse;
  const std::vector<double> expected =
      reference(c, to_double(q), to_double(k), to_double(v), &expected_lse);
  EXPECT_LT(relative_error(got.out, expected), 1e-5) << c;
  EXPECT_LT(relative_error(got.lse, expected_lse), 1e-5) << c;

  std::ostringstream name;
  name << c;
  expect_gradient_matches(
      got.dq, to_double(q),
      [&](const std::vector<double>& x) {
        return weighted_sum(reference(c, x, to_double(k), to_double(v)), dout);
      },
      1e-4, name.str() + " dq", c.max_checks);
  expect_gradient_matches(
      got.dk, to_double(k),
      [&](const std::vector<double>& x) {
        return weighted_sum(reference(c, to_double(q), x, to_double(v)), dout);
      },
      1e-4, name.str() + " dk", c.max_checks);
  expect_gradient_matches(
      got.dv, to_double(v),
      [&](const std::vector<double>& x) {
        return weighted_sum(reference(c, to_double(q), to_double(k), x), dout);
      },
      1e-4, name.str() + " dv", c.max_checks);
}

// The tile is 64 rows (kernels/op_scratch.h): documents that end inside a tile, exactly at a
// tile edge, span several tiles, are one token long, and a whole tile skipped.
INSTANTIATE_TEST_SUITE_P(
    Boundaries, CpuDocumentAttention,
    ::testing::Values(DocumentCase{1, 150, 2, 2, 8, {{0, 30, 64, 65, 140}}, 120},
                      DocumentCase{2, 200, 4, 2, 16, {{0, 128, 129}, {0, 10, 199}}, 100},
                      DocumentCase{1, 190, 4, 1, 20, {{0, 1, 70, 150}}, 80}));

// Sequence 0 of the case with the tokens of one document replaced: outputs and gradients of
// every row outside that document stay the same bits.
TEST(CpuDocumentAttention, ADocumentDoesNotSeeAnother) {
  static_assert(kCpuAttentionTile == 64, "the documents below are placed around 64-row tiles");
  const DocumentCase c{1, 200, 4, 2, 16, {{0, 50, 100, 130}}, 0};
  const int64_t row_q = c.q_heads * c.dim, row_kv = c.kv_heads * c.dim;
  const size_t q_size = size_t(c.seq_len * row_q), kv_size = size_t(c.seq_len * row_kv);
  const std::vector<float> q = random_floats(q_size, 21, -2.0f, 2.0f);
  const std::vector<float> k = random_floats(kv_size, 22, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(kv_size, 23);
  const std::vector<float> dout = random_floats(q_size, 24);
  const AttentionRun base = run(c, Documents{c.starts}, q, k, v, dout);
  // Document [50, 100): it shares tile 0 with the document before and tile 1 with the one
  // after, so both its neighbours' tiles visit its keys, masked.
  const int64_t first = 50, end = 100;
  std::vector<float> q2 = q, k2 = k, v2 = v, dout2 = dout;
  for (int64_t t = first; t < end; ++t) {
    for (int64_t e = 0; e < row_q; ++e) q2[size_t(t * row_q + e)] += 1.5f;
    for (int64_t e = 0; e < row_q; ++e) dout2[size_t(t * row_q + e)] *= -3.0f;
    for (int64_t e = 0; e < row_kv; ++e) k2[size_t(t * row_kv + e)] -= 2.0f;
    for (int64_t e = 0; e < row_kv; ++e) v2[size_t(t * row_kv + e)] *= 7.0f;
  }
  const AttentionRun changed = run(c, Documents{c.starts}, q2, k2, v2, dout2);
  auto same_outside = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                          const char* what) {
    int64_t differing = 0;
    for (int64_t t = 0; t < c.seq_len; ++t) {
      if (t >= first && t < end) continue;
      differing +=
          std::memcmp(&a[size_t(t * row)], &b[size_t(t * row)], size_t(row) * sizeof(float)) != 0;
    }
    EXPECT_EQ(differing, 0) << what << ": rows outside [50, 100) changed";
  };
  same_outside(base.out, changed.out, row_q, "out");
  same_outside(base.dq, changed.dq, row_q, "dq");
  same_outside(base.dk, changed.dk, row_kv, "dk");
  same_outside(base.dv, changed.dv, row_kv, "dv");
  // lse is [Hq, T]: compare each head's rows outside the document.
  for (int64_t h = 0; h < c.q_heads; ++h)
    for (int64_t t = 0; t < c.seq_len; ++t)
      if (t < first || t >= end)
        ASSERT_EQ(base.lse[size_t(h * c.seq_len + t)], changed.lse[size_t(h * c.seq_len + t)])
            << "lse of head " << h << " row " << t;
  // The changed document itself did change (the test can fail).
  EXPECT_NE(base.out[size_t(first * row_q)], changed.out[size_t(first * row_q)]);
}

TEST(CpuDocumentAttention, OneDocumentIsPlainCausalAttentionBitForBit) {
  const DocumentCase c{2, 150, 4, 2, 16, {{0}, {0}}, 0};
  const size_t q_size = size_t(c.batch * c.seq_len * c.q_heads * c.dim);
  const size_t kv_size = size_t(c.batch * c.seq_len * c.kv_heads * c.dim);
  const std::vector<float> q = random_floats(q_size, 31, -2.0f, 2.0f);
  const std::vector<float> k = random_floats(kv_size, 32, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(kv_size, 33);
  const std::vector<float> dout = random_floats(q_size, 34);
  const AttentionRun none = run(c, Documents{}, q, k, v, dout);
  const AttentionRun one = run(c, Documents{c.starts}, q, k, v, dout);
  EXPECT_EQ(none.out, one.out);
  EXPECT_EQ(none.lse, one.lse);
  EXPECT_EQ(none.dq, one.dq);
  EXPECT_EQ(none.dk, one.dk);
  EXPECT_EQ(none.dv, one.dv);
}

TEST(CpuDocumentAttention, RefusesStartsThatDoNotFit) {
  CpuBackend backend;
  Buffer q = backend.alloc(MemCategory::activations, DType::f32, {2, 8, 2, 8}, "q");
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {2, 8, 2, 8}, "out");
  Buffer lse = backend.alloc(MemCategory::activations, DType::f32, {2, 2, 8}, "lse");
  auto message = [&](const Documents& documents) {
    try {
      backend.attention_forward(out, lse, q, q, q, documents);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(Documents{{{0, 3}}}),
            "attention_forward: document starts for 1 sequences, but the batch has 2");
  EXPECT_EQ(message(Documents{{{0, 3}, {1}}}),
            "attention_forward: document starts of sequence 1 do not begin at 0");
  EXPECT_EQ(message(Documents{{{0, 3, 3}, {0}}}),
            "attention_forward: document starts of sequence 0 do not ascend");
  EXPECT_EQ(message(Documents{{{0, 8}, {0}}}),
            "attention_forward: document starts of sequence 0 reach 8, past the sequence of 8 "
            "tokens");
}

}  // namespace
}  // namespace ulysses
