// Disk space for checkpoints (core/checkpoint/checkpoint_space.h, docs/failures.md#a-full-disk):
// the size of one checkpoint against the files a save writes, the steps a run saves, the
// verdicts before the first step and before each save, and what a run does with a folder too
// small for one checkpoint and with the temporary folders a kill left. A write that fails on
// one rank of four is in the fault suite (tests/test_faults.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_space.h"
#include "kernels/memory.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
constexpr uint64_t kMiB = 1024 * 1024;

std::string small_run_yaml(const std::string& checkpoint_dir, int steps) {
  return "model: {family: llama, n_layers: 2, d_model: 32, n_heads: 4, d_ff: 64}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", batch_size: 2, seq_len: 32, seed: 5, checkpoint: {dir: " + checkpoint_dir +
         ", every: 1}}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n";
}

uint64_t folder_bytes(const std::string& folder) {
  uint64_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(folder)) bytes += entry.file_size();
  return bytes;
}

CheckpointConfig keeping(int keep_last) {
  CheckpointConfig checkpoint;
  checkpoint.dir = "ckpt";
  checkpoint.keep_last = keep_last;
  return checkpoint;
}

std::vector<int64_t> steps_one_to(int64_t last) {
  std::vector<int64_t> steps;
  for (int64_t step = 1; step <= last; ++step) steps.push_back(step);
  return steps;
}

TEST(CheckpointSpace, OneCheckpointsSizeBoundsTheFilesASaveWritesByAFewKiB) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), small_run_yaml(dir.file("ckpt"), 1));
  auto run = run_command(kTrain + " --config " + dir.file("c.yaml"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const uint64_t written = folder_bytes(dir.file("ckpt/" + checkpoint_folder_name(1)));
  const ParamTable table(load_config(dir.file("c.yaml"), {}).model);
  const uint64_t planned = checkpoint_bytes(table, 1);
  EXPECT_GE(planned, written);
  EXPECT_LE(planned, written + 64 * 1024);
  // The weights and both moments, a float each per parameter, are most of it.
  EXPECT_GT(written, 3 * sizeof(float) * uint64_t(table.total_numel()));
}

TEST(CheckpointSpace, ARunSavesEveryNthStepAndItsLast) {
  CheckpointConfig checkpoint;
  checkpoint.every = 4;
  EXPECT_EQ(checkpoint_steps(checkpoint, 0, 10), (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(checkpoint_steps(checkpoint, 8, 10), (std::vector<int64_t>{10}));
  EXPECT_EQ(checkpoint_steps(checkpoint, 0, 8), (std::vector<int64_t>{4, 8}));
  EXPECT_TRUE(checkpoint_steps(checkpoint, 10, 10).empty());
  checkpoint.every = 0;
  EXPECT_EQ(checkpoint_steps(checkpoint, 3, 10), (std::vector<int64_t>{10}));
}

TEST(CheckpointSpace, TheMostFoldersARunHoldsAtOnce) {
  EXPECT_EQ(checkpoints_held_at_most(keeping(0), 5), 5);
  EXPECT_EQ(checkpoints_held_at_most(keeping(1), 5), 3);
  EXPECT_EQ(checkpoints_held_at_most(keeping(2), 5), 3);
  EXPECT_EQ(checkpoints_held_at_most(keeping(3), 5), 4);
  EXPECT_EQ(checkpoints_held_at_most(keeping(10), 5), 5);
  EXPECT_EQ(checkpoints_held_at_most(keeping(3), 1), 1);
  EXPECT_EQ(checkpoints_held_at_most(keeping(3), 0), 0);
}

TEST(CheckpointSpace, DryRunSaysWhatTheCheckpointsTakeOnDisk) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), small_run_yaml(dir.file("ckpt"), 10));
  auto run = run_command(kTrain + " --config " + dir.file("c.yaml") +
                         " --set train.checkpoint.keep_last=2 --dry-run");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const ParamTable table(load_config(dir.file("c.yaml"), {}).model);
  EXPECT_MENTIONS(run.output, "# about " + format_bytes(int64_t(checkpoint_bytes(table, 1))) +
                                  " a checkpoint on disk");
  EXPECT_MENTIONS(run.output, "10 saved to '" + dir.file("ckpt") + "', keep_last 2: up to 3");
  EXPECT_FALSE(fs::exists(dir.file("ckpt")));
}

