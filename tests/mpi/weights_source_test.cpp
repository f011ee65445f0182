// Weights that eval, sample and model.init_from read from a checkpoint dir while a run may be
// saving into it and pruning it (core/checkpoint/weights_source.h): the newest checkpoint is
// chosen once, on rank 0, for every rank; a folder removed before every rank opened it is
// chosen again; one that keeps vanishing ends the job on every rank with status 2.
#include "core/checkpoint/weights_source.h"

#include <gtest/gtest.h>

#include <string>

#include "core/config/config.h"
#include "parallel/exit_code.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

const std::string kCorpus = ULYSSES_SOURCE_DIR "/tests/bad_inputs";
const std::string kCheckpointDir = kCorpus + "/checkpoints/good";
const std::string kStepFolder = kCheckpointDir + "/step_00000002";

class WeightsSourceTest : public testing::MpiTest {
 protected:
  ModelConfig model_ = load_config(kCorpus + "/configs/tiny.yaml", {}).model;
  int resolved_ = 0;  // this rank's calls of the resolver
};

TEST_F(WeightsSourceTest, ACheckpointDirIsResolvedOnceForEveryRank) {
  // Each rank would choose another step if it resolved the dir itself, as a run saving into it
  // meanwhile could make them do.
  const int rank = world().rank();
  const OpenedWeights opened = open_agreed_weights(
      world(), kCheckpointDir,
      [&](const std::string&) {
        ++resolved_;
        return rank == 0 ? kStepFolder : kCheckpointDir + "/step_" + std::to_string(rank);
      },
      model_);
  EXPECT_EQ(resolved_, rank == 0 ? 1 : 0);
  EXPECT_EQ(opened.path, kStepFolder);
  ASSERT_NE(opened.weights, nullptr);
}

TEST_F(WeightsSourceTest, AFolderPrunedBeforeEveryRankOpenedItIsChosenAgain) {
  const std::string pruned = kCheckpointDir + "/step_00000001";  // as a prune leaves it: gone
  const OpenedWeights opened = open_agreed_weights(
      world(), kCheckpointDir,
      [&](const std::string&) { return ++resolved_ == 1 ? pruned : kStepFolder; }, model_);
  EXPECT_EQ(resolved_, world().rank() == 0 ? 2 : 0);
  EXPECT_EQ(opened.path, kStepFolder);
  ASSERT_NE(opened.weights, nullptr);
}

TEST_F(WeightsSourceTest, AFolderThatKeepsVanishingEndsTheJobOnEveryRank) {
  try {
    open_agreed_weights(
        world(), kCheckpointDir,
        [&](const std::string&) {
          return kCheckpointDir + "/step_0000010" + std::to_string(++resolved_);
        },
        model_);
    ADD_FAILURE() << "weights that were never there were opened";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
  }
  EXPECT_EQ(resolved_, world().rank() == 0 ? 3 : 0);
}

// A step folder given as it is is not resolved again when it cannot be read: it was chosen
// by the user, not by the resolver.
TEST_F(WeightsSourceTest, AStepFolderThatCannotBeReadIsNotChosenAgain) {
  const std::string missing = kCheckpointDir + "/step_00000042";
  try {
    open_agreed_weights(
        world(), missing,
        [&](const std::string& path) {
          ++resolved_;
          return path;
        },
        model_);
    ADD_FAILURE() << "a missing step folder was opened";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
  }
  EXPECT_EQ(resolved_, world().rank() == 0 ? 1 : 0);
}

}  // namespace
}  // namespace ulysses
