// The fault suite (ctest label "faults"; docs/failures.md): what a 4-rank job under real
// mpirun does when a rank is killed or stopped, when a shard is truncated under it, when
// training diverges, when an overwrite fails before its first checkpoint, and when ranks are
// started with different configurations. Each test
// checks the exit status, the message, how long the job took to end, and the checkpoints
// left behind.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "data/token_stream.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

// A 4-rank job (sp 4) whose steps take tens of milliseconds, so that signals land mid-step.
const std::string kSyntheticData =
    "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n";

std::string job_yaml(const TempDir& dir, int steps, const std::string& train_extra,
                     const std::string& data = kSyntheticData,
                     const std::string& parallel_extra = "") {
  return "model: {family: llama, n_layers: 2, d_model: 64, n_heads: 4, d_ff: 128, vocab_size: "
         "100}\n"
         "train: {steps: " +
         std::to_string(steps) + ", batch_size: 2, seq_len: 512, seed: 3" + train_extra + "}\n" +
         data + "parallel: {sp: 4" + parallel_extra +
         "}\nlog: {every: 1, metrics_file: " + dir.file("m.jsonl") + "}\n";
}

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Starts the job in the background, waits `delay` seconds, then runs `action` (bash, with
// $RANK2 = the pid of world rank 2), and waits for the job. The output ends with
// "job exit N after M ms" (counted from the action).
testing::CommandResult run_and_disturb(const std::string& config, double delay,
                                       const std::string& action) {
  const std::string script =
      testing::mpirun(4) + kTrain + " --config " + config + " > " + config +
      ".log 2>&1 & job=$!\n" + "sleep " + std::to_string(delay) + "\n" +
      "RANK2=$(for p in $(pgrep -f -- '--config " + config +
      "$'); do "
      "grep -qz '^OMPI_COMM_WORLD_RANK=2$' /proc/$p/environ 2>/dev/null && echo $p; done | head "
      "-1)\n"
      "start=$(date +%s%N)\n" +
      action +
      "\n"
      "wait $job; code=$?\n"
      "cat " +
      config +
      ".log\n"
      "echo \"job exit $code after $((($(date +%s%N) - start) / 1000000)) ms\"\n"
      "exit $code\n";
  testing::write_text_file(config + ".sh", script);
  return run_command("timeout 120 bash " + config + ".sh");
}

double seconds_after_action(const std::string& output) {
  const size_t at = output.rfind("after ");
  return at == std::string::npos ? 1e9 : std::stod(output.substr(at + 6)) / 1000.0;
}

// The checkpoint `latest` names verifies, and a run resumes from it and trains more_steps.
void expect_latest_intact_and_resumable(const TempDir& dir, int more_steps) {
  const std::string ckpt = dir.file("ckpt");
  const std::string latest = testing::read_text_file(ckpt + "/latest");
  ASSERT_FALSE(latest.empty()) << "no latest in " << ckpt;
  const std::string folder = ckpt + "/" + latest.substr(0, latest.find('\n'));
  EXPECT_NO_THROW(verify_checkpoint(folder)) << folder;
  const int64_t step = read_trainer_state(folder).step;
  testing::write_text_file(
      dir.file("resume.yaml"),
      job_yaml(dir, int(step) + more_steps, ", checkpoint: {dir: " + ckpt + ", every: 1}"));
  auto resumed = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                             dir.file("resume.yaml") + " --resume auto");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_MENTIONS(resumed.output, "resumed from " + folder + " at step " + std::to_string(step));
}

TEST(Faults, SigkillOfANonZeroRankEndsTheJobAndLeavesAnIntactCheckpoint) {
  TempDir dir;
  testing::write_text_file(
      dir.file("c.yaml"),
      job_yaml(dir, 100000, ", checkpoint: {dir: " + dir.file("ckpt") + ", every: 2}"));
  auto result = run_and_disturb(dir.file("c.yaml"), 4.0, "kill -KILL $RANK2");
  EXPECT_EQ(result.exit_code, 137) << result.output;
  EXPECT_MENTIONS(result.output, "rank 2");
  EXPECT_MENTIONS(result.output, "signal 9");
  EXPECT_LT(seconds_after_action(result.output), 15.0) << result.output;
  expect_latest_intact_and_resumable(dir, 2);
}

