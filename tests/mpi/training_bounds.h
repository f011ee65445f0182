// How far the training of two configurations that compute the same sums in other orders (sp
// against one rank, ZeRO stages against replicated state) may differ, derived from fp32
// arithmetic rather than measured on one machine (docs/design.md, "Bits that do not depend on
// the machine"). Both outcomes must come from train_for with the same steps (2 or more).
#pragma once

#include <cstdint>
#include <string>

#include "core/config/config.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses::testing {

// fp32's unit round-off u.
constexpr double kUnitRoundoff = 0x1p-24;

// Tokens whose contributions the gradient of one step sums, over the whole world:
// grad_accum × batch_size × dp × seq_len.
int64_t tokens_per_step(const Config& config, int world_size);

// Two fp32 sums of the same n terms, grouped and ordered differently, differ by at most
// 2(n − 1)·u·Σ|terms|: each is within (n − 1)·u·Σ|terms| of the exact sum (Higham, "Accuracy
// and Stability of Numerical Algorithms", §4.2).
double summation_order_bound(int64_t terms);

// Checks, with each bound and why it holds written beside its assertion:
// - step 1, at the same weights: every gradient tensor and the gradient norm, which differ
//   only in the order of fp32 sums over the step's tokens;
// - step 1: every parameter, through AdamW's normalisation of those gradients;
// - every step, in each run: the weights are AdamW of its own gradients, bit for bit;
// - every step: the loss, to first order in how far the weights it was taken at differ;
// - the last step: every parameter within a tenth of what AdamW can move it.
void expect_same_training(const TrainingOutcome& value, const TrainingOutcome& reference,
                          const Config& config, int64_t tokens, const std::string& where);

}  // namespace ulysses::testing
