// The divergence guard (core/train/divergence_guard.h, docs/failures.md#loss-spikes): which losses
// are spikes, and which checkpoint is the one to go back to: the newest whose weights a normal
// step measured (a step's loss measures the weights the step before it left).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "core/train/divergence_guard.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

TEST(DivergenceGuard, NothingIsASpikeBeforeTheFirstNormalStep) {
  TrainConfig train;
  DivergenceGuard guard(train, 100);
  EXPECT_EQ(guard.spike(1e30), "");
}

TEST(DivergenceGuard, ASpikeIsALossFarAboveTheLargerOfItsMeanAndUniformGuessing) {
  TrainConfig train;
  ASSERT_EQ(train.spike_loss_factor, 3.0);
  const double uniform = std::log(100.0);
  DivergenceGuard guard(train, 100);
  guard.step_done(0, true, 4.0);  // below ln(100): the floor is the reference
  EXPECT_EQ(guard.spike(3.0 * uniform * 0.999), "");
  EXPECT_MENTIONS(guard.spike(3.0 * uniform * 1.001), "times 4.605, the larger of");
  // A loss that has fallen close to 0: a jump of 10^5 times the mean is no spike while it
  // stays within 3 ln(vocab_size) (a curriculum's longer stage does that).
  for (int step = 1; step <= 40; ++step) guard.step_done(step, true, 1e-4);
  EXPECT_EQ(guard.spike(10.0), "");
  EXPECT_NE(guard.spike(14.0), "");

  // Above the floor (a vocabulary of 2: ln 2), the running mean is the reference.
  DivergenceGuard high(train, 2);
  high.step_done(0, true, 5.0);
  EXPECT_EQ(high.spike(14.9), "");
  EXPECT_MENTIONS(high.spike(15.1), "the running mean of the loss (5)");
}

TEST(DivergenceGuard, TheMeanFollowsTheLastSixteenNormalStepsAndIgnoresSpikes) {
  TrainConfig train;
  DivergenceGuard guard(train, 2);
  guard.step_done(0, true, 10.0);
  guard.step_done(1, false, 1e9);  // a spike does not join the mean
  guard.step_done(2, true, 20.0);
  EXPECT_EQ(guard.record().loss_mean, 15.0);  // the exact mean while there are < 16 steps
  EXPECT_EQ(guard.record().normal_steps, 2);
  // 14 more steps of 1 fill the window: the mean of 16 is (10 + 20 + 14) / 16 = 2.75. Each
  // further step takes 1/16 of the way to 1.
  for (int step = 3; step < 17; ++step) guard.step_done(step, true, 1.0);
  EXPECT_DOUBLE_EQ(guard.record().loss_mean, 2.75);
  for (int step = 17; step < 50; ++step) guard.step_done(step, true, 1.0);
  EXPECT_NEAR(guard.record().loss_mean, 1.0 + 1.75 * std::pow(15.0 / 16.0, 33), 1e-12);
}

TEST(DivergenceGuard, FactorZeroChecksNothing) {
  TrainConfig train;
  train.spike_loss_factor = 0.0;
  DivergenceGuard guard(train, 100);
  guard.step_done(0, true, 4.0);
  EXPECT_EQ(guard.spike(1e30), "");
}

TEST(DivergenceGuard, ACheckpointIsGoodOnceTheStepAfterItWasNormal) {
  TrainConfig train;
  DivergenceGuard guard(train, 100);
  guard.step_done(0, true, 4.0);  // step 1 measured the initial weights
  guard.checkpoint_saved(1, "ck/step_00000001");
  EXPECT_EQ(guard.good_checkpoint(), "") << "no step has measured step 1's weights yet";
  guard.step_done(1, true, 3.9);  // step 2 measured them: normal
  EXPECT_EQ(guard.good_checkpoint(), "ck/step_00000001");
  EXPECT_EQ(guard.record().good_step, 1);
  guard.checkpoint_saved(2, "ck/step_00000002");
  guard.step_done(2, false, 5e13);                // step 3 measured step 2's weights: a spike
  guard.checkpoint_saved(3, "ck/step_00000003");  // a skipped step: still step 2's weights
  guard.step_done(3, false, 6e13);
  EXPECT_EQ(guard.good_checkpoint(), "ck/step_00000001");
  const std::string advice = guard.go_back_advice();
  EXPECT_MENTIONS(advice,
                  "The newest checkpoint saved before the trouble began is ck/step_00000001");
  EXPECT_MENTIONS(advice, "--resume ck/step_00000001");
  EXPECT_MENTIONS(advice, "train.checkpoint.overwrite: true");
  // A checkpoint written after a step that measured older weights is not vouched for.
  guard.step_done(5, true, 3.0);
  EXPECT_EQ(guard.good_checkpoint(), "ck/step_00000001");
}

// The lr = 1e6 case of docs/failures.md: step 1 is normal but its update blows the weights up,
// so step 1's checkpoint is not one to go back to.
TEST(DivergenceGuard, WithoutAMeasuredCheckpointTheAdviceIsToStartAgain) {
  TrainConfig train;
  train.grad_clip = 0.0;
  DivergenceGuard guard(train, 100);
  guard.step_done(0, true, 4.05);
  guard.checkpoint_saved(1, "ck/step_00000001");
  ASSERT_NE(guard.spike(5.2e13), "");
  guard.step_done(1, false, 5.2e13);
  EXPECT_EQ(guard.good_checkpoint(), "");
  EXPECT_MENTIONS(guard.go_back_advice(), "No checkpoint was saved before the trouble began");
  EXPECT_MENTIONS(guard.go_back_advice(), "a lower train.lr or a train.grad_clip");
}

TEST(DivergenceGuard, AResumedRunJudgesAndGoesBackAsTheUninterruptedOne) {
  testing::TempDir dir;
  TrainConfig train;
  DivergenceGuard run(train, 2);
  for (int step = 0; step < 5; ++step) {
    run.step_done(step, true, 8.0 - step);
    run.checkpoint_saved(step + 1, dir.file(checkpoint_folder_name(step + 1)));
  }
  // Saved at step 5: step 4's checkpoint is the good one.
  const GuardRecord record = run.record();
  ASSERT_EQ(record.good_step, 4);
  std::filesystem::create_directory(dir.file(checkpoint_folder_name(4)));
  DivergenceGuard resumed(train, 2);
  resumed.resumed(dir.file(checkpoint_folder_name(5)), 5, record);
  EXPECT_EQ(resumed.good_checkpoint(), dir.file(checkpoint_folder_name(4)));
  EXPECT_EQ(resumed.spike(17.9), run.spike(17.9));
  EXPECT_EQ(resumed.spike(18.1), run.spike(18.1));
  EXPECT_NE(resumed.spike(18.1), "");
  // Its first normal step vouches for the checkpoint it resumed from.
  resumed.step_done(5, true, 3.0);
  EXPECT_EQ(resumed.good_checkpoint(), dir.file(checkpoint_folder_name(5)));

  // A good checkpoint that is gone (pruned by an earlier build, deleted) is not named.
  DivergenceGuard elsewhere(train, 2);
  elsewhere.resumed(dir.file("other/" + checkpoint_folder_name(5)), 5, record);
  EXPECT_EQ(elsewhere.good_checkpoint(), "");
}

}  // namespace
}  // namespace ulysses