TEST(Faults, StoppedRankTripsTheWatchdogWhichEndsTheJobNamingWhereItWaited) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"),
                           job_yaml(dir, 100000, "", kSyntheticData, ", timeout_s: 10"));
  auto result = run_and_disturb(dir.file("c.yaml"), 4.0, "kill -STOP $RANK2");
  EXPECT_EQ(result.exit_code, 4) << result.output;
  EXPECT_MENTIONS(result.output, "watchdog: rank ");
  EXPECT_MENTIONS(result.output, "on communicator '");
  EXPECT_MENTIONS(result.output, "in step ");
  EXPECT_MENTIONS(result.output, "phase '");
  EXPECT_MENTIONS(result.output, "parallel.timeout_s is 10");
  EXPECT_LT(seconds_after_action(result.output), 30.0) << result.output;
}

TEST(Faults, ShardTruncatedWhileTheJobRunsEndsItWithADataErrorNamingTheFile) {
  TempDir dir;
  std::vector<int32_t> tokens(400000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919) % 100);
  const std::string shard = dir.file("shard.bin");
  write_token_shard(shard, tokens, 1);
  const std::string bytes_before = std::to_string(fs::file_size(shard));
  testing::write_text_file(
      dir.file("c.yaml"),
      job_yaml(dir, 100000, "", "data: {source: tokens, path: " + shard + "}\n"));
  auto result = run_and_disturb(dir.file("c.yaml"), 4.0, "truncate -s 5000 " + shard);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_MENTIONS(result.output, shard);
  EXPECT_MENTIONS(result.output, bytes_before + " bytes when the run started, now 5000");
  EXPECT_EQ(result.output.find("Bus error"), std::string::npos) << result.output;
  EXPECT_LT(seconds_after_action(result.output), 15.0) << result.output;
}

// The case of issue 26: at lr = 1e6 step 1 is normal, but its update blows the weights up, so
// step 1's checkpoint already holds them and is no state to go back to.
TEST(Faults, DivergingRunStopsWithoutSavingNonFiniteStateAndStaysResumable) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"),
                           job_yaml(dir, 30,
                                    ", lr: 1.0e+6, grad_clip: 0, checkpoint: {dir: " +
                                        dir.file("ckpt") + ", every: 1, keep_last: 2}"));
  auto result =
      run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " + dir.file("c.yaml"));
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_MENTIONS(result.output, "step 2: ");
  EXPECT_MENTIONS(result.output, "No checkpoint was saved before the trouble began");
  for (const auto& [step, folder] : checkpoint_step_folders(dir.file("ckpt"))) {
    EXPECT_NO_THROW(verify_checkpoint(folder)) << folder;
    EXPECT_TRUE(read_trainer_state(folder).loss.has_value()) << folder;
  }
  // Its weights are finite but huge: resuming loads them (training on would diverge again).
  expect_latest_intact_and_resumable(dir, 0);

  // Skipping such steps does not help, since the weights themselves are broken: it stops
  // after train.max_skipped_steps of them instead of finishing with a loss of 1e15.
  testing::write_text_file(dir.file("skip.yaml"),
                           job_yaml(dir, 30,
                                    ", lr: 1.0e+6, grad_clip: 0, on_nonfinite: skip, "
                                    "max_skipped_steps: 3"));
  auto skipping = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                              dir.file("skip.yaml"));
  EXPECT_EQ(skipping.exit_code, 3) << skipping.output;
  EXPECT_MENTIONS(skipping.output, "step 5: ");
  EXPECT_MENTIONS(skipping.output,
                  "That is 4 non-finite or spike steps in a row, more than "
                  "train.max_skipped_steps = 3");
}

