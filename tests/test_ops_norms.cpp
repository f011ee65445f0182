// CpuBackend: RMSNorm, LayerNorm, RoPE, SwiGLU, GELU and embeddings against double-precision
// references; backward passes against central finite differences of those references.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_ops_common.h"

namespace ulysses {
namespace {

using ops_test::expect_gradient_matches;
using ops_test::make_f32;
using ops_test::make_i32;
using ops_test::random_floats;
using ops_test::read_f32;
using ops_test::relative_error;
using ops_test::to_double;
using ops_test::weighted_sum;

constexpr double kForwardTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-4;

// Returns after - before: what an op that accumulates (+=) added.
std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> difference(after.size());
  for (size_t i = 0; i < after.size(); ++i) difference[i] = after[i] - before[i];
  return difference;
}

// ---- RMSNorm -------------------------------------------------------------------------------

std::vector<double> reference_rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                                      int64_t rows, int64_t width, double eps,
                                      std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0.0;
    for (int64_t j = 0; j < width; ++j) sum_sq += x[r * width + j] * x[r * width + j];
    const double row_rstd = 1.0 / std::sqrt(sum_sq / double(width) + eps);
    if (rstd) rstd->push_back(row_rstd);
    for (int64_t j = 0; j < width; ++j) out[r * width + j] = x[r * width + j] * row_rstd * w[j];
  }
  return out;
}

TEST(CpuRmsNorm, ForwardAndBackward) {
  CpuBackend backend;
  const int64_t rows = 6, width = 72;  // two column blocks in the weight reduction
  const float eps = 1e-5f;
  const std::vector<float> x = random_floats(size_t(rows * width), 1, -2.0f, 2.0f);
  const std::vector<float> w = random_floats(size_t(width), 2, 0.5f, 1.5f);
  const std::vector<float> dout = random_floats(size_t(rows * width), 3);
  const std::vector<float> dx_start = random_floats(size_t(rows * width), 4);
  const std::vector<float> dw_start = random_floats(size_t(width), 5);

  Buffer xb = make_f32(backend, {rows, width}, x);
  Buffer wb = make_f32(backend, {width}, w);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {rows, width}, "out");
  Buffer rstd = backend.alloc(MemCategory::activations, DType::f32, {rows}, "rstd");
  backend.rmsnorm_forward(out, rstd, xb, wb, eps);
  std::vector<double> expected_rstd;
  const std::vector<double> expected =
      reference_rmsnorm(to_double(x), to_double(w), rows, width, eps, &expected_rstd);
  EXPECT_LT(relative_error(read_f32(backend, out), expected), kForwardTolerance);
  EXPECT_LT(relative_error(read_f32(backend, rstd), expected_rstd), kForwardTolerance);

  Buffer dx = make_f32(backend, {rows, width}, dx_start);
  Buffer dw = make_f32(backend, {width}, dw_start);
  Buffer db = make_f32(backend, {rows, width}, dout);
  backend.rmsnorm_backward(dx, dw, db, xb, wb, rstd);
  auto loss_x = [&](const std::vector<double>& xs) {
    return weighted_sum(reference_rmsnorm(xs, to_double(w), rows, width, eps), dout);
  };
  auto loss_w = [&](const std::vector<double>& ws) {
    return weighted_sum(reference_rmsnorm(to_double(x), ws, rows, width, eps), dout);
  };
  expect_gradient_matches(added(read_f32(backend, dx), dx_start), to_double(x), loss_x,
                          kGradientTolerance, "rmsnorm dx");
  expect_gradient_matches(added(read_f32(backend, dw), dw_start), to_double(w), loss_w,
                          kGradientTolerance, "rmsnorm dweight");
}

// ---- LayerNorm -----------------------------------------------------------------------------

std::vector<double> reference_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                        const std::vector<double>& bias, int64_t rows,
                                        int64_t width, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < width; ++j) mean += x[r * width + j];
    mean /= double(width);
    for (int64_t j = 0; j < width; ++j)
      var += (x[r * width + j] - mean) * (x[r * width + j] - mean);
    const double rstd = 1.0 / std::sqrt(var / double(width) + eps);
    for (int64_t j = 0; j < width; ++j)
      out[r * width + j] = (x[r * width + j] - mean) * rstd * w[j] + bias[j];
  }
  return out;
}

