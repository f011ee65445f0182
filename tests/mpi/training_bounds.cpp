#include "tests/mpi/training_bounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/train/optimizer.h"
#include "kernels/op_formulas.h"

namespace ulysses::testing {

int64_t tokens_per_step(const Config& config, int world_size) {
  const int64_t dp = world_size / config.parallel.sp;
  return int64_t(config.train.grad_accum) * config.train.batch_size * dp * config.train.seq_len;
}

double summation_order_bound(int64_t terms) {
  return 2.0 * double(terms - 1) * kUnitRoundoff;
}

namespace {

// AdamW's first step moves a parameter by lr · ĝ / (|ĝ| + eps), with ĝ the clipped gradient:
// the bias-corrected moments are ĝ and ĝ².
double first_adam_direction(float clipped_grad, double eps) {
  return double(clipped_grad) / (std::abs(double(clipped_grad)) + eps);
}

void expect_first_step_gradients_match(const TrainingOutcome& value,
                                       const TrainingOutcome& reference, double order_bound,
                                       const std::string& where) {
  const std::vector<float>& ours = value.step_grads.front();
  const std::vector<float>& theirs = reference.step_grads.front();
  double largest = 0.0;
  for (float grad : theirs) largest = std::max(largest, double(std::abs(grad)));
  struct Tensor {
    double max_difference = 0.0, max_reference = 0.0;
  };
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < theirs.size(); ++i) {
    Tensor& tensor = tensors[reference.names[i]];
    tensor.max_difference = std::max(tensor.max_difference, double(std::abs(ours[i] - theirs[i])));
    tensor.max_reference = std::max(tensor.max_reference, double(std::abs(theirs[i])));
  }
  // An element is a sum over the step's tokens; the two runs split them among ranks,
  // micro-batches and reductions differently, so they differ by at most order_bound ·
  // Σ|terms| (where kv heads are replicated, the terms themselves differ by the few u of
  // adding dK and dV across ranks, far less). Relative to the tensor's largest element,
  // whose terms mostly share a sign (Σ|terms| ≈ |sum|). A tensor whose exact gradient is zero
  // (gpt2's k bias: the softmax does not see a shift of every key) holds round-off only, of terms
  // the size of the other attention gradients: its scale is taken as 1% of the largest gradient of
  // all.
  for (const auto& [name, tensor] : tensors) {
    const double scale = std::max(tensor.max_reference, 0.01 * largest);
    EXPECT_LE(tensor.max_difference, order_bound * scale)
        << where << ": step 1 gradient of " << name << " differs by " << tensor.max_difference
        << ", its largest element is " << tensor.max_reference;
  }
  // |‖a‖ − ‖b‖| <= ‖a − b‖, and every element's difference is bounded as above.
  EXPECT_LE(std::abs(value.grad_norms.front() - reference.grad_norms.front()),
            order_bound * reference.grad_norms.front())
      << where << ": step 1 gradient norm";
}

void expect_first_step_parameters_match(const TrainingOutcome& value,
                                        const TrainingOutcome& reference, const TrainConfig& train,
                                        const std::string& where) {
  const double lr = learning_rate(train, 0);
  const float scale = clip_scale(value.grad_norms.front(), train.grad_clip);
  const float reference_scale = clip_scale(reference.grad_norms.front(), train.grad_clip);
  const std::vector<float>& after = value.weights[1];
  const std::vector<float>& reference_after = reference.weights[1];
  double worst_ratio = 0.0, worst_difference = 0.0, worst_bound = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    // Both runs start from the same weights, so their first steps differ by
    // lr · Δ(ĝ / (|ĝ| + eps)): where |ĝ| >> eps that is far below the gradients' own relative
    // difference, where |ĝ| is near eps it is up to lr · |Δĝ| / eps (tiny gradients are
    // normalised to steps of about lr). Each run's step is within about 11 roundings of
    // lr · ĝ / (|ĝ| + eps) (the scalars, m, v, √v, + eps, the quotient, the step size): 32u of
    // lr for both; subtracting it from θ·decay (the same in both) rounds once more, by half an
    // ulp of θ (at most u·|θ|) in each run.
    const float clipped = scale * value.step_grads.front()[i];
    const float reference_clipped = reference_scale * reference.step_grads.front()[i];
    const double bound =
        lr * std::abs(first_adam_direction(clipped, train.eps) -
                      first_adam_direction(reference_clipped, train.eps)) +
        32.0 * kUnitRoundoff * lr +
        2.0 * kUnitRoundoff *
            std::max(std::abs(double(after[i])), std::abs(double(reference_after[i])));
    const double difference = std::abs(double(after[i]) - double(reference_after[i]));
    if (difference / bound > worst_ratio) {
      worst_ratio = difference / bound;
      worst_difference = difference;
      worst_bound = bound;
      worst = i;
    }
  }
  EXPECT_LE(worst_ratio, 1.0) << where << ": after step 1, element " << worst << " of "
                              << reference.names[worst] << " differs by " << worst_difference
                              << ", more than AdamW's normalisation of the gradients explains ("
                              << worst_bound << ")";
}