TEST(CheckpointSpace, AFolderThatCannotHoldOneCheckpointIsAnErrorNamingBothSizes) {
  const SpaceVerdict verdict =
      checkpoint_space_at_start(keeping(0), 3 * kMiB, 2 * kMiB, 0, {100, 200});
  EXPECT_MENTIONS(verdict.error, "train.checkpoint.dir 'ckpt' is on a file system with 2.00 MiB");
  EXPECT_MENTIONS(verdict.error, "less than one checkpoint of this model (3.00 MiB");
  EXPECT_MENTIONS(verdict.error, "stop at its first save, step 100");
  EXPECT_TRUE(checkpoint_space_at_start(keeping(0), 3 * kMiB, 3 * kMiB, 0, {100}).error.empty());
}

TEST(CheckpointSpace, TheWarningNamesTheFirstSaveThatWouldNotFit) {
  // Keeping all: room for three of ten.
  SpaceVerdict verdict =
      checkpoint_space_at_start(keeping(0), 2 * kMiB, 7 * kMiB, 0, steps_one_to(10));
  EXPECT_TRUE(verdict.error.empty());
  EXPECT_MENTIONS(verdict.warning, "saves 10 checkpoint(s) of 2.00 MiB and keeps them all");
  EXPECT_MENTIONS(verdict.warning, "the save at step 4 would not fit");
  // keep_last 3 holds four while the fourth is written: room for 3.5 fails at the fourth...
  verdict = checkpoint_space_at_start(keeping(3), 2 * kMiB, 7 * kMiB, 0, steps_one_to(10));
  EXPECT_MENTIONS(verdict.warning, "keeps the newest 3, so the save at step 4 would not fit");
  // ...and room for four is enough for any number of saves.
  verdict = checkpoint_space_at_start(keeping(3), 2 * kMiB, 8 * kMiB, 0, steps_one_to(1000));
  EXPECT_EQ(verdict.warning, "");
  // keep_last 1 also keeps the checkpoint to go back to: three folders while writing.
  verdict = checkpoint_space_at_start(keeping(1), 2 * kMiB, 5 * kMiB, 0, steps_one_to(10));
  EXPECT_MENTIONS(verdict.warning, "the save at step 3 would not fit");
  EXPECT_EQ(checkpoint_space_at_start(keeping(1), 2 * kMiB, 6 * kMiB, 0, steps_one_to(10)).warning,
            "");
}

TEST(CheckpointSpace, AResumedRunsFoldersArePrunedLikeItsOwn) {
  // Three folders there already: keep_last 2 prunes them, so room for one more is enough.
  EXPECT_EQ(checkpoint_space_at_start(keeping(2), 2 * kMiB, 2 * kMiB, 3, {8, 9, 10, 11}).warning,
            "");
  // Keeping all, they stay: the second save does not fit.
  EXPECT_MENTIONS(
      checkpoint_space_at_start(keeping(0), 2 * kMiB, 3 * kMiB, 3, {8, 9, 10, 11}).warning,
      "the save at step 9 would not fit");
}

TEST(CheckpointSpace, ARunWithNothingToSaveGetsNoVerdict) {
  const SpaceVerdict verdict = checkpoint_space_at_start(keeping(0), 3 * kMiB, 0, 0, {});
  EXPECT_EQ(verdict.error, "");
  EXPECT_EQ(verdict.warning, "");
}

TEST(CheckpointSpace, ASaveThatWouldNotFitIsNotStarted) {
  EXPECT_EQ(checkpoint_space_at_save("ckpt", 7, 2 * kMiB, 2 * kMiB), "");
  const std::string refusal = checkpoint_space_at_save("ckpt", 7, 2 * kMiB, 2 * kMiB - 1);
  EXPECT_MENTIONS(refusal, "not writing the checkpoint of step 7: it needs 2.00 MiB");
  EXPECT_MENTIONS(refusal, "continue with --resume auto");
}

TEST(CheckpointSpace, AFolderNotYetCreatedHasItsFileSystemsRoom) {
  TempDir dir;
  const std::optional<uint64_t> parent = available_bytes(dir.path());
  const std::optional<uint64_t> child = available_bytes(dir.file("not/yet/there"));
  ASSERT_TRUE(parent && child);
  EXPECT_GT(*parent, 0u);
  // The same file system, asked twice: only other writers move it in between.
  EXPECT_NEAR(double(*child), double(*parent), 64.0 * kMiB);
  EXPECT_FALSE(fs::exists(dir.file("not")));
}