TEST(CpuLayerNorm, ForwardAndBackward) {
  CpuBackend backend;
  const int64_t rows = 5, width = 72;
  const float eps = 1e-5f;
  const std::vector<float> x = random_floats(size_t(rows * width), 11, -1.0f, 3.0f);
  const std::vector<float> w = random_floats(size_t(width), 12, 0.5f, 1.5f);
  const std::vector<float> bias = random_floats(size_t(width), 13);
  const std::vector<float> dout = random_floats(size_t(rows * width), 14);
  const std::vector<float> dx_start = random_floats(size_t(rows * width), 15);
  const std::vector<float> dw_start = random_floats(size_t(width), 16);
  const std::vector<float> dbias_start = random_floats(size_t(width), 17);

  Buffer xb = make_f32(backend, {rows, width}, x);
  Buffer wb = make_f32(backend, {width}, w);
  Buffer bb = make_f32(backend, {width}, bias);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {rows, width}, "out");
  Buffer mean = backend.alloc(MemCategory::activations, DType::f32, {rows}, "mean");
  Buffer rstd = backend.alloc(MemCategory::activations, DType::f32, {rows}, "rstd");
  backend.layernorm_forward(out, mean, rstd, xb, wb, bb, eps);
  EXPECT_LT(relative_error(
                read_f32(backend, out),
                reference_layernorm(to_double(x), to_double(w), to_double(bias), rows, width, eps)),
            kForwardTolerance);

  Buffer dx = make_f32(backend, {rows, width}, dx_start);
  Buffer dw = make_f32(backend, {width}, dw_start);
  Buffer dbias = make_f32(backend, {width}, dbias_start);
  Buffer db = make_f32(backend, {rows, width}, dout);
  backend.layernorm_backward(dx, dw, dbias, db, xb, wb, mean, rstd);
  auto loss_x = [&](const std::vector<double>& xs) {
    return weighted_sum(reference_layernorm(xs, to_double(w), to_double(bias), rows, width, eps),
                        dout);
  };
  auto loss_w = [&](const std::vector<double>& ws) {
    return weighted_sum(reference_layernorm(to_double(x), ws, to_double(bias), rows, width, eps),
                        dout);
  };
  auto loss_b = [&](const std::vector<double>& bs) {
    return weighted_sum(reference_layernorm(to_double(x), to_double(w), bs, rows, width, eps),
                        dout);
  };
  expect_gradient_matches(added(read_f32(backend, dx), dx_start), to_double(x), loss_x,
                          kGradientTolerance, "layernorm dx");
  expect_gradient_matches(added(read_f32(backend, dw), dw_start), to_double(w), loss_w,
                          kGradientTolerance, "layernorm dweight");
  expect_gradient_matches(added(read_f32(backend, dbias), dbias_start), to_double(bias), loss_b,
                          kGradientTolerance, "layernorm dbias");
}

// dx may be dout's own buffer (backend.h): the result is then what a separate dx that started
// as a copy of dout receives, bit for bit, and the weight gradients see the incoming dout.
TEST(CpuNorms, BackwardIntoDoutsOwnBuffer) {
  CpuBackend backend;
  const int64_t rows = 5, width = 40;
  const std::vector<float> x = random_floats(size_t(rows * width), 1, -2.0f, 2.0f);
  const std::vector<float> w = random_floats(size_t(width), 2, 0.5f, 1.5f);
  const std::vector<float> dout = random_floats(size_t(rows * width), 3);
  Buffer xb = make_f32(backend, {rows, width}, x);
  Buffer wb = make_f32(backend, {width}, w);
  Buffer bias = make_f32(backend, {width}, std::vector<float>(size_t(width), 0.0f));
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {rows, width}, "out");
  Buffer mean = backend.alloc(MemCategory::activations, DType::f32, {rows}, "mean");
  Buffer rstd = backend.alloc(MemCategory::activations, DType::f32, {rows}, "rstd");
  const std::vector<float> zeros(size_t(width), 0.0f);
  for (bool layer : {false, true}) {
    SCOPED_TRACE(layer ? "layernorm" : "rmsnorm");
    if (layer)
      backend.layernorm_forward(out, mean, rstd, xb, wb, bias, 1e-5f);
    else
      backend.rmsnorm_forward(out, rstd, xb, wb, 1e-5f);
    Buffer separate = make_f32(backend, {rows, width}, dout),
           grad = make_f32(backend, {rows, width}, dout);
    Buffer shared = make_f32(backend, {rows, width}, dout);
    Buffer dw_separate = make_f32(backend, {width}, zeros),
           dw_shared = make_f32(backend, {width}, zeros);
    Buffer db_separate = make_f32(backend, {width}, zeros),
           db_shared = make_f32(backend, {width}, zeros);
    if (layer) {
      backend.layernorm_backward(separate, dw_separate, db_separate, grad, xb, wb, mean, rstd);
      backend.layernorm_backward(shared, dw_shared, db_shared, shared, xb, wb, mean, rstd);
    } else {
      backend.rmsnorm_backward(separate, dw_separate, grad, xb, wb, rstd);
      backend.rmsnorm_backward(shared, dw_shared, shared, xb, wb, rstd);
    }
    EXPECT_EQ(read_f32(backend, shared), read_f32(backend, separate));
    EXPECT_EQ(read_f32(backend, dw_shared), read_f32(backend, dw_separate));
    EXPECT_EQ(read_f32(backend, db_shared), read_f32(backend, db_separate));
  }
}

