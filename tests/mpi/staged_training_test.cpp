// Ulysses sp = 2 on one GPU, and Ulysses 1 × ring 2: two ranks share the device and exchange
// their bf16 activations and fp32 gradients through StagedComm over MPI. Three AdamW steps give the
// losses and the gradients of one rank training the same batch on the same GPU, within bf16
// tolerances: the split changes GEMM shapes (and so cuBLASLt's summation order), not the maths.
// Skipped, with the reason, without a GPU. The same run on the cpu backend checks the staging path
// of the trainer everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "kernels/backend.h"
#include "parallel/staged_comm.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

// As in tests/test_cuda_training.cpp: the mean loss within 1e-2 relative, the flat gradient
// vectors with cosine similarity >= 0.995.
constexpr double kLossTolerance = 1e-2;
constexpr double kMinGradCosine = 0.995;

using testing::MpiTest;

class StagedTraining : public MpiTest, public ::testing::WithParamInterface<BackendKind> {};

// Trains `distributed` (sp = 2) through a StagedComm over the two ranks and one rank alone
// through a StagedComm of its own, three AdamW steps each.
void expect_staged_matches_one_rank(BackendKind kind, Config distributed) {
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(kind, 0);
  } catch (const DeviceUnavailableError& error) {
    GTEST_SKIP() << error.what();
  }
  backend->set_num_threads(1);
  Config single = testing::tiny_training_config("llama", 2, 1, 2);
  distributed.device = single.device = kind;

  StagedComm alone(make_local_comm(), *backend);
  const testing::TrainingOutcome reference = testing::train_on(*backend, single, alone, 3);
  StagedComm pair(testing::mpi_world().split(0, testing::mpi_world().rank(), "world"), *backend);
  const testing::TrainingOutcome outcome = testing::train_on(*backend, distributed, pair, 3);

  for (int i = 0; i < 3; ++i)
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
  expect_staged_matches_one_rank(GetParam(), testing::tiny_training_config("llama", 2, 2, 2));
}

// Ulysses 1 × ring 2 (docs/parallelism.md, "Ulysses × ring"): the ring's point to point goes
// through StagedComm::send_recv_async and, on cuda, its blocks through the CUDA backend's
// block attention (the base Comm would throw: no point to point).
TEST_P(StagedTraining, RingTwoOnOneDeviceMatchesOneRank) {
  if (world().size() != 2) GTEST_SKIP() << "runs on exactly 2 ranks (ring = 2 on one device)";
  Config ring = testing::tiny_training_config("llama", 2, 2, 2);
  ring.parallel.ring = 2;
  expect_staged_matches_one_rank(GetParam(), ring);
}

INSTANTIATE_TEST_SUITE_P(Backends, StagedTraining,
                         ::testing::Values(BackendKind::cpu, BackendKind::cuda),
                         [](const ::testing::TestParamInfo<BackendKind>& backend) {
                           return std::string(backend.param == BackendKind::cuda ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace ulysses
