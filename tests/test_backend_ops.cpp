// Every op of kernels/backend.h, table-driven (after ggml's test-backend-ops), in three
// columns: the cpu backend; the CUDA backend's hand-written kernels run on the host
// (tests/emulated_cuda_backend.h: same kernels, launch shapes and host-side plans, GEMMs on
// the cpu); and the CUDA backend on a real GPU, skipped with the reason where there is none
// (scripts/gpu-check.sh runs it on a GPU). Each op runs over its shapes (T = 1, sizes that
// are not multiples of a warp, a block or a 64-row tile, B > 1, GQA groups 1–4, head dims 16,
// 64 and 128) in f32 and, on the cuda columns, bf16. Forward results are checked against a
// double-precision reference on the same (bf16-rounded) inputs, gradients against central
// differences of that reference (tests/test_ops_common.h). No kernel uses atomics
// (docs/cuda.md, "Determinism"): every result is independent of block scheduling, and the
// tolerances below are those of the arithmetic alone. The attention rows are in
// tests/backend_ops_attention.cpp, the fixture in tests/backend_ops_testing.h, and the ops'
// refusals in tests/test_op_contracts.cpp.
//
// Mutation checks: each change below was made by hand in the kernel header, this test run on
// the cuda_kernels_on_host column, and the change reverted; every one failed the tests named.
//   cuda_norms_kernels.cuh        block_sum without its first __syncthreads: RmsNorm, LayerNorm
//   cuda_norms_kernels.cuh        rmsnorm_forward_kernel output loop to width - 1: RmsNorm
//   cuda_column_sums.cuh          column_partials_kernel chunk end one row short: Bias, RmsNorm,
//                                 LayerNorm
//   cuda_activations_kernels.cuh  rope_apply_kernel position row % T instead of
//                                 (row / H) % T: Rope
//   cuda_elementwise_kernels.cuh  axpy_kernel writing y[i + 1]: AxpyScaleCast
//   cuda_loss_kernels.cuh         loss_rows_kernel without the __syncthreads after the max:
//                                 LmHeadLoss
//   cuda_attention_kernels.cuh    attention_dkv_kernel query tiles from key_tile + 1: Attention
//                                 (seen with the FMA kernels, before the tensor-core ones)
//   cuda_attention_mma.cuh        warp_tile_pb with P's A registers 1 and 2 swapped: Attention
//   cuda_attention_mma.cuh        fragment_row 8·(i % 2) instead of 8·(i / 2): Attention
//   cuda_attention_mma.cuh        the forward without cp_async_wait: Attention
//   cuda_attention_mask.cuh       tiles_fully_visible with k_first <= q_first (the diagonal
//                                 tile left unmasked): Attention
//   cuda_attention_mask.cuh       key_visible without key >= query_start: Attention
//   cuda_attention_mask.cuh       document_end one short (the next start − 1): Attention
//   cuda_attention_mask.cuh       causal_last_key without the block's offset: AttentionBlocks
//   cuda_attention_mma.cuh        the forward's 1 / total for a row that saw no key (NaN,
//                                 which relative_error now counts as infinite): AttentionBlocks
//   cuda_attention_kernels.cuh    attention_merge_kernel without its guard for two −inf rows:
//                                 AttentionBlocks
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/backend_ops_testing.h"

