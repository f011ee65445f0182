#include "tests/mpi/trainer_testing.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "parallel/mesh.h"

namespace ulysses::testing {

// Adam divides by sqrt(v) + eps: a gradient that is zero up to round-off (the k bias of
// gpt2 cannot change the softmax) would be amplified into a ±lr step that differs between
// any two summation orders. eps = 1e-6 keeps such directions at round-off level while
// real gradients (>= 1e-4 here) are still normalised as usual.
std::string tiny_training_config_yaml() {
  return "model: {family: llama, n_layers: 2, d_model: 32, n_heads: 4, d_ff: 48}\n"
         "train: {steps: 3, batch_size: 1, seq_len: 64, lr: 1.0e-2, warmup_steps: 1, "
         "weight_decay: 0.1, grad_accum: 2, eps: 1.0e-6, seed: 9}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n";
}

Config tiny_training_config(const std::string& family, int kv_heads, int sp, int batch_size) {
  std::vector<std::string> overrides = {"model.family=" + family,
                                        "parallel.sp=" + std::to_string(sp),
                                        "train.batch_size=" + std::to_string(batch_size)};
  if (family == "llama") overrides.push_back("model.n_kv_heads=" + std::to_string(kv_heads));
  return parse_config(tiny_training_config_yaml(), overrides, "equivalence.yaml");
}

CpuGemm test_gemm() {
  const char* chosen = std::getenv("ULYSSES_TEST_GEMM");
  if (chosen == nullptr || std::string(chosen) == "portable") return CpuGemm::portable;
  if (std::string(chosen) == "openblas") return CpuGemm::openblas;
  throw std::invalid_argument("ULYSSES_TEST_GEMM must be openblas or portable, got '" +
                              std::string(chosen) + "'");
}

std::unique_ptr<CpuBackend> make_test_cpu_backend() {
  auto backend = std::make_unique<CpuBackend>(0);
  backend->use_gemm(test_gemm());
  backend->set_num_threads(1);
  return backend;
}

TrainingOutcome train_for(const Config& config, Comm& world, int steps) {
  return train_on(*make_test_cpu_backend(), config, world, steps);
}

TrainingOutcome train_on(Backend& backend, const Config& config, Comm& world, int steps) {
  Mesh mesh = make_mesh(world, config.parallel.sp, config.parallel.ring);
  Trainer trainer(config, backend, mesh);
  TrainingOutcome outcome;
  for (const ParamSpec& spec : trainer.model().table().specs()) {
    outcome.names.insert(outcome.names.end(), size_t(spec.numel), spec.name);
    outcome.weight_decayed.insert(outcome.weight_decayed.end(), size_t(spec.numel),
                                  spec.weight_decay);
  }
  Model& model = trainer.model();
  outcome.weights.emplace_back(outcome.names.size());
  model.download_weights(outcome.weights.back().data());
  for (int i = 0; i < steps; ++i) {
    StepResult step = trainer.train_step();
    outcome.losses.push_back(step.loss);
    outcome.grad_norms.push_back(step.grad_norm);
    outcome.step_grads.emplace_back(outcome.names.size());
    model.download_gradients(outcome.step_grads.back().data());
    outcome.weights.emplace_back(outcome.names.size());
    model.download_weights(outcome.weights.back().data());
  }
  outcome.params = outcome.weights.back();
  if (steps > 0) outcome.grads = outcome.step_grads.back();
  return outcome;
}

std::vector<TraceSpan> traced_step(const Config& config, Comm& world) {
  auto backend = make_test_cpu_backend();
  Mesh mesh = make_mesh(world, config.parallel.sp, config.parallel.ring);
  Trainer trainer(config, *backend, mesh);
  Profiler& profiler = backend->profiler();
  profiler.take_trace();
  profiler.set_trace(true);
  trainer.train_step();
  return profiler.take_trace();
}

}  // namespace ulysses::testing
