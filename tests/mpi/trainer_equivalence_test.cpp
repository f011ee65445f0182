// The distributed trainer against the single-rank one (docs/design.md, "Correctness
// evidence"): for both families, sp ∈ {2, 4} and dp×sp = 2×2, 3 AdamW steps on the same
// global batch as one rank, within bounds derived from fp32 arithmetic
// (tests/mpi/training_bounds.h): the first step's gradients (tensor by tensor) and
// parameters, every loss, the last parameters; and the all-to-all volume per layer.
#include <gtest/gtest.h>

#include <string>

#include "core/config/config.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"
#include "tests/mpi/training_bounds.h"

namespace ulysses {
namespace {

using testing::MpiTest;
using testing::tiny_training_config;
using testing::train_for;
using Outcome = testing::TrainingOutcome;

// One rank sums every weight gradient over all the step's tokens in one GEMM; sp ranks each
// sum their slice and then reduce, and replicated kv heads add their dK and dV across ranks:
// the same sums in another order, within the bounds of tests/mpi/training_bounds.h (which
// say why each holds).
void expect_equivalent(const std::string& family, int kv_heads, int sp, Comm& world) {
  const int dp = world.size() / sp;
  const int batch_per_rank = 2;
  Config distributed = tiny_training_config(family, kv_heads, sp, batch_per_rank);
  Config single = tiny_training_config(family, kv_heads, 1, batch_per_rank * dp);
  auto local = make_local_comm();
  const Outcome reference = train_for(single, *local, 3);
  const Outcome outcome = train_for(distributed, world, 3);
  testing::expect_same_training(
      outcome, reference, distributed, testing::tokens_per_step(distributed, world.size()),
      family + " kv " + std::to_string(kv_heads) + " sp " + std::to_string(sp));
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

// With sp > 1 attention keeps its own head-split q/k/v/out (made in the forward), so a block
// holds only its local attention output up front; q/k/v are projected straight into the
// all-to-all's send buffers and never exist in this rank's token layout.
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
