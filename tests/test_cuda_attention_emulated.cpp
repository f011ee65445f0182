// The native CUDA attention kernels (kernels/cuda/cuda_attention_kernels.cuh), executed on the
// host thread by thread (tests/cuda_emulation.h), against causal attention in double on the
// same bf16 inputs. This runs the GPU code's indexing, tile edges, barriers and warp shuffles
// on every machine; the GPU tests (tests/test_cuda_ops.cpp) check it on the device itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_emulation.h"
// After the emulation, which provides the device environment.
#include "kernels/cuda/cuda_attention_kernels.cuh"

namespace ulysses {
namespace {

using cuda::bf16;
using cuda::emulation::launch;
using namespace cuda_attention;

// bf16 outputs: a few roundings of 2^-9 relative, as in tests/test_cuda_ops.cpp.
constexpr double kTolerance = 3e-2;
constexpr double kLseTolerance = 1e-5;

struct Shape {
  int64_t batch, seq;
  int q_heads, kv_heads, dim;
};

std::string describe(const Shape& s) {
  return "B " + std::to_string(s.batch) + " T " + std::to_string(s.seq) + " Hq " +
         std::to_string(s.q_heads) + " Hkv " + std::to_string(s.kv_heads) + " d " +
         std::to_string(s.dim);
}

std::vector<bf16> random_bf16(size_t count, uint32_t seed, float scale) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<bf16> values(count);
  for (bf16& value : values) value = __float2bfloat16_rn(normal(engine));
  return values;
}

double value(bf16 x) {
  return __bfloat162float(x);
}
double value(float x) {
  return x;
}

// max |actual − expected| / max |expected|, with the denominator at least 1: the inputs are
// O(1), and gradients that are exactly zero (a single token) get the same absolute bound.
template <typename T>
double relative_error(const std::vector<T>& actual, const std::vector<double>& expected) {
  double max_error = 0.0, max_expected = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double error = std::abs(value(actual[i]) - expected[i]);
    max_error = std::isnan(error) ? INFINITY : std::max(max_error, error);
    max_expected = std::max(max_expected, std::abs(expected[i]));
  }
  return max_error / std::max(max_expected, 1.0);
}

struct Expected {
  std::vector<double> out, lse, dq, dk, dv;
};

// Causal softmax(q·kᵀ/√d)·v and its gradients for the loss Σ dout ∘ out, in double.
Expected reference(const Shape& s, const std::vector<bf16>& q, const std::vector<bf16>& k,
                   const std::vector<bf16>& v, const std::vector<bf16>& dout) {
  const int64_t T = s.seq, d = s.dim, group = s.q_heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(double(d));
  Expected e{std::vector<double>(q.size()), std::vector<double>(size_t(s.batch * s.q_heads * T)),
             std::vector<double>(q.size()), std::vector<double>(k.size()),
             std::vector<double>(k.size())};
  auto q_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * s.q_heads + h) * d; };
  auto kv_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * s.kv_heads + h) * d; };
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> scores(size_t(i + 1));
        double max_score = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += value(q[q_at(b, i, h) + c]) * value(k[kv_at(b, j, kv) + c]);
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (double score : scores) sum += std::exp(score - max_score);
        const double lse = max_score + std::log(sum);
        e.lse[size_t((b * s.q_heads + h) * T + i)] = lse;
        double row_dot = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j <= i; ++j)
            o += std::exp(scores[j] - lse) * value(v[kv_at(b, j, kv) + c]);
          e.out[q_at(b, i, h) + c] = o;
          row_dot += o * value(dout[q_at(b, i, h) + c]);
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[j] - lse);
          double dp = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dp += value(dout[q_at(b, i, h) + c]) * value(v[kv_at(b, j, kv) + c]);
          const double ds = p * (dp - row_dot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            e.dq[q_at(b, i, h) + c] += ds * value(k[kv_at(b, j, kv) + c]);
            e.dk[kv_at(b, j, kv) + c] += ds * value(q[q_at(b, i, h) + c]);
            e.dv[kv_at(b, j, kv) + c] += p * value(dout[q_at(b, i, h) + c]);
          }
        }
      }
    }
  return e;
}