namespace ulysses {
namespace {

using namespace backend_ops;

// ---- elementwise -------------------------------------------------------------------------

// Counts that cover one partial block, several blocks and not a multiple of 32.
const std::vector<int64_t> kCounts = {1, 37, 300};

// ---- data movement -----------------------------------------------------------------------

// upload and download round-trip every bit; copy moves a tensor, fill_zero clears one, and
// copy_2d moves a column band of rows between pitches, touching nothing else.
TEST_P(BackendOps, DataMovement) {
  for (DType dtype : float_dtypes())
    for (int64_t n : kCounts) {
      SCOPED_TRACE(describe(dtype, {n}));
      const std::vector<float> x = values(size_t(n), 11, dtype), y = values(size_t(n), 12, dtype);
      Buffer xb = put(dtype, {n}, x), yb = put(dtype, {n}, y);
      EXPECT_EQ(get(xb), x);
      backend().copy(yb, xb);
      EXPECT_EQ(get(yb), x);
      backend().fill_zero(xb);
      EXPECT_EQ(get(xb), std::vector<float>(size_t(n), 0.0f));
    }
  const int64_t rows = 37, src_width = 5, dst_width = 7, band = 3;
  const std::vector<float> src = values(size_t(rows * src_width), 13, DType::f32);
  const std::vector<float> dst = values(size_t(rows * dst_width), 14, DType::f32);
  Buffer src_buffer = put(DType::f32, {rows, src_width}, src);
  Buffer dst_buffer = put(DType::f32, {rows, dst_width}, dst);
  const int64_t bytes = int64_t(sizeof(float));
  backend().copy_2d(static_cast<float*>(dst_buffer.tensor().data) + 2, dst_width * bytes,
                    static_cast<const float*>(src_buffer.tensor().data) + 1, src_width * bytes,
                    band * bytes, rows);
  std::vector<float> expected = dst;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t column = 0; column < band; ++column)
      expected[size_t(row * dst_width + 2 + column)] = src[size_t(row * src_width + 1 + column)];
  EXPECT_EQ(get(dst_buffer), expected);
}

TEST_P(BackendOps, AxpyScaleCast) {
  for (DType dtype : float_dtypes())
    for (int64_t n : kCounts) {
      SCOPED_TRACE(describe(dtype, {n}));
      const std::vector<float> x = values(size_t(n), 1, dtype), y = values(size_t(n), 2, dtype);
      Buffer xb = put(dtype, {n}, x), yb = put(dtype, {n}, y);
      backend().axpy(yb, xb, 0.5f);
      std::vector<double> expected(static_cast<size_t>(n));
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = y[i] + 0.5 * x[i];
      EXPECT_LT(relative_error(get(yb), expected), forward_tolerance(dtype));
      backend().scale(xb, -3.0f);
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = -3.0 * x[i];
      EXPECT_LT(relative_error(get(xb), expected), forward_tolerance(dtype));

      // f32 -> bf16 -> f32 rounds to nearest even, exactly as the host conversion.
      const std::vector<float> wide = values(size_t(n), 3, DType::f32);
      Buffer source = put(DType::f32, {n}, wide), narrow = put(DType::bf16, {n}, wide),
             back = put(DType::f32, {n}, wide);
      backend().cast(narrow, source);
      backend().cast(back, narrow);
      const std::vector<float> round_trip = get(back);
      for (size_t i = 0; i < wide.size(); ++i)
        ASSERT_EQ(round_trip[i], round_to(DType::bf16, wide[i])) << "element " << i;
    }
}

TEST_P(BackendOps, SumSquares) {
  for (DType dtype : float_dtypes())
    for (int64_t n : {int64_t(1), int64_t(300), int64_t(262145)}) {
      SCOPED_TRACE(describe(dtype, {n}));
      const std::vector<float> x = values(size_t(n), 4, dtype);
      double expected = 0.0;
      for (float value : x) expected += double(value) * value;
      EXPECT_NEAR(backend().sum_squares(put(dtype, {n}, x)), expected, 1e-9 * expected);
    }
}

TEST_P(BackendOps, Gemm) {
  struct Case {
    int64_t m, n, k;
    bool trans_a, trans_b;
  };
  for (DType dtype : float_dtypes())
    for (const Case& c : {Case{1, 1, 1, false, false}, Case{17, 33, 40, false, true},
                          Case{5, 64, 19, true, false}, Case{9, 7, 70, true, true}}) {
      SCOPED_TRACE(describe(dtype, {c.m, c.n, c.k, c.trans_a, c.trans_b}));
      const std::vector<float> a = values(size_t(c.m * c.k), 5, dtype);
      const std::vector<float> b = values(size_t(c.k * c.n), 6, dtype);
      const std::vector<float> c0 = values(size_t(c.m * c.n), 7, DType::f32);
      Buffer ab = c.trans_a ? put(dtype, {c.k, c.m}, a) : put(dtype, {c.m, c.k}, a);
      Buffer bb = c.trans_b ? put(dtype, {c.n, c.k}, b) : put(dtype, {c.k, c.n}, b);
      Buffer cb = put(DType::f32, {c.m, c.n}, c0);
      backend().gemm(ab, c.trans_a, bb, c.trans_b, cb, 0.5f, 1.0f);
      std::vector<double> expected(c0.size());
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = 0.0;
          for (int64_t p = 0; p < c.k; ++p)
            sum += double(c.trans_a ? a[p * c.m + i] : a[i * c.k + p]) *
                   (c.trans_b ? b[j * c.k + p] : b[p * c.n + j]);
          expected[i * c.n + j] = 0.5 * sum + c0[i * c.n + j];
        }
      EXPECT_LT(relative_error(get(cb), expected), 1e-5);
    }
}

