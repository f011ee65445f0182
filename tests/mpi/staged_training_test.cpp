// Ulysses sp = 2 on one GPU, and Ulysses 1 × ring 2: two ranks share the device and exchange
// their bf16 activations and fp32 gradients through StagedComm over MPI. Three AdamW steps give the
// losses and the gradients of one rank training the same batch on the same GPU, within bf16
// tolerances: the split changes GEMM shapes (and so cuBLASLt's summation order), not the maths.
// Skipped, with the reason, without a GPU. The same runs on the cpu backend and on the CUDA
// backend's kernels emulated on the host (tests/emulated_cuda_backend.h, bf16 as on the GPU)
// check the staging path of the trainer, and the CUDA ring's blocks and merges, everywhere.
// Mutation caught by the emulated ring case: the merge kernel's lse without its log-sum term
// (gradient cosine 0.936).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "kernels/backend.h"
#include "parallel/staged_comm.h"
#include "tests/emulated_cuda_backend.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

// As in tests/test_cuda_training.cpp: the mean loss within 1e-2 relative, the flat gradient
// vectors with cosine similarity >= 0.995.
constexpr double kLossTolerance = 1e-2;
constexpr double kMinGradCosine = 0.995;

using testing::MpiTest;

enum class Column { cpu, cuda_kernels_on_host, cuda_on_gpu };

class StagedTraining : public MpiTest, public ::testing::WithParamInterface<Column> {};

// The tiny llama of the trainer tests with sp ranks. The emulated column runs every warp of the
// CUDA kernels on host threads, two orders of magnitude slower than the cpu backend: there one
// layer, one short sequence per micro-step and one step (steps_for) keep a case near half a
// minute.
Config staged_config(Column column, int sp) {
  if (column != Column::cuda_kernels_on_host)
    return testing::tiny_training_config("llama", 2, sp, 2);
  Config config = testing::tiny_training_config("llama", 2, sp, 1);
  config.model.n_layers = 1;
  config.train.seq_len = 32;
  config.train.grad_accum = 1;
  return config;
}

int steps_for(Column column) {
  return column == Column::cuda_kernels_on_host ? 1 : 3;
}

// Trains `distributed` (sp = 2) through a StagedComm over the two ranks and one rank alone
// through a StagedComm of its own, steps_for(column) AdamW steps each.
void expect_staged_matches_one_rank(Column column, Config distributed) {
  std::unique_ptr<Backend> backend;
  try {
    backend = column == Column::cuda_kernels_on_host
                  ? make_emulated_cuda_backend()
                  : make_backend(column == Column::cpu ? BackendKind::cpu : BackendKind::cuda, 0);
  } catch (const DeviceUnavailableError& error) {
    GTEST_SKIP() << error.what();
  }
  backend->set_num_threads(1);
  Config single = staged_config(column, 1);
  distributed.device = single.device = column == Column::cpu ? Device::cpu : Device::cuda;

  StagedComm alone(make_local_comm(), *backend);
  const testing::TrainingOutcome reference =
      testing::train_on(*backend, single, alone, steps_for(column));
  StagedComm pair(testing::mpi_world().split(0, testing::mpi_world().rank(), "world"), *backend);
  const testing::TrainingOutcome outcome =
      testing::train_on(*backend, distributed, pair, steps_for(column));

  for (int i = 0; i < steps_for(column); ++i)
    EXPECT_NEAR(outcome.losses[i], reference.losses[i], kLossTolerance * reference.losses[i])
        << "step " << i + 1;
  double dot = 0.0, norm = 0.0, reference_norm = 0.0;
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    dot += double(outcome.grads[i]) * reference.grads[i];
    norm += double(outcome.grads[i]) * outcome.grads[i];
    reference_norm += double(reference.grads[i]) * reference.grads[i];
  }
  EXPECT_GE(dot / std::sqrt(norm * reference_norm), kMinGradCosine);
  // The gradients were reduced through the staged world (the all-to-alls run on its sp split).
  EXPECT_GT(pair.stats().reduce_bytes, 0);
  EXPECT_GT(pair.staging_bytes(), 0u);
}

TEST_P(StagedTraining, SpTwoOnOneDeviceMatchesOneRank) {
  if (world().size() != 2) GTEST_SKIP() << "runs on exactly 2 ranks (sp = 2 on one device)";
  if (GetParam() == Column::cuda_kernels_on_host)
    GTEST_SKIP() << "the emulated column runs the ring case alone (half a minute a case); the "
                    "staging path is the cpu column's";
  expect_staged_matches_one_rank(GetParam(), staged_config(GetParam(), 2));
}

// Ulysses 1 × ring 2 (docs/parallelism.md, "Ulysses × ring"): the ring's point to point goes
// through StagedComm::send_recv_async and, on cuda, its blocks through the CUDA backend's
// block attention (the base Comm would throw: no point to point).
TEST_P(StagedTraining, RingTwoOnOneDeviceMatchesOneRank) {
  if (world().size() != 2) GTEST_SKIP() << "runs on exactly 2 ranks (ring = 2 on one device)";
  Config ring = staged_config(GetParam(), 2);
  ring.parallel.ring = 2;
  expect_staged_matches_one_rank(GetParam(), ring);
}

INSTANTIATE_TEST_SUITE_P(Backends, StagedTraining,
                         ::testing::Values(Column::cpu, Column::cuda_kernels_on_host,
                                           Column::cuda_on_gpu),
                         [](const ::testing::TestParamInfo<Column>& column) {
                           switch (column.param) {
                             case Column::cpu:
                               return std::string("cpu");
                             case Column::cuda_kernels_on_host:
                               return std::string("cuda_kernels_on_host");
                             case Column::cuda_on_gpu:
                               break;
                           }
                           return std::string("cuda");
                         });

}  // namespace
}  // namespace ulysses
