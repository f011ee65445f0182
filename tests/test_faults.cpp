// The fault suite (ctest label "faults"; docs/failures.md): what a 4-rank job under real
// mpirun does when a rank is killed or stopped, when a shard is truncated under it, when
// training diverges, and when ranks are started with different configurations. Each test
// checks the exit status, the message, how long the job took to end, and the checkpoints
// left behind.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint_format.h"
#include "data/token_stream.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

#define EXPECT_MENTIONS(text, fragment) \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) << (text)

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

TEST(Faults, DivergingRunStopsWithoutSavingNonFiniteStateAndStaysResumable) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"),
                           job_yaml(dir, 30,
                                    ", lr: 1.0e+6, grad_clip: 0, checkpoint: {dir: " +
                                        dir.file("ckpt") + ", every: 1, keep_last: 2}"));
  auto result =
      run_command("timeout 120 " + testing::mpirun(4) + kTrain + " --config " + dir.file("c.yaml"));
  EXPECT_EQ(result.exit_code, 3) << result.output;
  // Either the loss went non-finite (named with the step) or the state after a step did
  // (the save of that step is refused); both name the step.
  EXPECT_TRUE(result.output.find("not saving step ") != std::string::npos ||
              result.output.find(": the loss is ") != std::string::npos)
      << result.output;
  for (const auto& [step, folder] : checkpoint_step_folders(dir.file("ckpt"))) {
    EXPECT_NO_THROW(verify_checkpoint(folder)) << folder;
    EXPECT_TRUE(read_trainer_state(folder).loss.has_value()) << folder;
  }
  // Its weights are finite but huge: resuming loads them (training on would diverge again).
  expect_latest_intact_and_resumable(dir, 0);
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
