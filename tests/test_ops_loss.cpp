// CpuBackend fused LM head + cross-entropy: loss, count and accuracy against a double
// reference; dhidden and dweight against central finite differences of it.
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
using ops_test::to_double;

struct ReferenceLoss {
  double loss_sum = 0.0;
  int64_t count = 0, correct = 0;
};

// Cross-entropy of softmax(hidden · weightᵀ) over rows with target >= 0, in double.
ReferenceLoss reference_loss(const std::vector<double>& hidden, const std::vector<double>& weight,
                             const std::vector<int32_t>& targets, int64_t vocab, int64_t width) {
  ReferenceLoss result;
  std::vector<double> logits(static_cast<size_t>(vocab));
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] < 0) continue;
    for (int64_t v = 0; v < vocab; ++v) {
      double dot = 0.0;
      for (int64_t c = 0; c < width; ++c) dot += hidden[r * width + c] * weight[v * width + c];
      logits[v] = dot;
    }
    int64_t argmax = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (logits[v] > logits[argmax]) argmax = v;
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(logits[v] - logits[argmax]);
    result.loss_sum += logits[argmax] + std::log(sum) - logits[targets[r]];
    result.count += 1;
    result.correct += argmax == targets[r];
  }
  return result;
}

TEST(CpuLmHeadLoss, LossCountsAndGradients) {
  CpuBackend backend;
  const int64_t rows = 13, width = 24, vocab = 50, tile_rows = 4;
  const float grad_scale = 0.25f;
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 4 == 1 ? -1 : int32_t((r * 17 + 3) % vocab);
  const std::vector<float> hidden = random_floats(size_t(rows * width), 1);
  const std::vector<float> weight = random_floats(size_t(vocab * width), 2);
  const std::vector<float> dweight_start = random_floats(weight.size(), 3);

  Buffer hb = make_f32(backend, {rows, width}, hidden);
  Buffer wb = make_f32(backend, {vocab, width}, weight);
  Buffer tb = make_i32(backend, {rows}, targets);
  Buffer dhidden =
      make_f32(backend, {rows, width}, random_floats(hidden.size(), 4));  // overwritten
  Buffer dweight = make_f32(backend, {vocab, width}, dweight_start);
  const LossResult result =
      backend.lm_head_loss(hb, wb, tb, tile_rows, grad_scale, dhidden, dweight);

  const ReferenceLoss expected =
      reference_loss(to_double(hidden), to_double(weight), targets, vocab, width);
  EXPECT_EQ(result.count, expected.count);
  EXPECT_EQ(result.count, 10);
  EXPECT_EQ(result.correct, expected.correct);
  EXPECT_NEAR(result.loss_sum, expected.loss_sum, 1e-5 * expected.loss_sum);

  const std::vector<float> dh = read_f32(backend, dhidden);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= 0) continue;
    for (int64_t c = 0; c < width; ++c) EXPECT_EQ(dh[r * width + c], 0.0f) << "row " << r;
  }
  auto loss_hidden = [&](const std::vector<double>& h) {
    return grad_scale * reference_loss(h, to_double(weight), targets, vocab, width).loss_sum;
  };
  auto loss_weight = [&](const std::vector<double>& w) {
    return grad_scale * reference_loss(to_double(hidden), w, targets, vocab, width).loss_sum;
  };
  expect_gradient_matches(dh, to_double(hidden), loss_hidden, 1e-4, "dhidden");
  std::vector<float> dw = read_f32(backend, dweight);
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dweight_start[i];
  expect_gradient_matches(dw, to_double(weight), loss_weight, 1e-4, "dweight", 600);

  // Without gradients: the same loss, and nothing else is needed.
  const LossResult forward_only = backend.lm_head_loss(hb, wb, tb, 3, 1.0f, Tensor(), Tensor());
  EXPECT_EQ(forward_only.count, result.count);
  EXPECT_EQ(forward_only.correct, result.correct);
  EXPECT_NEAR(forward_only.loss_sum, result.loss_sum, 1e-6 * result.loss_sum);
}

TEST(CpuLmHeadLoss, ArgmaxTakesTheFirstMaximum) {
  CpuBackend backend;
  const int64_t width = 4, vocab = 6;
  // Zero hidden rows: every logit is 0, so the argmax is token 0 and the loss is log(V).
  Buffer hb = make_f32(backend, {2, width}, std::vector<float>(2 * width, 0.0f));
  Buffer wb = make_f32(backend, {vocab, width}, random_floats(size_t(vocab * width), 5));
  Buffer tb = make_i32(backend, {2}, {0, 1});
  const LossResult result = backend.lm_head_loss(hb, wb, tb, 8, 1.0f, Tensor(), Tensor());
  EXPECT_EQ(result.count, 2);
  EXPECT_EQ(result.correct, 1);
  EXPECT_NEAR(result.loss_sum, 2.0 * std::log(double(vocab)), 1e-6);
}

TEST(CpuLmHeadLoss, NoCountedRowsAndBadTargets) {
  CpuBackend backend;
  const int64_t width = 4, vocab = 6;
  Buffer hb = make_f32(backend, {3, width}, random_floats(size_t(3 * width), 6));
  Buffer wb = make_f32(backend, {vocab, width}, random_floats(size_t(vocab * width), 7));
  Buffer dhidden = make_f32(backend, {3, width}, random_floats(size_t(3 * width), 8));
  Buffer dweight =
      make_f32(backend, {vocab, width}, std::vector<float>(size_t(vocab * width), 0.0f));
  Buffer none = make_i32(backend, {3}, {-1, -1, -1});
  const LossResult empty = backend.lm_head_loss(hb, wb, none, 2, 1.0f, dhidden, dweight);
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.loss_sum, 0.0);
  for (float value : read_f32(backend, dhidden)) EXPECT_EQ(value, 0.0f);

  Buffer bad = make_i32(backend, {3}, {1, 6, 2});
  try {
    backend.lm_head_loss(hb, wb, bad, 2, 1.0f, Tensor(), Tensor());
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& error) {
    EXPECT_NE(std::string(error.what()).find("target 6 "), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace ulysses