// The largest model ulysses takes (2^40 parameters, docs/configuration.md) has a checkpoint of
// about 12 TiB: its run stops before the first step, without creating the folder.
TEST(CheckpointSpace, ARunWhoseFolderCannotHoldOneCheckpointStopsBeforeBuildingTheModel) {
  TempDir dir;
  const std::string yaml =
      "model: {family: llama, n_layers: 14, d_model: 65536, n_heads: 512, d_ff: 262144}\n"
      "train: {steps: 10, batch_size: 1, seq_len: 32, checkpoint: {dir: " +
      dir.file("ckpt") +
      "}}\n"
      "data: {source: synthetic}\n"
      "memory: {limit_gib: 100000000}\n";
  testing::write_text_file(dir.file("c.yaml"), yaml);
  const uint64_t size = checkpoint_bytes(ParamTable(load_config(dir.file("c.yaml"), {}).model), 1);
  const std::optional<uint64_t> available = available_bytes(dir.path());
  if (!available || *available >= size)
    GTEST_SKIP() << "this machine's temporary folder holds a checkpoint of " << size
                 << " bytes (or cannot say how much it holds)";
  auto run = run_command(kTrain + " --config " + dir.file("c.yaml"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_MENTIONS(run.output, "less than one checkpoint of this model");
  EXPECT_MENTIONS(run.output, "stop at its first save, step 10");
  EXPECT_FALSE(fs::exists(dir.file("ckpt")));
}

// A real full disk: a tmpfs of three and a half checkpoints, mounted in a mount namespace of
// its own (unshare; skipped where the system allows none). The start warns that the save at
// step 4 would not fit; steps 1-3 are saved; step 4's is not started and the run exits 1; what
// was written stays intact, and no temporary folder is left.
TEST(CheckpointSpace, AFullDiskStopsTheRunAtTheSaveThatWouldNotFitKeepingTheEarlierOnes) {
  TempDir dir;
  const std::string disk = dir.file("disk");
  fs::create_directories(disk);
  testing::write_text_file(dir.file("c.yaml"), small_run_yaml(disk + "/ckpt", 6));
  const uint64_t size = checkpoint_bytes(ParamTable(load_config(dir.file("c.yaml"), {}).model), 1);
  const uint64_t disk_kib = (7 * size / 2) / 1024;
  testing::write_text_file(dir.file("full-disk.sh"),
                           "mount -t tmpfs -o size=" + std::to_string(disk_kib) + "k tmpfs " +
                               disk + " || exit 77\n" + kTrain + " --config " + dir.file("c.yaml") +
                               "\ncode=$?\ncp -a " + disk + "/ckpt " + dir.file("after") +
                               "\nexit $code\n");
  auto run = run_command("unshare -rm sh " + dir.file("full-disk.sh"));
  if (run.exit_code == 77 || run.output.find("unshare:") != std::string::npos)
    GTEST_SKIP() << "no mount namespace with a tmpfs here: " << run.output;
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_MENTIONS(run.output, "so the save at step 4 would not fit");
  EXPECT_MENTIONS(run.output, "not writing the checkpoint of step 4");
  const std::string after = dir.file("after");
  for (int step = 1; step <= 3; ++step)
    EXPECT_NO_THROW(verify_checkpoint(after + "/" + checkpoint_folder_name(step))) << step;
  EXPECT_EQ(find_latest_checkpoint(after), after + "/" + checkpoint_folder_name(3));
  for (const auto& entry : fs::directory_iterator(after))
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
}

TEST(CheckpointSpace, TheTemporaryFoldersAKillLeftAreDeletedAtTheNextStart) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), small_run_yaml(dir.file("ckpt"), 2));
  auto first = run_command(kTrain + " --config " + dir.file("c.yaml"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // What a kill in the middle of a save of step 9 leaves.
  fs::create_directories(dir.file("ckpt/.tmp-step_00000009"));
  testing::write_text_file(dir.file("ckpt/.tmp-step_00000009/model.safetensors"), "partial");
  auto resumed = run_command(kTrain + " --config " + dir.file("c.yaml") +
                             " --set train.steps=3 --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(fs::exists(dir.file("ckpt/.tmp-step_00000009")));
  EXPECT_EQ(find_latest_checkpoint(dir.file("ckpt")),
            dir.file("ckpt/" + checkpoint_folder_name(3)));
}

}  // namespace
}  // namespace ulysses
