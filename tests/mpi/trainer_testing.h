// Small training runs shared by the multi-rank trainer tests: a tiny model on the synthetic
// recall task, trained for a few steps, with everything a comparison needs gathered whole.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"

namespace ulysses::testing {

// Two layers, d_model 32, 4 heads, seq_len 64, grad_accum 2. kv_heads is llama's only.
Config tiny_training_config(const std::string& family, int kv_heads, int sp, int batch_size);
// Its YAML (llama, 4 kv heads, sp 1, batch 1), for tests that change it with --set overrides.
std::string tiny_training_config_yaml();

struct TrainingOutcome {
  std::vector<std::string> names;    // parameter name of every element
  std::vector<char> weight_decayed;  // whether AdamW decays every element
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<float> params;  // after the last step
  std::vector<float> grads;   // of the last step, reduced over the world
  // weights[t]: the weights step t + 1 was taken at (weights[0] the initial ones);
  // step_grads[t]: its reduced gradient. weights.back() is params, step_grads.back() grads.
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> step_grads;
};

// The cpu backend of the trainer tests: one thread, and the portable GEMM, so that what they
// compare is the same on every x86-64 machine (docs/design.md, "Bits that do not depend on
// the machine"). ULYSSES_TEST_GEMM=openblas runs them on OpenBLAS instead, to check their
// bounds against the kernels it picks (with each OPENBLAS_CORETYPE); the goldens of
// tests/mpi/schedule_test.cpp hold for the portable GEMM only.
std::unique_ptr<CpuBackend> make_test_cpu_backend();
// The GEMM make_test_cpu_backend sets: ULYSSES_TEST_GEMM (openblas or portable, the default).
CpuGemm test_gemm();

// Trains on make_test_cpu_backend() over world split into sp groups.
TrainingOutcome train_for(const Config& config, Comm& world, int steps);
// The same on a given backend; world must carry that backend's buffers.
TrainingOutcome train_on(Backend& backend, const Config& config, Comm& world, int steps);

// The profiler's spans of one training step (make_test_cpu_backend()).
std::vector<TraceSpan> traced_step(const Config& config, Comm& world);

}  // namespace ulysses::testing