void expect_losses_follow_the_weights(const TrainingOutcome& value,
                                      const TrainingOutcome& reference, double order_bound,
                                      const std::string& where) {
  for (size_t t = 0; t < reference.losses.size(); ++t) {
    // Step t's loss is taken at weights that differ by Δθ (none at step 1): to first order it
    // differs by g · Δθ, at most Σ|g||Δθ|; twice that leaves room for the second-order term
    // (smaller by about ‖H‖·|Δθ|/|g|) and for g itself differing. At equal weights the loss
    // differs only in the order of its fp32 sums: order_bound of its size.
    double first_order = 0.0;
    for (size_t i = 0; i < reference.weights[t].size(); ++i)
      first_order += std::abs(double(reference.step_grads[t][i])) *
                     std::abs(double(value.weights[t][i]) - double(reference.weights[t][i]));
    EXPECT_LE(std::abs(value.losses[t] - reference.losses[t]),
              2.0 * first_order + order_bound * std::abs(reference.losses[t]))
        << where << ": loss of step " << t + 1 << ", weights apart by Σ|g||Δθ| = " << first_order;
  }
}

void expect_adamw_of_its_own_gradients(const TrainingOutcome& run, const TrainConfig& train,
                                       const std::string& where) {
  // Whatever the configuration (replicated or sharded moments, any bucket), every step's
  // weights are AdamW of that run's own reduced gradient, element by element: the backend's
  // own fp32 formula (kernels/op_formulas.h) replayed here on the whole buffers gives the same
  // bits. This is what ties the runs together after step 1, where their gradients differ.
  std::vector<float> weights = run.weights.front();
  std::vector<float> m(weights.size(), 0.0f), v(weights.size(), 0.0f);
  for (size_t t = 0; t < run.losses.size(); ++t) {
    AdamWStep step;
    step.lr = float(learning_rate(train, int64_t(t)));
    step.beta1 = float(train.beta1);
    step.beta2 = float(train.beta2);
    step.eps = float(train.eps);
    step.step = int64_t(t) + 1;
    step.grad_scale = clip_scale(run.grad_norms[t], train.grad_clip);
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      step.weight_decay = run.weight_decayed[i] ? float(train.weight_decay) : 0.0f;
      formulas::adamw_update(weights[i], run.step_grads[t][i], m[i], v[i],
                             formulas::adamw_scalars(step));
      if (weights[i] != run.weights[t + 1][i] && mismatches++ == 0) first = i;
    }
    EXPECT_EQ(mismatches, 0u) << where << ": after step " << t + 1 << ", " << mismatches
                              << " weights are not AdamW of the gradient, the first element "
                              << first << " of " << run.names[first] << ": "
                              << run.weights[t + 1][first] << ", AdamW gives " << weights[first];
    weights = run.weights[t + 1];  // one step at a time: a mismatch is reported once
  }
}

void expect_last_weights_close(const TrainingOutcome& value, const TrainingOutcome& reference,
                               const TrainConfig& train, const std::string& where) {
  // After step 1 the runs take their gradients at weights that differ, so the difference is
  // no longer round-off alone, and AdamW turns a gradient within round-off of zero into a
  // step of about ±lr whose sign is the round-off's: arithmetic alone bounds the divergence
  // only by 2·lr per step, which tells nothing. This asserts that no parameter is further
  // apart than a tenth of the way AdamW can move it in these steps (about lr each): an error
  // in how a configuration applies AdamW (a shard's moments, step count, learning rate or
  // decay) moves elements by a sizable part of a step, round-off by far less here.
  double total_lr = 0.0;
  for (size_t t = 0; t < reference.losses.size(); ++t) total_lr += learning_rate(train, int64_t(t));
  double worst_difference = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < reference.params.size(); ++i) {
    const double difference = std::abs(double(value.params[i]) - double(reference.params[i]));
    if (difference > worst_difference) {
      worst_difference = difference;
      worst = i;
    }
  }
  EXPECT_LE(worst_difference, 0.1 * total_lr)
      << where << ": after step " << reference.losses.size() << ", element " << worst << " of "
      << reference.names[worst] << ": " << value.params[worst] << " vs " << reference.params[worst];
}

}  // namespace

void expect_same_training(const TrainingOutcome& value, const TrainingOutcome& reference,
                          const Config& config, int64_t tokens, const std::string& where) {
  ASSERT_GE(reference.losses.size(), 2u) << where;
  ASSERT_EQ(value.losses.size(), reference.losses.size()) << where;
  ASSERT_EQ(value.params.size(), reference.params.size()) << where;
  const double order_bound = summation_order_bound(tokens);
  expect_first_step_gradients_match(value, reference, order_bound, where);
  expect_first_step_parameters_match(value, reference, config.train, where);
  expect_adamw_of_its_own_gradients(value, config.train, where);
  expect_adamw_of_its_own_gradients(reference, config.train, where + " (reference)");
  expect_losses_follow_the_weights(value, reference, order_bound, where);
  expect_last_weights_close(value, reference, config.train, where);
}

}  // namespace ulysses::testing