// ---- RoPE ----------------------------------------------------------------------------------

// x[B, T, H, d], rotate_half convention, positions pos_offset + t, all in double.
std::vector<double> reference_rope(const std::vector<double>& x, int64_t batch, int64_t seq_len,
                                   int64_t heads, int64_t dim, int64_t pos_offset, double theta) {
  std::vector<double> out(x.size());
  const int64_t half = dim / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((b * seq_len + t) * heads + h) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const double angle =
              double(pos_offset + t) * std::pow(theta, -2.0 * double(i) / double(dim));
          const double first = x[base + i], second = x[base + i + half];
          out[base + i] = first * std::cos(angle) - second * std::sin(angle);
          out[base + i + half] = second * std::cos(angle) + first * std::sin(angle);
        }
      }
  return out;
}

TEST(CpuRope, ForwardAtLargePositionsAndBackward) {
  CpuBackend backend;
  const int64_t batch = 2, seq_len = 5, heads = 3, dim = 8;
  // Positions past a million: a float angle would be off by a sizeable fraction of a radian.
  const int64_t pos_offset = 1000003;
  const float theta = 10000.0f;
  const size_t n = size_t(batch * seq_len * heads * dim);
  const std::vector<float> x = random_floats(n, 21);
  const std::vector<float> dout = random_floats(n, 22);

  Buffer xb = make_f32(backend, {batch, seq_len, heads, dim}, x);
  backend.rope(xb, pos_offset, theta, false);
  const std::vector<double> expected =
      reference_rope(to_double(x), batch, seq_len, heads, dim, pos_offset, theta);
  EXPECT_LT(relative_error(read_f32(backend, xb), expected), kForwardTolerance);

  backend.rope(xb, pos_offset, theta, true);
  EXPECT_LT(relative_error(read_f32(backend, xb), to_double(x)), kForwardTolerance);

  Buffer grad = make_f32(backend, {batch, seq_len, heads, dim}, dout);
  backend.rope(grad, pos_offset, theta, true);
  auto loss = [&](const std::vector<double>& xs) {
    return weighted_sum(reference_rope(xs, batch, seq_len, heads, dim, pos_offset, theta), dout);
  };
  expect_gradient_matches(read_f32(backend, grad), to_double(x), loss, kGradientTolerance,
                          "rope dx");
}

TEST(CpuRope, RejectsOddHeadDim) {
  CpuBackend backend;
  Buffer x = backend.alloc(MemCategory::activations, DType::f32, {1, 2, 1, 5}, "x");
  EXPECT_THROW(backend.rope(x, 0, 10000.0f, false), std::invalid_argument);
}

// ---- SwiGLU and GELU -----------------------------------------------------------------------

