// One run at a time in a checkpoint folder (core/checkpoint/checkpoint_lock.h,
// docs/checkpoints.md#one-run-per-folder): the lock itself, the folder checks that take it,
// and a second ulysses-train into the folder of a running one, on one rank and under mpirun;
// and in a metrics file (core/report/metrics.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_lock.h"
#include "parallel/comm.h"
#include "parallel/exit_code.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

TEST(CheckpointDirLock, ASecondHolderIsRefusedNamingTheFirstUntilItLetsGo) {
  TempDir dir;
  const std::string holder = describe_lock_holder("ulysses-train train -c first.yaml");
  EXPECT_MENTIONS(holder, "pid " + std::to_string(getpid()) + " on ");
  EXPECT_MENTIONS(holder, " UTC: ulysses-train train -c first.yaml");
  {
    auto first = std::make_unique<CheckpointDirLock>(holder);
    EXPECT_EQ(first->acquire(dir.path()), "");
    EXPECT_TRUE(first->acquired());
    EXPECT_EQ(testing::read_text_file(dir.file(kCheckpointLockFile)), holder + "\n");
    // flock(2) locks conflict between open files, also within one process.
    CheckpointDirLock second("second");
    const std::string error = second.acquire(dir.path());
    EXPECT_MENTIONS(error, "train.checkpoint.dir '" + dir.path() + "' is in use by another run (" +
                               holder + ")");
    EXPECT_MENTIONS(error, "--resume auto");
    EXPECT_FALSE(second.acquired());
    first.reset();
    CheckpointDirLock third("third");
    EXPECT_EQ(third.acquire(dir.path()), "");
    EXPECT_EQ(testing::read_text_file(dir.file(kCheckpointLockFile)), "third\n");
  }
}

TEST(CheckpointDirLock, WhatTheHolderWroteIsShownPrintableAndOneLineOnly) {
  TempDir dir;
  testing::write_text_file(dir.file(kCheckpointLockFile), "pid 7 \x1b[2Jon\tnode\nsecond line\n");
  const int fd = open(dir.file(kCheckpointLockFile).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  CheckpointDirLock lock("me");
  const std::string error = lock.acquire(dir.path());
  close(fd);
  EXPECT_MENTIONS(error, "is in use by another run (pid 7 ?[2Jon?node): two runs");
  EXPECT_EQ(error.find("second line"), std::string::npos) << error;
}

TEST(CheckpointDirLock, AnEmptyLockFileOfAHolderThatHasNotWrittenYetStillRefuses) {
  TempDir dir;
  testing::write_text_file(dir.file(kCheckpointLockFile), "");
  const int fd = open(dir.file(kCheckpointLockFile).c_str(), O_RDONLY);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  CheckpointDirLock lock("me");
  EXPECT_MENTIONS(lock.acquire(dir.path()), "in use by another run (it has not said which yet)");
  close(fd);
}

TrainConfig train_into(const std::string& checkpoint_dir) {
  TrainConfig train;
  train.steps = 4;
  train.checkpoint.dir = checkpoint_dir;
  train.checkpoint.every = 2;
  return train;
}

std::string job_error_of(const std::function<void()>& work) {
  try {
    work();
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
    return error.what();
  }
  return "";
}

TEST(CheckpointDir, AnExistingFolderIsLockedBeforeItIsRecovered) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  fs::create_directories(ckpt + "/" + kSavingPrefix + checkpoint_folder_name(3));
  testing::write_text_file(ckpt + "/" + kSavingPrefix + checkpoint_folder_name(3) + "/x", "x");
  CheckpointDirLock running("the running one");
  ASSERT_EQ(running.acquire(ckpt), "");
  auto world = make_local_comm();
  CheckpointDirLock lock("me");
  const std::string error = job_error_of([&] { recover_checkpoint_dir(*world, ckpt, lock); });
  EXPECT_MENTIONS(error, "in use by another run (the running one)");
  // The running one's save in progress is not taken for a leftover and deleted.
  EXPECT_TRUE(fs::exists(ckpt + "/" + kSavingPrefix + checkpoint_folder_name(3) + "/x"));
}

TEST(CheckpointDir, AFolderCreatedByThisRunIsLockedOnceItExists) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  auto world = make_local_comm();
  CheckpointDirLock lock("me");
  recover_checkpoint_dir(*world, ckpt, lock);
  EXPECT_FALSE(lock.acquired()) << "there was no folder to lock";
  EXPECT_TRUE(prepare_checkpoint_dir(*world, train_into(ckpt), 1024, "", lock).empty());
  EXPECT_TRUE(lock.acquired());
  CheckpointDirLock other("other");
  EXPECT_MENTIONS(other.acquire(ckpt), "in use by another run (me)");
}

TEST(CheckpointDir, AnotherRunThatCreatesTheFolderMeanwhileHoldsIt) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  auto world = make_local_comm();
  CheckpointDirLock lock("me");
  recover_checkpoint_dir(*world, ckpt, lock);
  fs::create_directories(ckpt);
  CheckpointDirLock other("the other run");
  ASSERT_EQ(other.acquire(ckpt), "");
  const std::string error =
      job_error_of([&] { prepare_checkpoint_dir(*world, train_into(ckpt), 1024, "", lock); });
  EXPECT_MENTIONS(error, "in use by another run (the other run)");
}