// ---- rows: bias and norms ----------------------------------------------------------------

struct RowShape {
  int64_t batch, seq, width;
};
// T = 1; widths under, at and over the 256 threads of a block; 140 rows: three column chunks
// of 64 rows (kernels/cuda/cuda_column_sums.cuh).
const std::vector<RowShape> kRowShapes = {{1, 1, 16}, {2, 17, 64}, {3, 5, 300}, {2, 70, 24}};

TEST_P(BackendOps, Bias) {
  for (DType dtype : float_dtypes())
    for (const RowShape& s : kRowShapes) {
      SCOPED_TRACE(describe(dtype, {s.batch, s.seq, s.width}));
      const int64_t rows = s.batch * s.seq, C = s.width;
      const std::vector<float> out = values(size_t(rows * C), 8, dtype);
      const std::vector<float> bias = values(size_t(C), 9, dtype);
      Buffer out_b = put(dtype, {rows, C}, out);
      backend().bias_forward(out_b, put(dtype, {C}, bias));
      std::vector<double> expected(out.size());
      for (int64_t i = 0; i < rows * C; ++i) expected[i] = out[i] + double(bias[i % C]);
      EXPECT_LT(relative_error(get(out_b), expected), forward_tolerance(dtype));

      // dbias += Σ rows: the gradient of Σ dout ∘ (x + bias), on top of what dbias held.
      const std::vector<float> dout = values(size_t(rows * C), 10, dtype);
      const std::vector<float> dbias0 = values(size_t(C), 11, DType::f32);
      Buffer dbias = put(DType::f32, {C}, dbias0);
      backend().bias_backward(dbias, put(dtype, {rows, C}, dout));
      std::vector<float> added = get(dbias);
      for (int64_t j = 0; j < C; ++j) added[j] -= dbias0[j];
      const ScalarFunction loss = [&](const std::vector<double>& b) {
        double sum = 0.0;
        for (int64_t i = 0; i < rows * C; ++i) sum += double(dout[i]) * (out[i] + b[i % C]);
        return sum;
      };
      expect_gradient_matches(added, to_double(bias), loss, gradient_tolerance(DType::f32),
                              "dbias");
    }
}

std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                      int64_t width, float eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double sum_sq = 0.0;
    for (int64_t j = 0; j < width; ++j) sum_sq += x[r * width + j] * x[r * width + j];
    const double rstd = 1.0 / std::sqrt(sum_sq / double(width) + double(eps));
    for (int64_t j = 0; j < width; ++j) out[r * width + j] = x[r * width + j] * rstd * w[j];
  }
  return out;
}

std::vector<double> layernorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                        const std::vector<double>& bias, int64_t width, float eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < width; ++j) mean += x[r * width + j];
    mean /= double(width);
    for (int64_t j = 0; j < width; ++j)
      var += (x[r * width + j] - mean) * (x[r * width + j] - mean);
    const double rstd = 1.0 / std::sqrt(var / double(width) + double(eps));
    for (int64_t j = 0; j < width; ++j)
      out[r * width + j] = (x[r * width + j] - mean) * rstd * w[j] + bias[j];
  }
  return out;
}

// The part of `after` that an op added to `before`.
std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> difference(after.size());
  for (size_t i = 0; i < after.size(); ++i) difference[i] = after[i] - before[i];
  return difference;
}

