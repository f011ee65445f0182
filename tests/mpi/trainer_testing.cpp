#include "tests/mpi/trainer_testing.h"

#include <algorithm>
#include <cmath>

#include "core/trainer.h"
#include "kernels/backend.h"
#include "parallel/mesh.h"

namespace ulysses::testing {

// Adam divides by sqrt(v) + eps: a gradient that is zero up to round-off (the k bias of
// gpt2 cannot change the softmax) would be amplified into a ±lr step that differs between
// any two summation orders. eps = 1e-6 keeps such directions at round-off level while
// real gradients (>= 1e-4 here) are still normalised as usual.
Config tiny_training_config(const std::string& family, int kv_heads, int sp, int batch_size) {
  std::string kv = family == "llama" ? ", n_kv_heads: " + std::to_string(kv_heads) : "";
  return parse_config(
      "model: {family: " + family + ", n_layers: 2, d_model: 32, n_heads: 4" + kv +
          ", d_ff: 48}\n"
          "train: {steps: 3, batch_size: " +
          std::to_string(batch_size) +
          ", seq_len: 64, lr: 1.0e-2, warmup_steps: 1, weight_decay: 0.1, grad_accum: 2, "
          "eps: 1.0e-6, seed: 9}\n"
          "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
          "parallel: {sp: " +
          std::to_string(sp) + "}\n",
      {}, "equivalence.yaml");
}

TrainingOutcome train_for(const Config& config, Comm& world, int steps) {
  auto backend = make_backend(BackendKind::cpu, 0);
  backend->set_num_threads(1);
  return train_on(*backend, config, world, steps);
}

TrainingOutcome train_on(Backend& backend, const Config& config, Comm& world, int steps) {
  Mesh mesh = make_mesh(world, config.parallel.sp);
  Trainer trainer(config, backend, mesh);
  TrainingOutcome outcome;
  for (int i = 0; i < steps; ++i) {
    StepResult step = trainer.train_step();
    outcome.losses.push_back(step.loss);
    outcome.grad_norms.push_back(step.grad_norm);
  }
  outcome.params.resize(size_t(trainer.model().num_params()));
  for (const ParamSpec& spec : trainer.model().table().specs())
    outcome.names.insert(outcome.names.end(), size_t(spec.numel), spec.name);
  trainer.model().download_weights(outcome.params.data());
  outcome.grads.resize(outcome.params.size());
  trainer.model().download_gradients(outcome.grads.data());
  return outcome;
}

std::vector<TraceSpan> traced_step(const Config& config, Comm& world) {
  auto backend = make_backend(BackendKind::cpu, 0);
  backend->set_num_threads(1);
  Mesh mesh = make_mesh(world, config.parallel.sp);
  Trainer trainer(config, *backend, mesh);
  Profiler& profiler = backend->profiler();
  profiler.take_trace();
  profiler.set_trace(true);
  trainer.train_step();
  return profiler.take_trace();
}

std::map<std::string, TensorDifference> gradient_differences(const TrainingOutcome& value,
                                                             const TrainingOutcome& reference) {
  std::map<std::string, TensorDifference> by_tensor;
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    TensorDifference& tensor = by_tensor[reference.names[i]];
    tensor.max_difference =
        std::max(tensor.max_difference, double(std::abs(value.grads[i] - reference.grads[i])));
    tensor.max_reference = std::max(tensor.max_reference, double(std::abs(reference.grads[i])));
  }
  return by_tensor;
}

double max_relative_difference(const std::vector<float>& value,
                               const std::vector<float>& reference) {
  double max_difference = 0.0, max_reference = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    max_difference = std::max(max_difference, double(std::abs(value[i] - reference[i])));
    max_reference = std::max(max_reference, double(std::abs(reference[i])));
  }
  return max_difference / max_reference;
}

}  // namespace ulysses::testing
