// The distributed trainer against the single-rank one (docs/design.md, "Correctness
// evidence"): for both families, sp ∈ {2, 4} and dp×sp = 2×2, the same losses, gradients
// (tensor by tensor) and parameters after 3 AdamW steps as one rank on the same global
// batch; and the all-to-all volume per layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/config.h"
#include "core/trainer.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

using testing::MpiTest;
using testing::tiny_training_config;
using testing::train_for;
using Outcome = testing::TrainingOutcome;

// Tensor by tensor, as tests/test_reference.cpp compares with PyTorch: max |ours - single
// rank| within 1e-5 of the tensor's own largest gradient, so that an error in a small tensor
// (a norm, a bias) is not hidden by the scale of the largest one. A tensor whose exact
// gradient is zero (gpt2's k bias cannot change the softmax) holds round-off only, which
// differs between summation orders: the scale is at least 1% of the largest gradient of all
// (still never looser than one tolerance for the whole gradient).
void expect_gradients_match_per_tensor(const Outcome& outcome, const Outcome& reference,
                                       const std::string& where) {
  double max_grad = 0.0;
  for (float grad : reference.grads) max_grad = std::max(max_grad, double(std::abs(grad)));
  for (const auto& [name, tensor] : testing::gradient_differences(outcome, reference))
    EXPECT_LE(tensor.max_difference, 1e-5 * std::max(tensor.max_reference, 0.01 * max_grad))
        << where << ": gradient of " << name << " differs by " << tensor.max_difference
        << ", its largest element is " << tensor.max_reference;
}

void expect_equivalent(const std::string& family, int kv_heads, int sp, Comm& world) {
  const int dp = world.size() / sp;
  const int batch_per_rank = 2;
  Config distributed = tiny_training_config(family, kv_heads, sp, batch_per_rank);
  Config single = tiny_training_config(family, kv_heads, 1, batch_per_rank * dp);
  auto local = make_local_comm();
  Outcome reference = train_for(single, *local, 3);
  Outcome outcome = train_for(distributed, world, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(outcome.losses[i], reference.losses[i], 1e-5 * std::abs(reference.losses[i]))
        << "step " << i + 1;
    EXPECT_NEAR(outcome.grad_norms[i], reference.grad_norms[i], 1e-4 * reference.grad_norms[i])
        << "step " << i + 1;
  }
  // Gradients tensor by tensor after the first step (the same weights in both runs), as
  // tests/mpi/head_chunks_test.cpp does: each AdamW step magnifies round-off in elements whose
  // gradient is near zero (m/sqrt(v) is ±1 for any tiny gradient), about 20-fold per step
  // here, so by step 3 the gradients are taken at weights that differ by more than round-off.
  const Outcome reference_first = train_for(single, *local, 1);
  const Outcome outcome_first = train_for(distributed, world, 1);
  expect_gradients_match_per_tensor(
      outcome_first, reference_first,
      family + " kv " + std::to_string(kv_heads) + " sp " + std::to_string(sp));
  double max_difference = 0.0, max_value = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < reference.params.size(); ++i) {
    double difference = std::abs(outcome.params[i] - reference.params[i]);
    if (difference > max_difference) {
      max_difference = difference;
      worst = i;
    }
    max_value = std::max(max_value, double(std::abs(reference.params[i])));
  }
  EXPECT_LE(max_difference, 1e-5 * max_value)
      << family << " kv " << kv_heads << " sp " << sp << ": worst element " << worst << " of "
      << reference.names[worst] << ": " << outcome.params[worst] << " vs "
      << reference.params[worst];
}

class TrainerEquivalence : public MpiTest {};

TEST_F(TrainerEquivalence, SequenceParallelOverTheWholeWorld) {
  for (const char* family : {"llama", "gpt2"})
    expect_equivalent(family, 4, world().size(), world());
}

TEST_F(TrainerEquivalence, GroupedQueryAttentionSplitAndReplicated) {
  expect_equivalent("llama", 2, world().size(), world());  // 2 ranks: split, 4: replicate
  expect_equivalent("llama", 1, world().size(), world());  // replicate
}

TEST_F(TrainerEquivalence, DataParallelTimesSequenceParallel) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks for dp 2 x sp 2";
  for (const char* family : {"llama", "gpt2"}) expect_equivalent(family, 4, 2, world());
}

TEST_F(TrainerEquivalence, LayerCheckpointingUnderSequenceParallelism) {
  const int sp = world().size();
  for (const char* family : {"llama", "gpt2"}) {
    Config plain = tiny_training_config(family, 4, sp, 2);
    Config recomputed = plain;
    recomputed.memory.activation_checkpointing = ActivationCheckpointing::layer;
    Outcome a = train_for(plain, world(), 3), b = train_for(recomputed, world(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << family << " step " << i + 1;
    EXPECT_EQ(a.params, b.params) << family;
  }
}

// With sp > 1 attention keeps its own head-split q/k/v/out, so a block keeps only its local
// attention output; the local q/k/v live in the shared scratch during the forward.
TEST_F(TrainerEquivalence, BlocksKeepNoLocalCopiesOfQkvUnderSequenceParallelism) {
  const int sp = world().size();
  Config config = tiny_training_config("llama", 4, sp, 2);
  auto backend = make_backend(BackendKind::cpu, 0);
  Mesh mesh = make_mesh(world(), sp);
  Trainer trainer(config, *backend, mesh);
  const int64_t local_block_bytes = int64_t(config.train.batch_size) * (config.train.seq_len / sp) *
                                    config.model.n_heads * config.model.head_dim() * 4;
  EXPECT_EQ(backend->memory().current(MemCategory::attention),
            config.model.n_layers * local_block_bytes);
}

TEST_F(TrainerEquivalence, DataParallelOnly) {
  for (const char* family : {"llama", "gpt2"}) expect_equivalent(family, 4, 1, world());
}

TEST_F(TrainerEquivalence, AllToAllBytesPerLayerMatchTheAnalyticVolume) {
  const int sp = world().size();
  Config config = tiny_training_config("llama", 4, sp, 2);
  auto backend = make_backend(BackendKind::cpu, 0);
  backend->set_num_threads(1);
  Mesh mesh = make_mesh(world(), sp);
  Trainer trainer(config, *backend, mesh);
  mesh.sp->reset_stats();
  trainer.train_step();
  // Per layer and micro-batch: 4 all-to-alls forward (q, k, v, out), 4 backward (dout, dq,
  // dk, dv), each sending (P-1)/P of a local [B, N/P, H, d] f32 block.
  const int64_t block_bytes = int64_t(config.train.batch_size) * (config.train.seq_len / sp) *
                              config.model.n_heads * config.model.head_dim() * 4;
  const int64_t expected =
      int64_t(config.model.n_layers) * config.train.grad_accum * 8 * block_bytes * (sp - 1) / sp;
  EXPECT_EQ(mesh.sp->stats().all_to_all_bytes, expected);
}

}  // namespace
}  // namespace ulysses