std::vector<double> reference_swiglu(const std::vector<double>& gate,
                                     const std::vector<double>& up) {
  std::vector<double> out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

TEST(CpuSwiGlu, ForwardAndBackward) {
  CpuBackend backend;
  const int64_t rows = 5, width = 33;
  const size_t n = size_t(rows * width);
  const std::vector<float> gate = random_floats(n, 31, -6.0f, 6.0f);
  const std::vector<float> up = random_floats(n, 32, -2.0f, 2.0f);
  const std::vector<float> dout = random_floats(n, 33);
  Buffer gb = make_f32(backend, {rows, width}, gate);
  Buffer ub = make_f32(backend, {rows, width}, up);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {rows, width}, "out");
  backend.swiglu_forward(out, gb, ub);
  EXPECT_LT(
      relative_error(read_f32(backend, out), reference_swiglu(to_double(gate), to_double(up))),
      kForwardTolerance);

  Buffer db = make_f32(backend, {rows, width}, dout);
  Buffer dgate = make_f32(backend, {rows, width}, random_floats(n, 34));  // overwritten
  Buffer dup = make_f32(backend, {rows, width}, random_floats(n, 35));
  backend.swiglu_backward(dgate, dup, db, gb, ub);
  auto loss_gate = [&](const std::vector<double>& g) {
    return weighted_sum(reference_swiglu(g, to_double(up)), dout);
  };
  auto loss_up = [&](const std::vector<double>& u) {
    return weighted_sum(reference_swiglu(to_double(gate), u), dout);
  };
  expect_gradient_matches(read_f32(backend, dgate), to_double(gate), loss_gate, kGradientTolerance,
                          "swiglu dgate");
  expect_gradient_matches(read_f32(backend, dup), to_double(up), loss_up, kGradientTolerance,
                          "swiglu dup");
}

// The model reuses the dout buffer for one of the gradients; the result must not change.
TEST(CpuSwiGlu, BackwardAllowsDoutToBeAGradientBuffer) {
  CpuBackend backend;
  const int64_t n = 50;
  const std::vector<float> gate = random_floats(size_t(n), 36, -4.0f, 4.0f);
  const std::vector<float> up = random_floats(size_t(n), 37);
  const std::vector<float> dout = random_floats(size_t(n), 38);
  Buffer gb = make_f32(backend, {n}, gate);
  Buffer ub = make_f32(backend, {n}, up);
  Buffer separate_out = make_f32(backend, {n}, dout);
  Buffer dgate = backend.alloc(MemCategory::activations, DType::f32, {n}, "dgate");
  Buffer dup = backend.alloc(MemCategory::activations, DType::f32, {n}, "dup");
  backend.swiglu_backward(dgate, dup, separate_out, gb, ub);
  const std::vector<float> expected_dgate = read_f32(backend, dgate);
  const std::vector<float> expected_dup = read_f32(backend, dup);

  Buffer shared_up = make_f32(backend, {n}, dout);
  backend.swiglu_backward(dgate, shared_up, shared_up, gb, ub);
  EXPECT_EQ(read_f32(backend, dgate), expected_dgate);
  EXPECT_EQ(read_f32(backend, shared_up), expected_dup);
  Buffer shared_gate = make_f32(backend, {n}, dout);
  backend.swiglu_backward(shared_gate, dup, shared_gate, gb, ub);
  EXPECT_EQ(read_f32(backend, shared_gate), expected_dgate);
  EXPECT_EQ(read_f32(backend, dup), expected_dup);
}

std::vector<double> reference_gelu(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  const double c = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = 0.5 * x[i] * (1.0 + std::tanh(c * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return out;
}

TEST(CpuGelu, ForwardAndBackward) {
  CpuBackend backend;
  const int64_t n = 97;
  const std::vector<float> x = random_floats(size_t(n), 41, -5.0f, 5.0f);
  const std::vector<float> dout = random_floats(size_t(n), 42);
  Buffer xb = make_f32(backend, {n}, x);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {n}, "out");
  backend.gelu_forward(out, xb);
  EXPECT_LT(relative_error(read_f32(backend, out), reference_gelu(to_double(x))),
            kForwardTolerance);

  Buffer db = make_f32(backend, {n}, dout);
  Buffer dx = make_f32(backend, {n}, random_floats(size_t(n), 43));  // overwritten
  backend.gelu_backward(dx, db, xb);
  auto loss = [&](const std::vector<double>& xs) { return weighted_sum(reference_gelu(xs), dout); };
  expect_gradient_matches(read_f32(backend, dx), to_double(x), loss, kGradientTolerance, "gelu dx");
}

// ---- Embedding -----------------------------------------------------------------------------

std::vector<double> reference_embedding(const std::vector<int32_t>& tokens,
                                        const std::vector<double>& wte,
                                        const std::vector<double>& wpe, int64_t seq_len,
                                        int64_t width, int64_t pos_offset) {
  std::vector<double> out(tokens.size() * size_t(width));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t position = pos_offset + int64_t(i) % seq_len;
    for (int64_t j = 0; j < width; ++j)
      out[i * width + j] = wte[tokens[i] * width + j] + wpe[position * width + j];
  }
  return out;
}