// Trouble that begins later: the checkpoint saved before it is named, survives keep_last
// pruning while skipped steps write newer ones, and training goes on from it.
TEST(Faults, DivergingRunNamesTheCheckpointToGoBackToAndKeepsIt) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::string checkpoints = "checkpoint: {dir: " + ckpt + ", every: 1, keep_last: 2}";
  testing::write_text_file(dir.file("good.yaml"), job_yaml(dir, 4, ", " + checkpoints));
  auto good = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                          dir.file("good.yaml"));
  ASSERT_EQ(good.exit_code, 0) << good.output;
  // Step 5 measures step 4's weights (normal), then its update at lr = 1e6 blows them up: every
  // later step is a spike or not finite, and is skipped.
  testing::write_text_file(dir.file("bad.yaml"),
                           job_yaml(dir, 30,
                                    ", lr: 1.0e+6, grad_clip: 0, on_nonfinite: skip, "
                                    "max_skipped_steps: 3, " +
                                        checkpoints));
  auto bad = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                         dir.file("bad.yaml") + " --resume auto");
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  const std::string step4 = ckpt + "/step_00000004";
  EXPECT_MENTIONS(bad.output, "step 9: ");
  EXPECT_MENTIONS(bad.output, "That is 4 non-finite or spike steps in a row");
  EXPECT_MENTIONS(bad.output, "The newest checkpoint saved before the trouble began is " + step4);
  EXPECT_MENTIONS(bad.output, "a spike: the loss");
  // keep_last 2 keeps steps 8 and 7 (weights of step 5, skipped since), and step 4.
  std::vector<int64_t> steps;
  for (const auto& [step, folder] : checkpoint_step_folders(ckpt)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{8, 7, 4}));
  EXPECT_NO_THROW(verify_checkpoint(step4));

  // Going back to it with the learning rate that worked trains on normally, replacing the
  // newer checkpoints (with train.checkpoint.overwrite: the folders on disk decide).
  testing::write_text_file(dir.file("m.jsonl"), "");
  auto back = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                          dir.file("good.yaml") + " --resume " + step4 +
                          " --set train.steps=6 --set train.checkpoint.overwrite=true");
  EXPECT_EQ(back.exit_code, 0) << back.output;
  const std::vector<double> losses = testing::read_step_losses(dir.file("m.jsonl"));
  ASSERT_EQ(losses.size(), 2u) << back.output;
  for (double loss : losses) EXPECT_LT(loss, std::log(100.0)) << back.output;
  steps.clear();
  for (const auto& [step, folder] : checkpoint_step_folders(ckpt)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{6, 5}));
}

// A run that replaces another's checkpoints (train.checkpoint.overwrite) and fails before its
// first checkpoint on a token that one rank reads: MPI_Abort ends the job, and the earlier
// checkpoints are exactly as they were.
TEST(Faults, OverwriteThatOneRankFailsLeavesTheEarlierCheckpointsByteForByte) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  testing::write_text_file(dir.file("c.yaml"),
                           job_yaml(dir, 2, ", checkpoint: {dir: " + ckpt + ", every: 1}"));
  auto first =
      run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " + dir.file("c.yaml"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = testing::snapshot_files(ckpt);
  // Sequence 0's tokens 256-383 are sp rank 2's slice.
  std::vector<int32_t> tokens(40000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919) % 100);
  tokens[300] = 1000;
  write_token_shard(dir.file("shard.bin"), tokens, 1);
  testing::write_text_file(
      dir.file("over.yaml"),
      job_yaml(dir, 2, ", checkpoint: {dir: " + ckpt + ", every: 1, overwrite: true}",
               "data: {source: tokens, path: " + dir.file("shard.bin") + ", order: sequential}\n"));
  auto over = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                          dir.file("over.yaml"));
  EXPECT_EQ(over.exit_code, 2) << over.output;
  EXPECT_MENTIONS(over.output, "is 1000, not below model.vocab_size = 100");
  EXPECT_MENTIONS(over.output, "this run replaces the 2 checkpoint(s) of an earlier run");
  EXPECT_EQ(testing::snapshot_files(ckpt), before);
}

