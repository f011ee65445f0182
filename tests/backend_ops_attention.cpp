// The op table's attention rows: whole causal attention, with and without packed documents,
// and ring attention's blocks adding up to it (tests/test_backend_ops.cpp says what the
// columns and tolerances are, and lists the kernel mutations these rows catch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/backend_ops_testing.h"

namespace ulysses {
namespace {

using namespace backend_ops;

// ---- attention ---------------------------------------------------------------------------

struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, dim;
  // Packed documents (kernels/documents.h): each sequence's starts; empty: none.
  std::vector<std::vector<int64_t>> starts = {};
};

// Causal softmax(q·kᵀ/√d)·v in double, each query seeing only its own document's keys;
// lse[B, Hq, T] when asked.
std::vector<double> attention_reference(const AttentionShape& s, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        std::vector<double>* lse = nullptr) {
  const int64_t T = s.seq, d = s.dim, group = s.q_heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> out(q.size());
  if (lse) lse->assign(size_t(s.batch * s.q_heads * T), 0.0);
  std::vector<double> scores(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double* q_row = &q[((b * T + i) * s.q_heads + h) * d];
        const int64_t first = s.starts.empty() ? 0 : document_start(s.starts[size_t(b)], i);
        double max_score = -INFINITY;
        for (int64_t j = first; j <= i; ++j) {
          const double* k_row = &k[((b * T + j) * s.kv_heads + h / group) * d];
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += q_row[c] * k_row[c];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= i; ++j) sum += std::exp(scores[j] - max_score);
        if (lse) (*lse)[(b * s.q_heads + h) * T + i] = max_score + std::log(sum);
        double* out_row = &out[((b * T + i) * s.q_heads + h) * d];
        for (int64_t j = first; j <= i; ++j) {
          const double p = std::exp(scores[j] - max_score) / sum;
          const double* v_row = &v[((b * T + j) * s.kv_heads + h / group) * d];
          for (int64_t c = 0; c < d; ++c) out_row[c] += p * v_row[c];
        }
      }
  return out;
}

TEST_P(BackendOps, Attention) {
  // One token; GQA groups 1–4; T not a multiple of the 64-row tile; both kernel widths.
  // Packed documents: starts inside tile 0 (a tile across a boundary), at the tile edge 64
  // (tiles before and after one), inside tile 1, and one whose query tile skips key tile 0;
  // a document that ends one row into the next tile (its keys in tile 0 are seen by tile 1),
  // a one-token document at the end, and GQA. On the cuda columns head dims 16, 64 and 128
  // run the tensor-core kernels, 12 the FMA ones (kernels/cuda/cuda_attention.cu).
  const std::vector<AttentionShape> shapes = {{1, 1, 1, 1, 16},
                                              {2, 17, 4, 2, 16},
                                              {1, 65, 3, 1, 64},
                                              {1, 33, 4, 1, 64},
                                              {1, 70, 2, 2, 128},
                                              {1, 20, 2, 1, 12},
                                              {1, 150, 2, 1, 16, {{0, 40, 64, 100}}},
                                              {2, 70, 4, 2, 64, {{0, 5, 65}, {0, 69}}},
                                              {1, 90, 2, 1, 12, {{0, 30, 65}}}};
  const DType dtype = attention_dtype();
  // bf16 chains several roundings (P, dS) (docs/cuda.md).
  const double tolerance = dtype == DType::bf16 ? 3e-2 : 1e-4;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(describe(dtype, {s.batch, s.seq, s.q_heads, s.kv_heads, s.dim}) +
                 (s.starts.empty() ? "" : " with documents"));
    const Documents documents{s.starts};
    const size_t q_count = size_t(s.batch * s.seq * s.q_heads * s.dim);
    const size_t kv_count = size_t(s.batch * s.seq * s.kv_heads * s.dim);
    const std::vector<float> q = values(q_count, 36, dtype, 2.0f),
                             k = values(kv_count, 37, dtype, 2.0f), v = values(kv_count, 38, dtype),
                             dout = values(q_count, 39, dtype);
    Buffer qb = put(dtype, {s.batch, s.seq, s.q_heads, s.dim}, q);
    Buffer kb = put(dtype, {s.batch, s.seq, s.kv_heads, s.dim}, k);
    Buffer vb = put(dtype, {s.batch, s.seq, s.kv_heads, s.dim}, v);
    Buffer out = put(dtype, {s.batch, s.seq, s.q_heads, s.dim}, std::vector<float>(q_count));
    Buffer lse = put(DType::f32, {s.batch, s.q_heads, s.seq},
                     std::vector<float>(size_t(s.batch * s.q_heads * s.seq)));
    backend().attention_forward(out, lse, qb, kb, vb, documents);
    std::vector<double> expected_lse;
    const std::vector<double> expected =
        attention_reference(s, to_double(q), to_double(k), to_double(v), &expected_lse);
    EXPECT_LT(relative_error(get(out), expected), tolerance);
    EXPECT_LT(relative_error(get(lse), expected_lse), 1e-5);

    Buffer dq = put(dtype, {s.batch, s.seq, s.q_heads, s.dim}, std::vector<float>(q_count));
    Buffer dk = put(dtype, {s.batch, s.seq, s.kv_heads, s.dim}, std::vector<float>(kv_count));
    Buffer dv = put(dtype, {s.batch, s.seq, s.kv_heads, s.dim}, std::vector<float>(kv_count));
    backend().attention_backward(dq, dk, dv, put(dtype, {s.batch, s.seq, s.q_heads, s.dim}, dout),
                                 qb, kb, vb, out, lse, documents);
    // 64 coordinates per input (plus the first and last): the reference is O(T² d) a call.
    const size_t checks = 64;
    if (s.seq == 1) {
      // One key: P = 1 whatever q and k are, so dS = P·(dP − D) is zero but for rounding, and
      // so are dq = dS·k/√d and dk = dS·q/√d. dP = dO·V and D = dO·O (O = V) are fp32 sums of
      // d exact products (bf16 operands multiply exactly in fp32), each within d·u·Σ|dO·V| of
      // the true dot (u = 2⁻²⁴), so |dS| ≤ (2d + 2)·u·Σ|dO·V| with P's own rounding; bf16
      // rounds dS and the gradient once more (2⁻⁸ each). Whether dP and D round alike hangs
      // on the compiler's FMA contraction, so the bound, not exact zero.
      ASSERT_EQ(s.batch * s.q_heads, 1) << "the bound below is for one row";
      double dot_magnitude = 0.0;
      for (int64_t c = 0; c < s.dim; ++c) dot_magnitude += std::abs(double(dout[c]) * v[c]);
      const double bf16_roundings = dtype == DType::bf16 ? (1 + 0x1p-8) * (1 + 0x1p-8) : 1.0;
      const double ds_bound = double(2 * s.dim + 2) * 0x1p-24 * dot_magnitude * bf16_roundings;
      const double scale = 1.0 / std::sqrt(double(s.dim));
      const std::vector<float> dq_values = get(dq), dk_values = get(dk);
      for (int64_t c = 0; c < s.dim; ++c) {
        EXPECT_LE(std::abs(dq_values[c]), ds_bound * scale * std::abs(k[c])) << "dq " << c;
        EXPECT_LE(std::abs(dk_values[c]), ds_bound * scale * std::abs(q[c])) << "dk " << c;
      }
      EXPECT_LT(relative_error(get(dv), to_double(dout)), tolerance);
      continue;
    }
    expect_gradient_matches(
        get(dq), to_double(q),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, p, to_double(k), to_double(v)), dout);
        },
        tolerance, "dq", checks);
    expect_gradient_matches(
        get(dk), to_double(k),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, to_double(q), p, to_double(v)), dout);
        },
        tolerance, "dk", checks);
    expect_gradient_matches(
        get(dv), to_double(v),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, to_double(q), to_double(k), p), dout);
        },
        tolerance, "dv", checks);
  }
}

