// Small training runs shared by the multi-rank trainer tests: a tiny model on the synthetic
// recall task, trained for a few steps, with everything a comparison needs gathered whole.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "kernels/backend.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"

namespace ulysses::testing {

// Two layers, d_model 32, 4 heads, seq_len 64, grad_accum 2. kv_heads is llama's only.
Config tiny_training_config(const std::string& family, int kv_heads, int sp, int batch_size);

struct TrainingOutcome {
  std::vector<std::string> names;  // parameter name of every element
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<float> params;
  std::vector<float> grads;  // of the last step, reduced over the world
};

// Trains on the CPU backend (one thread) over world split into sp groups.
TrainingOutcome train_for(const Config& config, Comm& world, int steps);
// The same on a given backend; world must carry that backend's buffers.
TrainingOutcome train_on(Backend& backend, const Config& config, Comm& world, int steps);

// The profiler's spans of one training step (cpu backend, one thread).
std::vector<TraceSpan> traced_step(const Config& config, Comm& world);

// Per parameter tensor of the last step's gradients: max |value - reference| and
// max |reference| over its elements.
struct TensorDifference {
  double max_difference = 0.0;
  double max_reference = 0.0;
};
std::map<std::string, TensorDifference> gradient_differences(const TrainingOutcome& value,
                                                             const TrainingOutcome& reference);

// max |a - b| / max |reference| over the elements.
double max_relative_difference(const std::vector<float>& value,
                               const std::vector<float>& reference);

}  // namespace ulysses::testing