// A checkpoint that one rank cannot write: rank 2 runs under `ulimit -f 64` (64 KiB per file),
// as a full disk or a quota would stop it, and its optimizer shard is larger. Every rank exits 1
// within seconds without MPI_Abort, rank 2 saying why; no temporary folder is left; the earlier
// checkpoints are byte for byte as they were; and without the limit --resume auto goes on.
// Shared memory between ranks is off: Open MPI sizes its segment with ftruncate, which the
// limit would refuse.
TEST(Faults, ACheckpointOneRankCannotWriteEndsTheJobOnEveryRankAndKeepsTheEarlierOnes) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::string checkpoint = ", checkpoint: {dir: " + ckpt + ", every: 1}";
  testing::write_text_file(dir.file("two.yaml"),
                           job_yaml(dir, 2, checkpoint, kSyntheticData, ", zero_stage: 1"));
  testing::write_text_file(dir.file("three.yaml"),
                           job_yaml(dir, 3, checkpoint, kSyntheticData, ", zero_stage: 1"));
  auto first = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                           dir.file("two.yaml"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const uint64_t shard_bytes = fs::file_size(ckpt + "/step_00000002/" + optimizer_file_name(2, 4));
  ASSERT_GT(shard_bytes, 64u * 1024) << "the shard must be larger than rank 2 may write";
  const auto before = testing::snapshot_files(ckpt);
  testing::write_text_file(dir.file("limited.sh"),
                           "if [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then ulimit -f 64; fi\n"
                           "exec \"$@\"\n");
  testing::CommandResult limited;
  const double seconds = seconds_of([&] {
    limited = run_command("OMPI_MCA_btl=self,tcp timeout 120 " + testing::mpirun(4) + "bash " +
                          dir.file("limited.sh") + " " + kTrain + " --config " +
                          dir.file("three.yaml") + " --resume auto");
  });
  EXPECT_EQ(limited.exit_code, 1) << limited.output;
  EXPECT_MENTIONS(limited.output, "[rank 2] error the checkpoint of step 3 could not be written");
  EXPECT_MENTIONS(limited.output, "File too large");
  EXPECT_EQ(limited.output.find("MPI_ABORT"), std::string::npos) << limited.output;
  EXPECT_LT(seconds, 60.0);
  EXPECT_FALSE(fs::exists(ckpt + "/.tmp-step_00000003"));
  EXPECT_TRUE(testing::snapshot_files(ckpt) == before) << "the folder changed";
  auto resumed = run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " +
                             dir.file("three.yaml") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(find_latest_checkpoint(ckpt), ckpt + "/step_00000003");
}

struct Mismatch {
  const char* name;
  const char* key;
  const char* first;
  const char* second;
};

class MpmdMismatch : public ::testing::TestWithParam<Mismatch> {};

TEST_P(MpmdMismatch, ExitsTwoOnEveryRankWithinSecondsNamingTheKeyRanksAndValues) {
  const Mismatch& mismatch = GetParam();
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), job_yaml(dir, 4, ""));
  const std::string half = kTrain + " --config " + dir.file("c.yaml") + " --set " + mismatch.key;
  testing::CommandResult result;
  const double seconds = seconds_of([&] {
    result = run_command("timeout 60 " + testing::mpirun(2) + half + "=" + mismatch.first +
                         " : -np 2 " + half + "=" + mismatch.second);
  });
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_LT(seconds, 10.0) << result.output;
  // Every rank returned 2 by itself: nobody had to be aborted.
  EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
  EXPECT_MENTIONS(result.output, std::string(mismatch.key) + ": rank 0 has '" + mismatch.first +
                                     "', ranks 2, 3 have '" + mismatch.second + "'");
}

INSTANTIATE_TEST_SUITE_P(Keys, MpmdMismatch,
                         ::testing::Values(Mismatch{"n_layers", "model.n_layers", "2", "3"},
                                           Mismatch{"steps", "train.steps", "4", "6"},
                                           Mismatch{"d_model", "model.d_model", "32", "64"},
                                           Mismatch{"lr", "train.lr", "0.001", "0.002"},
                                           Mismatch{"seed", "train.seed", "3", "4"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ulysses