// Ring attention's blocks (kernels/backend.h, attention_block_forward): the sequence cut into
// 3 chunks (not tile-aligned), each query chunk against every key chunk at or before it at
// their true positions, the diagonal first and the earlier chunks merged into it by
// log-sum-exp (or, with documents, chunk 0 first); the backward's shares added into dq, dk, dv. The
// result is the whole causal attention's, checked as the Attention test checks it. With documents
// some first blocks see nothing for some rows (out 0, lse −inf before the merge) and one key chunk
// is hidden from a whole later query chunk. Head dims 16 and 64 run the tensor-core kernels on the
// cuda columns, 12 the FMA ones.
TEST_P(BackendOps, AttentionBlocksAddUpToTheWholeAttention) {
  struct BlockCase {
    AttentionShape shape;
    int64_t chunk;
  };
  const std::vector<BlockCase> cases = {{{2, 60, 4, 2, 12}, 20},
                                        {{1, 150, 2, 1, 16, {{0, 50, 100, 130}}}, 50},
                                        {{1, 120, 2, 2, 64, {{0, 70, 119}}}, 40}};
  const DType dtype = attention_dtype();
  // The whole attention's bounds; on cuda each merge and each add rounds to bf16 once more.
  const double tolerance = dtype == DType::bf16 ? 3e-2 : 1e-4;
  for (const BlockCase& c : cases) {
    const AttentionShape& s = c.shape;
    SCOPED_TRACE(describe(dtype, {s.batch, s.seq, s.q_heads, s.kv_heads, s.dim}) +
                 " in chunks of " + std::to_string(c.chunk) +
                 (s.starts.empty() ? "" : " with documents"));
    const Documents documents{s.starts};
    const int64_t B = s.batch, C = c.chunk, chunks = s.seq / c.chunk;
    const int64_t q_row = s.q_heads * s.dim, kv_row = s.kv_heads * s.dim;
    const std::vector<float> q = values(size_t(B * s.seq * q_row), 46, dtype, 2.0f),
                             k = values(size_t(B * s.seq * kv_row), 47, dtype, 2.0f),
                             v = values(size_t(B * s.seq * kv_row), 48, dtype),
                             dout = values(size_t(B * s.seq * q_row), 49, dtype);
    // Rows [chunk·C, (chunk+1)·C) of each sequence of a [B, T, row] tensor, and back.
    auto rows_of = [&](const std::vector<float>& x, int64_t row, int64_t chunk) {
      std::vector<float> part;
      for (int64_t b = 0; b < B; ++b)
        part.insert(part.end(), x.begin() + (b * s.seq + chunk * C) * row,
                    x.begin() + (b * s.seq + (chunk + 1) * C) * row);
      return part;
    };
    auto put_rows = [&](std::vector<float>& x, int64_t row, int64_t chunk,
                        const std::vector<float>& part) {
      for (int64_t b = 0; b < B; ++b)
        std::copy(part.begin() + b * C * row, part.begin() + (b + 1) * C * row,
                  x.begin() + (b * s.seq + chunk * C) * row);
    };
    std::vector<Buffer> qs, ks, vs, dos, outs, lses, dqs, dks, dvs;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      qs.push_back(put(dtype, {B, C, s.q_heads, s.dim}, rows_of(q, q_row, chunk)));
      ks.push_back(put(dtype, {B, C, s.kv_heads, s.dim}, rows_of(k, kv_row, chunk)));
      vs.push_back(put(dtype, {B, C, s.kv_heads, s.dim}, rows_of(v, kv_row, chunk)));
      dos.push_back(put(dtype, {B, C, s.q_heads, s.dim}, rows_of(dout, q_row, chunk)));
      outs.push_back(
          put(dtype, {B, C, s.q_heads, s.dim}, std::vector<float>(size_t(B * C * q_row))));
      lses.push_back(
          put(DType::f32, {B, s.q_heads, C}, std::vector<float>(size_t(B * s.q_heads * C))));
      dqs.push_back(
          put(dtype, {B, C, s.q_heads, s.dim}, std::vector<float>(size_t(B * C * q_row))));
      dks.push_back(
          put(dtype, {B, C, s.kv_heads, s.dim}, std::vector<float>(size_t(B * C * kv_row))));
      dvs.push_back(
          put(dtype, {B, C, s.kv_heads, s.dim}, std::vector<float>(size_t(B * C * kv_row))));
    }
    // Without documents the diagonal comes first, with them key chunk 0 (which some rows do
    // not see at all).
    for (int64_t qc = 0; qc < chunks; ++qc)
      for (int64_t step = 0; step <= qc; ++step) {
        const int64_t kc = s.starts.empty() ? qc - step : step;
        backend().attention_block_forward(outs[size_t(qc)], lses[size_t(qc)], qs[size_t(qc)],
                                          ks[size_t(kc)], vs[size_t(kc)], qc * C, kc * C, step > 0,
                                          documents);
      }
    for (int64_t qc = 0; qc < chunks; ++qc)
      for (int64_t kc = 0; kc <= qc; ++kc)
        backend().attention_block_backward(dqs[size_t(qc)], dks[size_t(kc)], dvs[size_t(kc)],
                                           dos[size_t(qc)], qs[size_t(qc)], ks[size_t(kc)],
                                           vs[size_t(kc)], outs[size_t(qc)], lses[size_t(qc)],
                                           qc * C, kc * C, documents);
    std::vector<float> out(q.size()), lse(size_t(B * s.q_heads * s.seq)), dq(q.size()),
        dk(k.size()), dv(v.size());
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      put_rows(out, q_row, chunk, get(outs[size_t(chunk)]));
      put_rows(dq, q_row, chunk, get(dqs[size_t(chunk)]));
      put_rows(dk, kv_row, chunk, get(dks[size_t(chunk)]));
      put_rows(dv, kv_row, chunk, get(dvs[size_t(chunk)]));
      const std::vector<float> chunk_lse = get(lses[size_t(chunk)]);  // [B·Hq, C]
      for (int64_t bh = 0; bh < B * s.q_heads; ++bh)
        std::copy(chunk_lse.begin() + bh * C, chunk_lse.begin() + (bh + 1) * C,
                  lse.begin() + bh * s.seq + chunk * C);
    }
    std::vector<double> expected_lse;
    const std::vector<double> expected =
        attention_reference(s, to_double(q), to_double(k), to_double(v), &expected_lse);
    EXPECT_LT(relative_error(out, expected), tolerance);
    EXPECT_LT(relative_error(lse, expected_lse), 1e-5);
    const size_t checks = 48;
    expect_gradient_matches(
        dq, to_double(q),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, p, to_double(k), to_double(v)), dout);
        },
        tolerance, "dq", checks);
    expect_gradient_matches(
        dk, to_double(k),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, to_double(q), p, to_double(v)), dout);
        },
        tolerance, "dk", checks);
    expect_gradient_matches(
        dv, to_double(v),
        [&](const std::vector<double>& p) {
          return weighted_sum(attention_reference(s, to_double(q), to_double(k), p), dout);
        },
        tolerance, "dv", checks);
  }
}

}  // namespace
}  // namespace ulysses