TEST_P(BackendOps, RmsNorm) {
  const float eps = 1e-5f;
  for (DType dtype : float_dtypes())
    for (const RowShape& s : kRowShapes) {
      SCOPED_TRACE(describe(dtype, {s.batch, s.seq, s.width}));
      const int64_t rows = s.batch * s.seq, C = s.width;
      const std::vector<float> x = values(size_t(rows * C), 12, dtype);
      const std::vector<float> w = values(size_t(C), 13, dtype);
      const std::vector<float> dout = values(size_t(rows * C), 14, dtype);
      Buffer xb = put(dtype, {rows, C}, x), wb = put(dtype, {C}, w);
      Buffer out = put(dtype, {rows, C}, std::vector<float>(x.size()));
      Buffer rstd = put(DType::f32, {rows}, std::vector<float>(size_t(rows)));
      backend().rmsnorm_forward(out, rstd, xb, wb, eps);
      EXPECT_LT(relative_error(get(out), rmsnorm_reference(to_double(x), to_double(w), C, eps)),
                forward_tolerance(dtype));

      // dx and dweight accumulate: start them from non-zero values.
      const std::vector<float> dx0 = values(x.size(), 15, dtype),
                               dw0 = values(w.size(), 16, DType::f32);
      Buffer dx = put(dtype, {rows, C}, dx0), dw = put(DType::f32, {C}, dw0);
      backend().rmsnorm_backward(dx, dw, put(dtype, {rows, C}, dout), xb, wb, rstd);
      const ScalarFunction loss_x = [&](const std::vector<double>& p) {
        return weighted_sum(rmsnorm_reference(p, to_double(w), C, eps), dout);
      };
      const ScalarFunction loss_w = [&](const std::vector<double>& p) {
        return weighted_sum(rmsnorm_reference(to_double(x), p, C, eps), dout);
      };
      expect_gradient_matches(added(get(dx), dx0), to_double(x), loss_x, gradient_tolerance(dtype),
                              "rmsnorm dx");
      expect_gradient_matches(added(get(dw), dw0), to_double(w), loss_w, gradient_tolerance(dtype),
                              "rmsnorm dweight");
    }
}

TEST_P(BackendOps, LayerNorm) {
  const float eps = 1e-5f;
  for (DType dtype : float_dtypes())
    for (const RowShape& s : kRowShapes) {
      SCOPED_TRACE(describe(dtype, {s.batch, s.seq, s.width}));
      const int64_t rows = s.batch * s.seq, C = s.width;
      const std::vector<float> x = values(size_t(rows * C), 17, dtype);
      const std::vector<float> w = values(size_t(C), 18, dtype), b = values(size_t(C), 19, dtype);
      const std::vector<float> dout = values(size_t(rows * C), 20, dtype);
      Buffer xb = put(dtype, {rows, C}, x), wb = put(dtype, {C}, w), bb = put(dtype, {C}, b);
      Buffer out = put(dtype, {rows, C}, std::vector<float>(x.size()));
      Buffer mean = put(DType::f32, {rows}, std::vector<float>(size_t(rows)));
      Buffer rstd = put(DType::f32, {rows}, std::vector<float>(size_t(rows)));
      backend().layernorm_forward(out, mean, rstd, xb, wb, bb, eps);
      EXPECT_LT(relative_error(get(out), layernorm_reference(to_double(x), to_double(w),
                                                             to_double(b), C, eps)),
                forward_tolerance(dtype));

      const std::vector<float> dx0 = values(x.size(), 21, dtype);
      const std::vector<float> dw0 = values(w.size(), 22, DType::f32);
      const std::vector<float> db0 = values(b.size(), 23, DType::f32);
      Buffer dx = put(dtype, {rows, C}, dx0), dw = put(DType::f32, {C}, dw0),
             db = put(DType::f32, {C}, db0);
      backend().layernorm_backward(dx, dw, db, put(dtype, {rows, C}, dout), xb, wb, mean, rstd);
      auto loss = [&](const std::vector<double>& px, const std::vector<double>& pw,
                      const std::vector<double>& pb) {
        return weighted_sum(layernorm_reference(px, pw, pb, C, eps), dout);
      };
      expect_gradient_matches(
          added(get(dx), dx0), to_double(x),
          [&](const std::vector<double>& p) { return loss(p, to_double(w), to_double(b)); },
          gradient_tolerance(dtype), "layernorm dx");
      expect_gradient_matches(
          added(get(dw), dw0), to_double(w),
          [&](const std::vector<double>& p) { return loss(to_double(x), p, to_double(b)); },
          gradient_tolerance(dtype), "layernorm dweight");
      expect_gradient_matches(
          added(get(db), db0), to_double(b),
          [&](const std::vector<double>& p) { return loss(to_double(x), to_double(w), p); },
          gradient_tolerance(dtype), "layernorm dbias");
    }
}

// ---- embedding ---------------------------------------------------------------------------

