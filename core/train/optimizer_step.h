// The optimizer step, whole and in one place (after llm.c's gpt2_update and torchtitan's
// optimizer.step()): the gradient reduction finished, the global gradient norm, the verdict
// on the step (non-finite or a spike, the same on every rank), and for a good step AdamW with
// the gradient clipped to train.grad_clip and the new weights published to the compute copies
// (docs/design.md, "A training step"). The trainer calls it once per step.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/train/divergence_guard.h"
#include "core/train/optimizer.h"
#include "parallel/comm.h"

namespace ulysses {

struct OptimizerStepResult {
  double grad_norm = 0.0;
  bool nonfinite = false;  // the loss or the gradient norm, on some rank
  bool spike = false;      // finite, but a spike (core/train/divergence_guard.h)
  std::string spike_reason;
  // Non-finite steps only: the first tensor, in table order, whose gradient holds a NaN or
  // an infinity; "" when every element is finite (the loss was not).
  std::string nonfinite_tensor;

  bool updated() const { return !nonfinite && !spike; }
};

// Collective over world. loss is the step's loss over the global batch (the same on every
// rank); step is the 0-based number of the step taken, whose weights the loss measured;
// lr is its learning rate. A step that is not updated leaves the weights and moments as they
// were.
OptimizerStepResult take_optimizer_step(Model& model, AdamW& optimizer, DivergenceGuard& guard,
                                        Backend& backend, Comm& world, const TrainConfig& train,
                                        double loss, double lr, int64_t step);

}  // namespace ulysses
