// Training steps (Model forward/backward + AdamW) on one backend from given fp32 weights and
// batch, and the comparison of a bf16 backend's steps with the cpu backend's within the bf16
// tolerances of docs/cuda.md ("Checking on a GPU"). Shared by test_cuda_training (the cuda
// backend on a GPU) and test_emulated_cuda_training (its kernels on the host).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/train/optimizer.h"
#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses::training_test {

// Loss: relative difference of the mean loss.
constexpr double kLossTolerance = 1e-2;
// Each gradient tensor: max |bf16 − cpu| / max |cpu| over the tensor.
constexpr double kGradTolerance = 1e-1;
// All gradients together: cosine similarity of the flat gradient vectors.
constexpr double kMinGradCosine = 0.995;
// Each AdamW step moves a weight by about lr at most, whatever the gradient: where the
// backends' gradients differ in sign the updates differ by at most 2·lr (2.5·lr with margin).
constexpr double kParamStepsOfLr = 2.5;

inline std::vector<float> random_weights(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> weights(size_t(table.total_numel()));
  for (const ParamSpec& spec : table.specs()) {
    const float scale = spec.shape.size() == 2 ? 1.0f / std::sqrt(float(spec.shape[1])) : 0.1f;
    const float center = spec.init == ParamSpec::Init::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < spec.numel; ++i)
      weights[size_t(spec.offset + i)] = center + scale * normal(engine);
  }
  return weights;
}

// Random tokens; every ninth target from the fifth on is not counted.
inline MicroBatch random_micro_batch(const Config& config, uint32_t seed) {
  MicroBatch micro;
  micro.batch = config.train.batch_size;
  micro.seq_local = config.train.seq_len;
  std::mt19937 engine(seed);
  for (int64_t i = 0; i < micro.batch * micro.seq_local; ++i) {
    micro.inputs.push_back(int32_t(engine() % uint32_t(config.model.vocab_size)));
    micro.targets.push_back(i % 9 == 4 ? -1
                                       : int32_t(engine() % uint32_t(config.model.vocab_size)));
  }
  return micro;
}

struct StepOutcome {
  double loss = 0.0;
  std::vector<float> grads, params_after;
};

// `steps` steps on the same batch; one outcome per step.
inline std::vector<StepOutcome> train_steps(Backend& backend, const Config& config,
                                            const MicroBatch& micro,
                                            const std::vector<float>& weights, int steps) {
  auto sp = make_local_comm("sp");
  Model model(config, backend, *sp, *sp, micro.batch, micro.seq_local);
  model.load_weights(weights.data());
  int64_t counted = 0;
  for (int32_t target : micro.targets) counted += target >= 0;
  AdamW optimizer(backend, model.table(), config.train, model.state().layout());
  std::vector<StepOutcome> outcomes;
  for (int step = 1; step <= steps; ++step) {
    model.zero_grads();
    const LossResult loss = model.forward_backward(micro, 1.0f / float(counted));
    StepOutcome outcome;
    outcome.loss = loss.loss_sum / double(loss.count);
    outcome.grads.resize(size_t(model.num_params()));
    model.download_gradients(outcome.grads.data());
    // As the trainer's step (core/train/trainer.cpp): reduce, update, then refresh the compute
    // copy.
    model.state().reduce_gradients();
    optimizer.update(model.state().master(), model.state().gradient_shard(), float(config.train.lr),
                     1.0f, step);
    model.state().publish_weights();
    outcome.params_after.resize(size_t(model.num_params()));
    model.download_weights(outcome.params_after.data());
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

// Step `step` (1-based) of a bf16 backend against the cpu backend's, tensor by tensor.
inline void expect_step_matches(const StepOutcome& actual, const StepOutcome& expected,
                                const ParamTable& table, double lr, int step) {
  SCOPED_TRACE("step " + std::to_string(step));
  EXPECT_NEAR(actual.loss, expected.loss, kLossTolerance * expected.loss);
  double dot = 0.0, norm_actual = 0.0, norm_expected = 0.0;
  for (const ParamSpec& spec : table.specs()) {
    double max_error = 0.0, max_expected = 0.0, max_param_difference = 0.0;
    for (int64_t i = spec.offset; i < spec.offset + spec.numel; ++i) {
      const double a = actual.grads[size_t(i)], e = expected.grads[size_t(i)];
      max_error = std::max(max_error, std::abs(a - e));
      max_expected = std::max(max_expected, std::abs(e));
      dot += a * e;
      norm_actual += a * a;
      norm_expected += e * e;
      max_param_difference = std::max(
          max_param_difference,
          std::abs(double(actual.params_after[size_t(i)]) - expected.params_after[size_t(i)]));
    }
    EXPECT_LT(max_error / std::max(max_expected, 1e-30), kGradTolerance) << spec.name;
    EXPECT_LE(max_param_difference, kParamStepsOfLr * lr * step) << spec.name;
  }
  EXPECT_GT(dot / std::sqrt(norm_actual * norm_expected), kMinGradCosine);
}

// `steps` steps of `backend` under `config` against the cpu backend's under `reference` (the
// same model, e.g. with other memory options), from the same random weights and batch.
inline void expect_steps_match_cpu(Backend& backend, const Config& config, const Config& reference,
                                   int steps) {
  auto cpu = make_backend(BackendKind::cpu, 0);
  const ParamTable table(config.model);
  const std::vector<float> weights = random_weights(table, 21);
  const MicroBatch micro = random_micro_batch(config, 5);
  const std::vector<StepOutcome> expected = train_steps(*cpu, reference, micro, weights, steps);
  const std::vector<StepOutcome> actual = train_steps(backend, config, micro, weights, steps);
  for (int step = 0; step < steps; ++step)
    expect_step_matches(actual[size_t(step)], expected[size_t(step)], table, config.train.lr,
                        step + 1);
}

// The config with every memory option at its default but the loss tile: the run that keeps
// everything in place.
inline Config with_default_memory(const Config& config) {
  Config kept = config;
  kept.memory = MemoryConfig();
  kept.memory.loss_tile_tokens = config.memory.loss_tile_tokens;
  return kept;
}

}  // namespace ulysses::training_test