TEST_P(BackendOps, Embedding) {
  struct Case {
    int64_t batch, seq, width, vocab, positions, pos_offset;  // positions 0: no wpe (llama)
  };
  for (DType dtype : float_dtypes())
    for (const Case& c : {Case{1, 1, 16, 5, 0, 0}, Case{2, 17, 40, 11, 0, 0},
                          Case{2, 17, 40, 11, 23, 3}, Case{1, 70, 300, 3, 80, 10}}) {
      SCOPED_TRACE(describe(dtype, {c.batch, c.seq, c.width, c.vocab, c.positions}));
      const int64_t n = c.batch * c.seq, C = c.width;
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) tokens[i] = int32_t((i * 7 + i / 3) % c.vocab);
      const std::vector<float> wte = values(size_t(c.vocab * C), 24, dtype);
      const std::vector<float> wpe =
          values(size_t(std::max<int64_t>(c.positions, 1) * C), 25, dtype);
      Buffer tokens_b = put_i32({c.batch, c.seq}, tokens);
      Buffer wte_b = put(dtype, {c.vocab, C}, wte);
      Buffer wpe_b = c.positions ? put(dtype, {c.positions, C}, wpe) : Buffer();
      const Tensor wpe_t = c.positions ? wpe_b.tensor() : Tensor();
      Buffer out = put(dtype, {n, C}, std::vector<float>(size_t(n * C)));
      backend().embedding_forward(out, tokens_b, wte_b, wpe_t, c.pos_offset);
      auto reference = [&](const std::vector<double>& te, const std::vector<double>& pe) {
        std::vector<double> result(static_cast<size_t>(n * C));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < C; ++j)
            result[i * C + j] = te[tokens[i] * C + j] +
                                (c.positions ? pe[(c.pos_offset + i % c.seq) * C + j] : 0.0);
        return result;
      };
      EXPECT_LT(relative_error(get(out), reference(to_double(wte), to_double(wpe))),
                forward_tolerance(dtype));

      const std::vector<float> dout = values(size_t(n * C), 26, dtype);
      const std::vector<float> dwte0 = values(wte.size(), 27, DType::f32);
      const std::vector<float> dwpe0 = values(wpe.size(), 28, DType::f32);
      Buffer dwte = put(DType::f32, {c.vocab, C}, dwte0);
      Buffer dwpe = c.positions ? put(DType::f32, {c.positions, C}, dwpe0) : Buffer();
      backend().embedding_backward(dwte, c.positions ? dwpe.tensor() : Tensor(),
                                   put(dtype, {n, C}, dout), tokens_b, c.pos_offset);
      expect_gradient_matches(
          added(get(dwte), dwte0), to_double(wte),
          [&](const std::vector<double>& p) {
            return weighted_sum(reference(p, to_double(wpe)), dout);
          },
          gradient_tolerance(DType::f32), "dwte");
      if (c.positions)
        expect_gradient_matches(
            added(get(dwpe), dwpe0), to_double(wpe),
            [&](const std::vector<double>& p) {
              return weighted_sum(reference(to_double(wte), p), dout);
            },
            gradient_tolerance(DType::f32), "dwpe");
    }
}

// ---- RoPE, SwiGLU, GELU ------------------------------------------------------------------