template <int kDim>
void run_kernels(const Shape& s, const std::vector<bf16>& q, const std::vector<bf16>& k,
                 const std::vector<bf16>& v, const std::vector<bf16>& dout, std::vector<bf16>& out,
                 std::vector<float>& lse, std::vector<bf16>& dq, std::vector<bf16>& dk,
                 std::vector<bf16>& dv) {
  const AttentionDims dims{s.seq, s.q_heads, s.kv_heads, s.dim,
                           float(1.0 / std::sqrt(double(s.dim)))};
  // The launch shapes of kernels/cuda/cuda_attention.cu.
  launch(attention_forward_launch(dims, s.batch), [&] {
    attention_forward_kernel<kDim>(out.data(), lse.data(), q.data(), k.data(), v.data(), dims);
  });
  // The GPU backward reads its own (bf16) out, as here.
  std::vector<float> row_dot(lse.size(), NAN);
  const int64_t rows = s.batch * s.seq * s.q_heads;
  launch(attention_row_dot_launch(rows),
         [&] { attention_row_dot_kernel(row_dot.data(), dout.data(), out.data(), dims, rows); });
  launch(attention_dq_launch(dims, s.batch), [&] {
    attention_dq_kernel<kDim>(dq.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(),
                              row_dot.data(), dims);
  });
  launch(attention_dkv_launch(dims, s.batch), [&] {
    attention_dkv_kernel<kDim>(dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                               lse.data(), row_dot.data(), dims);
  });
}

class EmulatedAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(EmulatedAttention, MatchesCausalAttentionInDouble) {
  const Shape s = GetParam();
  const size_t q_count = size_t(s.batch * s.seq * s.q_heads * s.dim);
  const size_t kv_count = size_t(s.batch * s.seq * s.kv_heads * s.dim);
  const std::vector<bf16> q = random_bf16(q_count, 1, 1.5f), k = random_bf16(kv_count, 2, 1.5f),
                          v = random_bf16(kv_count, 3, 1.0f), dout = random_bf16(q_count, 4, 1.0f);
  const bf16 nan = __float2bfloat16_rn(NAN);  // anything left unwritten fails the comparison
  std::vector<bf16> out(q_count, nan), dq(q_count, nan), dk(kv_count, nan), dv(kv_count, nan);
  std::vector<float> lse(size_t(s.batch * s.q_heads * s.seq), NAN);
  if (kernel_dim(s.dim) == 64)
    run_kernels<64>(s, q, k, v, dout, out, lse, dq, dk, dv);
  else
    run_kernels<128>(s, q, k, v, dout, out, lse, dq, dk, dv);

  // The kernels take rowsum(dout ∘ out) from their bf16 out, the reference from its exact one:
  // within the tolerance.
  const Expected e = reference(s, q, k, v, dout);
  EXPECT_LT(relative_error(out, e.out), kTolerance) << describe(s);
  EXPECT_LT(relative_error(lse, e.lse), kLseTolerance) << describe(s);
  EXPECT_LT(relative_error(dq, e.dq), kTolerance) << describe(s);
  EXPECT_LT(relative_error(dk, e.dk), kTolerance) << describe(s);
  EXPECT_LT(relative_error(dv, e.dv), kTolerance) << describe(s);
}

// Both kernel widths (64, 128), head dims below them, one token, sequences that are not a
// multiple of the 64-row tile, GQA groups of 1, 2 and 3.
INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedAttention,
                         ::testing::Values(Shape{1, 1, 1, 1, 2}, Shape{2, 130, 4, 2, 40},
                                           Shape{1, 64, 2, 2, 64}, Shape{1, 65, 3, 1, 72},
                                           Shape{1, 200, 2, 1, 128}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "B" + std::to_string(s.batch) + "_T" + std::to_string(s.seq) +
                                  "_Hq" + std::to_string(s.q_heads) + "_Hkv" +
                                  std::to_string(s.kv_heads) + "_d" + std::to_string(s.dim);
                         });

}  // namespace
}  // namespace ulysses