TEST(CpuEmbedding, ForwardAndBackwardWithPositionOffset) {
  CpuBackend backend;
  const int64_t batch = 2, seq_len = 6, vocab = 11, width = 70, max_positions = 20;
  const int64_t pos_offset = 5;
  // Repeated ids: their gradients must add up.
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 3, 7, 7, 1, 0, 2, 9};
  const std::vector<float> wte = random_floats(size_t(vocab * width), 51);
  const std::vector<float> wpe = random_floats(size_t(max_positions * width), 52);
  const std::vector<float> dout = random_floats(size_t(batch * seq_len * width), 53);
  const std::vector<float> dwte_start = random_floats(wte.size(), 54);
  const std::vector<float> dwpe_start = random_floats(wpe.size(), 55);

  Buffer tb = make_i32(backend, {batch, seq_len}, tokens);
  Buffer wte_b = make_f32(backend, {vocab, width}, wte);
  Buffer wpe_b = make_f32(backend, {max_positions, width}, wpe);
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {batch, seq_len, width}, "out");
  backend.embedding_forward(out, tb, wte_b, wpe_b, pos_offset);
  EXPECT_LT(relative_error(read_f32(backend, out),
                           reference_embedding(tokens, to_double(wte), to_double(wpe), seq_len,
                                               width, pos_offset)),
            1e-7);

  Buffer dwte = make_f32(backend, {vocab, width}, dwte_start);
  Buffer dwpe = make_f32(backend, {max_positions, width}, dwpe_start);
  Buffer db = make_f32(backend, {batch, seq_len, width}, dout);
  backend.embedding_backward(dwte, dwpe, db, tb, pos_offset);
  auto loss_wte = [&](const std::vector<double>& table) {
    return weighted_sum(
        reference_embedding(tokens, table, to_double(wpe), seq_len, width, pos_offset), dout);
  };
  auto loss_wpe = [&](const std::vector<double>& table) {
    return weighted_sum(
        reference_embedding(tokens, to_double(wte), table, seq_len, width, pos_offset), dout);
  };
  // Every coordinate, so untouched rows are checked to stay unchanged too.
  expect_gradient_matches(added(read_f32(backend, dwte), dwte_start), to_double(wte), loss_wte,
                          kGradientTolerance, "dwte", wte.size());
  expect_gradient_matches(added(read_f32(backend, dwpe), dwpe_start), to_double(wpe), loss_wpe,
                          kGradientTolerance, "dwpe", wpe.size());
}

TEST(CpuEmbedding, WithoutPositionsAndBadInputs) {
  CpuBackend backend;
  const int64_t vocab = 4, width = 3;
  const std::vector<float> wte = random_floats(size_t(vocab * width), 61);
  Buffer wte_b = make_f32(backend, {vocab, width}, wte);
  Buffer tokens = make_i32(backend, {1, 3}, {2, 0, 3});
  Buffer out = backend.alloc(MemCategory::activations, DType::f32, {1, 3, width}, "out");
  backend.embedding_forward(out, tokens, wte_b, Tensor(), 0);
  const std::vector<float> values = read_f32(backend, out);
  for (int64_t j = 0; j < width; ++j) {
    EXPECT_EQ(values[j], wte[2 * width + j]);
    EXPECT_EQ(values[2 * width + j], wte[3 * width + j]);
  }

  Buffer bad = make_i32(backend, {1, 3}, {2, 4, 0});
  try {
    backend.embedding_forward(out, bad, wte_b, Tensor(), 0);
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& error) {
    EXPECT_NE(std::string(error.what()).find("token id 4 "), std::string::npos) << error.what();
  }
  Buffer negative = make_i32(backend, {1, 3}, {2, -1, 0});
  EXPECT_THROW(backend.embedding_forward(out, negative, wte_b, Tensor(), 0), std::out_of_range);
  Buffer dwte = backend.alloc(MemCategory::grads, DType::f32, {vocab, width}, "dwte");
  EXPECT_THROW(backend.embedding_backward(dwte, Tensor(), out, bad, 0), std::out_of_range);

  Buffer wpe = make_f32(backend, {4, width}, random_floats(size_t(4 * width), 62));
  EXPECT_THROW(backend.embedding_forward(out, tokens, wte_b, wpe, 2), std::out_of_range);
}

}  // namespace
}  // namespace ulysses