TEST_P(BackendOps, Rope) {
  struct Case {
    int64_t batch, seq, heads, dim, pos_offset;
  };
  const float theta = 10000.0f;
  for (DType dtype : float_dtypes())
    for (const Case& c :
         {Case{1, 1, 1, 16, 0}, Case{2, 17, 3, 64, 5}, Case{1, 5, 2, 128, 100000}}) {
      SCOPED_TRACE(describe(dtype, {c.batch, c.seq, c.heads, c.dim, c.pos_offset}));
      const int64_t n = c.batch * c.seq * c.heads * c.dim, half = c.dim / 2;
      auto reference = [&](const std::vector<double>& x) {
        std::vector<double> out(x.size());
        for (int64_t row = 0; row < n / c.dim; ++row) {
          const int64_t t = (row / c.heads) % c.seq;
          for (int64_t i = 0; i < half; ++i) {
            const double angle = double(c.pos_offset + t) *
                                 std::pow(double(theta), -2.0 * double(i) / double(c.dim));
            const double a = x[row * c.dim + i], b = x[row * c.dim + i + half];
            out[row * c.dim + i] = a * std::cos(angle) - b * std::sin(angle);
            out[row * c.dim + i + half] = b * std::cos(angle) + a * std::sin(angle);
          }
        }
        return out;
      };
      const std::vector<float> x = values(size_t(n), 29, dtype);
      Buffer xb = put(dtype, {c.batch, c.seq, c.heads, c.dim}, x);
      backend().rope(xb, c.pos_offset, theta, false);
      EXPECT_LT(relative_error(get(xb), reference(to_double(x))), forward_tolerance(dtype));
      // The inverse rotation is the backward: applied to dout it gives the gradient.
      const std::vector<float> dout = values(size_t(n), 30, dtype);
      Buffer grad = put(dtype, {c.batch, c.seq, c.heads, c.dim}, dout);
      backend().rope(grad, c.pos_offset, theta, true);
      expect_gradient_matches(
          get(grad), to_double(x),
          [&](const std::vector<double>& p) { return weighted_sum(reference(p), dout); },
          gradient_tolerance(dtype), "rope inverse");
    }
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_P(BackendOps, SwiGlu) {
  for (DType dtype : float_dtypes())
    for (int64_t n : kCounts) {
      SCOPED_TRACE(describe(dtype, {n}));
      const std::vector<float> gate = values(size_t(n), 31, dtype, 4.0f);
      const std::vector<float> up = values(size_t(n), 32, dtype);
      const std::vector<float> dout = values(size_t(n), 33, dtype);
      auto reference = [&](const std::vector<double>& g, const std::vector<double>& u) {
        std::vector<double> out(g.size());
        for (size_t i = 0; i < g.size(); ++i) out[i] = silu(g[i]) * u[i];
        return out;
      };
      Buffer gate_b = put(dtype, {n}, gate), up_b = put(dtype, {n}, up);
      Buffer out = put(dtype, {n}, std::vector<float>(size_t(n)));
      backend().swiglu_forward(out, gate_b, up_b);
      EXPECT_LT(relative_error(get(out), reference(to_double(gate), to_double(up))),
                forward_tolerance(dtype));
      // dout in the memory of dgate, as the interface allows.
      Buffer dgate = put(dtype, {n}, dout), dup = put(dtype, {n}, std::vector<float>(size_t(n)));
      backend().swiglu_backward(dgate, dup, dgate, gate_b, up_b);
      expect_gradient_matches(
          get(dgate), to_double(gate),
          [&](const std::vector<double>& p) {
            return weighted_sum(reference(p, to_double(up)), dout);
          },
          gradient_tolerance(dtype), "dgate");
      expect_gradient_matches(
          get(dup), to_double(up),
          [&](const std::vector<double>& p) {
            return weighted_sum(reference(to_double(gate), p), dout);
          },
          gradient_tolerance(dtype), "dup");
      // Fully in place, as the tiled MLP's backward runs it: dgate over gate, dup over up.
      Buffer gate_in_place = put(dtype, {n}, gate), up_in_place = put(dtype, {n}, up);
      Buffer dout_b = put(dtype, {n}, dout);
      backend().swiglu_backward(gate_in_place, up_in_place, dout_b, gate_in_place, up_in_place);
      EXPECT_EQ(get(gate_in_place), get(dgate)) << "dgate written over gate";
      EXPECT_EQ(get(up_in_place), get(dup)) << "dup written over up";
    }
}

TEST_P(BackendOps, Gelu) {
  for (DType dtype : float_dtypes())
    for (int64_t n : kCounts) {
      SCOPED_TRACE(describe(dtype, {n}));
      const std::vector<float> x = values(size_t(n), 34, dtype, 4.0f);
      const std::vector<float> dout = values(size_t(n), 35, dtype);
      auto reference = [](const std::vector<double>& p) {
        std::vector<double> out(p.size());
        for (size_t i = 0; i < p.size(); ++i) out[i] = gelu(p[i]);
        return out;
      };
      Buffer xb = put(dtype, {n}, x), out = put(dtype, {n}, std::vector<float>(size_t(n)));
      backend().gelu_forward(out, xb);
      EXPECT_LT(relative_error(get(out), reference(to_double(x))), forward_tolerance(dtype));
      Buffer dx = put(dtype, {n}, dout);  // dx in the memory of dout
      backend().gelu_backward(dx, dx, xb);
      expect_gradient_matches(
          get(dx), to_double(x),
          [&](const std::vector<double>& p) { return weighted_sum(reference(p), dout); },
          gradient_tolerance(dtype), "gelu dx");
    }
}

// ---- LM head + loss ----------------------------------------------------------------------

TEST_P(BackendOps, LmHeadLoss) {
  struct Case {
    int64_t rows, width, vocab, tile;
  };
  const float grad_scale = 0.25f;
  for (DType dtype : float_dtypes())
    for (const Case& c : {Case{1, 16, 7, 1}, Case{37, 24, 300, 16}, Case{20, 64, 33, 64}}) {
      SCOPED_TRACE(describe(dtype, {c.rows, c.width, c.vocab, c.tile}));
      const std::vector<float> hidden = values(size_t(c.rows * c.width), 40, dtype, 2.0f);
      const std::vector<float> weight = values(size_t(c.vocab * c.width), 41, dtype);
      std::vector<int32_t> targets(static_cast<size_t>(c.rows));
      for (int64_t r = 0; r < c.rows; ++r)
        targets[r] = r % 5 == 3 ? -1 : int32_t((r * 13 + 2) % c.vocab);  // some rows not counted
      auto reference = [&](const std::vector<double>& h, const std::vector<double>& w,
                           int64_t* count, int64_t* correct) {
        double loss = 0.0;
        for (int64_t r = 0; r < c.rows; ++r) {
          if (targets[r] < 0) continue;
          std::vector<double> logits(static_cast<size_t>(c.vocab));
          int64_t best = 0;
          for (int64_t v = 0; v < c.vocab; ++v) {
            for (int64_t j = 0; j < c.width; ++j)
              logits[v] += h[r * c.width + j] * w[v * c.width + j];
            if (logits[v] > logits[best]) best = v;
          }
          const double max_logit = logits[best];
          double sum = 0.0;
          for (double logit : logits) sum += std::exp(logit - max_logit);
          loss += max_logit + std::log(sum) - logits[targets[r]];
          if (count) ++*count;
          if (correct) *correct += best == targets[r];
        }
        return loss;
      };
      Buffer hb = put(dtype, {c.rows, c.width}, hidden),
             wb = put(dtype, {c.vocab, c.width}, weight);
      Buffer tb = put_i32({c.rows}, targets);
      Buffer dhidden = put(dtype, {c.rows, c.width}, values(hidden.size(), 42, dtype));
      const std::vector<float> dweight0 = values(weight.size(), 43, DType::f32);
      Buffer dweight = put(DType::f32, {c.vocab, c.width}, dweight0);
      const LossResult result =
          backend().lm_head_loss(hb, wb, tb, c.tile, grad_scale, dhidden, dweight);
      int64_t count = 0, correct = 0;
      const double expected = reference(to_double(hidden), to_double(weight), &count, &correct);
      EXPECT_NEAR(result.loss_sum, expected, 1e-5 * std::abs(expected));
      EXPECT_EQ(result.count, count);
      EXPECT_EQ(result.correct, correct);
      std::vector<float> dh = get(dhidden);
      for (int64_t r = 0; r < c.rows; ++r)
        if (targets[r] < 0)
          for (int64_t j = 0; j < c.width; ++j) ASSERT_EQ(dh[r * c.width + j], 0.0f) << "row " << r;
      expect_gradient_matches(
          dh, to_double(hidden),
          [&](const std::vector<double>& p) {
            return grad_scale * reference(p, to_double(weight), nullptr, nullptr);
          },
          gradient_tolerance(dtype), "dhidden");
      expect_gradient_matches(
          added(get(dweight), dweight0), to_double(weight),
          [&](const std::vector<double>& p) {
            return grad_scale * reference(to_double(hidden), p, nullptr, nullptr);
          },
          gradient_tolerance(dtype), "dweight");
    }
}

// ---- AdamW -------------------------------------------------------------------------------

TEST_P(BackendOps, AdamW) {
  for (int64_t n : kCounts) {
    SCOPED_TRACE(describe(DType::f32, {n}));
    const std::vector<float> p0 = values(size_t(n), 44, DType::f32);
    const std::vector<float> g = values(size_t(n), 45, DType::f32);
    Buffer p = put(DType::f32, {n}, p0), gb = put(DType::f32, {n}, g);
    Buffer m = put(DType::f32, {n}, std::vector<float>(size_t(n)));
    Buffer v = put(DType::f32, {n}, std::vector<float>(size_t(n)));
    AdamWStep step;
    step.lr = 1e-2f;
    step.weight_decay = 0.1f;
    step.grad_scale = 0.5f;
    // PyTorch's AdamW in double, two steps with the same gradient.
    std::vector<double> param = to_double(p0), m_ref(static_cast<size_t>(n)),
                        v_ref(static_cast<size_t>(n));
    for (int64_t s = 1; s <= 2; ++s) {
      step.step = s;
      backend().adamw(p, gb, m, v, step);
      for (int64_t i = 0; i < n; ++i) {
        const double grad = double(step.grad_scale) * g[i];
        param[i] *= 1.0 - double(step.lr) * double(step.weight_decay);
        m_ref[i] = step.beta1 * m_ref[i] + (1.0 - step.beta1) * grad;
        v_ref[i] = step.beta2 * v_ref[i] + (1.0 - step.beta2) * grad * grad;
        const double m_hat = m_ref[i] / (1.0 - std::pow(double(step.beta1), double(s)));
        const double v_hat = v_ref[i] / (1.0 - std::pow(double(step.beta2), double(s)));
        param[i] -= step.lr * m_hat / (std::sqrt(v_hat) + step.eps);
      }
    }
    std::vector<double> change(static_cast<size_t>(n));
    std::vector<float> actual_change = get(p);
    for (int64_t i = 0; i < n; ++i) {
      change[i] = param[i] - p0[i];
      actual_change[i] -= p0[i];
    }
    EXPECT_LT(relative_error(actual_change, change), 1e-4);
    EXPECT_LT(relative_error(get(m), m_ref), 1e-6);
    EXPECT_LT(relative_error(get(v), v_ref), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Columns, BackendOps,
                         ::testing::Values(Column::cpu, Column::emulated_cuda, Column::gpu),
                         [](const ::testing::TestParamInfo<Column>& info) {
                           return column_name(info.param);
                         });

// The test of each op of kernels/op_table.h. A row added to the table fails here until its
// test is named, and a name here fails if no such test runs in BackendOps (both seen: the
// copy_2d row removed from the list, and Gemm misspelt).
TEST(OpTable, EveryOpHasItsTest) {
  const std::map<std::string, std::string> test_of_op = {
      {"upload", "DataMovement"},
      {"download", "DataMovement"},
      {"copy", "DataMovement"},
      {"cast", "AxpyScaleCast"},
      {"fill_zero", "DataMovement"},
      {"copy_2d", "DataMovement"},
      {"axpy", "AxpyScaleCast"},
      {"scale", "AxpyScaleCast"},
      {"sum_squares", "SumSquares"},
      {"gemm", "Gemm"},
      {"bias_forward", "Bias"},
      {"bias_backward", "Bias"},
      {"embedding_forward", "Embedding"},
      {"embedding_backward", "Embedding"},
      {"rmsnorm_forward", "RmsNorm"},
      {"rmsnorm_backward", "RmsNorm"},
      {"layernorm_forward", "LayerNorm"},
      {"layernorm_backward", "LayerNorm"},
      {"rope", "Rope"},
      {"swiglu_forward", "SwiGlu"},
      {"swiglu_backward", "SwiGlu"},
      {"gelu_forward", "Gelu"},
      {"gelu_backward", "Gelu"},
      {"attention_forward", "Attention"},
      {"attention_backward", "Attention"},
      {"attention_block_forward", "AttentionBlocksAddUpToTheWholeAttention"},
      {"attention_block_backward", "AttentionBlocksAddUpToTheWholeAttention"},
      {"lm_head_loss", "LmHeadLoss"},
      {"adamw", "AdamW"},
  };
  std::set<std::string> tests_run;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int suite = 0; suite < unit.total_test_suite_count(); ++suite) {
    const ::testing::TestSuite& test_suite = *unit.GetTestSuite(suite);
    if (std::string(test_suite.name()) != "Columns/BackendOps") continue;
    for (int test = 0; test < test_suite.total_test_count(); ++test) {
      const std::string name = test_suite.GetTestInfo(test)->name();
      tests_run.insert(name.substr(0, name.find('/')));
    }
  }
  std::set<std::string> ops;
  for (const char* op : kBackendOpNames) {
    ops.insert(op);
    const auto test = test_of_op.find(op);
    if (test == test_of_op.end()) {
      ADD_FAILURE() << "op " << op << " has no test in BackendOps";
      continue;
    }
    EXPECT_EQ(tests_run.count(test->second), 1u) << op << "'s test " << test->second;
  }
  for (const auto& [op, test] : test_of_op) EXPECT_EQ(ops.count(op), 1u) << op << " is no op";
}

}  // namespace
}  // namespace ulysses