// A running job holds its folder: a second job (one rank, then two under mpirun) exits 2 naming
// it and leaves the folder as it was, its save in progress included; once the first is killed
// with SIGKILL the folder is free again, with no stale lock to clear by hand.
TEST(CheckpointLockJob, ASecondJobIsRefusedWhileTheFirstRunsAndGoesOnOnceItIsKilled) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  testing::write_text_file(
      dir.file("c.yaml"),
      "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
      "train: {steps: 2, batch_size: 1, seq_len: 64, seed: 5, checkpoint: {dir: " +
          ckpt +
          ", every: 1}}\n"
          "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n");
  auto prepared = run_command(kTrain + " -c " + dir.file("c.yaml"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const std::string in_progress = ckpt + "/" + kSavingPrefix + checkpoint_folder_name(99);
  const std::string config = " -c " + dir.file("c.yaml") + " --resume auto";
  const std::string script =
      "trap 'kill -KILL $first 2>/dev/null' EXIT\n" + kTrain + config +
      " --set train.steps=100000000 --set train.checkpoint.every=100000000 > " +
      dir.file("first.log") +
      " 2>&1 & first=$!\n"
      "for i in $(seq 600); do grep -q \"^pid $first \" " +
      ckpt + "/" + kCheckpointLockFile +
      " 2>/dev/null && break; sleep 0.1; done\n"
      "mkdir " +
      in_progress + " && echo part > " + in_progress +
      "/model.safetensors\n"
      "echo \"first pid $first\"\n"
      "find " +
      ckpt + " -type f | sort | xargs md5sum > " + dir.file("before.md5") + "\n" + kTrain + config +
      "; echo \"second exit $?\"\n" + testing::mpirun(2) + kTrain + config +
      " --set parallel.sp=2; echo \"mpi exit $?\"\n"
      "find " +
      ckpt + " -type f | sort | xargs md5sum > " + dir.file("after.md5") +
      "\n"
      "kill -KILL $first; wait $first 2>/dev/null\n" +
      kTrain + config + " --set train.steps=3; echo \"after the kill exit $?\"\n";
  testing::write_text_file(dir.file("jobs.sh"), script);
  auto result = run_command("timeout 300 bash " + dir.file("jobs.sh"));
  const std::string& out = result.output;
  ASSERT_EQ(result.exit_code, 0) << out;
  const size_t pid_at = out.find("first pid ");
  ASSERT_NE(pid_at, std::string::npos) << out;
  const std::string first_pid = out.substr(pid_at + 10, out.find('\n', pid_at) - pid_at - 10);
  const size_t second_at = out.find("second exit ");
  const size_t mpi_at = out.find("mpi exit ");
  const size_t after_at = out.find("after the kill exit ");
  ASSERT_TRUE(second_at != std::string::npos && mpi_at != std::string::npos &&
              after_at != std::string::npos)
      << out;
  const std::string second = out.substr(pid_at, second_at - pid_at);
  const std::string mpi = out.substr(second_at, mpi_at - second_at);
  EXPECT_MENTIONS(out.substr(second_at), "second exit 2\n");
  EXPECT_MENTIONS(second, "train.checkpoint.dir '" + ckpt + "' is in use by another run (pid " +
                              first_pid + " on ");
  EXPECT_MENTIONS(second, "ulysses-train train --resume auto -c " + dir.file("c.yaml") + ")");
  EXPECT_MENTIONS(out.substr(mpi_at), "mpi exit 2\n");
  EXPECT_MENTIONS(mpi, "is in use by another run (pid " + first_pid + " on ");
  EXPECT_EQ(mpi.find("MPI_ABORT"), std::string::npos) << mpi;
  EXPECT_EQ(testing::read_text_file(dir.file("after.md5")),
            testing::read_text_file(dir.file("before.md5")));
  EXPECT_MENTIONS(out.substr(after_at), "after the kill exit 0\n");
  EXPECT_MENTIONS(out.substr(mpi_at), "resumed from " + ckpt + "/" + checkpoint_folder_name(2));
  EXPECT_FALSE(fs::exists(in_progress)) << "the killed run's leftover is deleted";
  EXPECT_TRUE(fs::exists(ckpt + "/" + checkpoint_folder_name(3)));
}

// Two runs that name one log.metrics_file (and no checkpoint folder): the second exits 2 before it
// cuts or writes the file, and the first's lines stay whole, one per step in order.
TEST(CheckpointLockJob, ASecondJobIsRefusedTheMetricsFileTheFirstWrites) {
  TempDir dir;
  const std::string metrics = dir.file("m.jsonl");
  testing::write_text_file(
      dir.file("c.yaml"),
      "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
      "train: {steps: 100000000, batch_size: 1, seq_len: 64, seed: 5}\n"
      "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
      "log: {every: 1, metrics_file: " +
          metrics + "}\n");
  const std::string script = "trap 'kill -KILL $first 2>/dev/null' EXIT\n" + kTrain + " -c " +
                             dir.file("c.yaml") + " > " + dir.file("first.log") +
                             " 2>&1 & first=$!\n"
                             "for i in $(seq 600); do [ -s " +
                             metrics + " ] && break; sleep 0.1; done\n" + kTrain + " -c " +
                             dir.file("c.yaml") +
                             " --set train.steps=3; echo \"second exit $?\"\n"
                             "kill -KILL $first; wait $first 2>/dev/null; exit 0\n";
  testing::write_text_file(dir.file("jobs.sh"), script);
  auto result = run_command("timeout 300 bash " + dir.file("jobs.sh"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "log.metrics_file '" + metrics +
                                     "' is being written by another run: two runs writing one "
                                     "file would mix their lines");
  EXPECT_MENTIONS(result.output, "second exit 2\n");
  const std::vector<nlohmann::json> lines = testing::read_metrics_lines(metrics);
  ASSERT_FALSE(lines.empty());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i].value("step", -1), int(i) + 1);
}

}  // namespace
}  // namespace ulysses
