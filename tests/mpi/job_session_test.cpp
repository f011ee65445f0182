// Opening a run (core/jobs/job_session.h), as every command does before it trains, evaluates or
// samples: the config is loaded and checked on every rank, a bad one or one that differs
// between ranks ends the job on every rank with the same exit status, the backend is made
// only when asked, and the mesh splits the world into dp x sp as the config says.
#include "core/jobs/job_session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/jobs/memory_fit.h"
#include "parallel/exit_code.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

class JobSessionTest : public testing::MpiTest {
 protected:
  // A config file only this process writes and reads (ranks may share a folder).
  std::string write_config(const std::string& text) {
    const std::string path = "/tmp/ulysses_job_session_" + std::to_string(getpid()) + ".yaml";
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override {
    std::remove(("/tmp/ulysses_job_session_" + std::to_string(getpid()) + ".yaml").c_str());
    MpiTest::TearDown();
  }
  const std::string model_ =
      "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
      "train: {steps: 2, seq_len: 64}\n";
};

TEST_F(JobSessionTest, OpensTheBackendAndSplitsTheWorldAsTheConfigSays) {
  const int world_size = world().size();
  const std::string path = write_config(model_);
  JobSession job = open_job(path, {"parallel.sp=2"}, "train", world());
  ASSERT_NE(job.backend, nullptr);
  EXPECT_EQ(job.backend->name(), "cpu");
  EXPECT_EQ(job.config.parallel.sp, 2);
  connect_job(job, world());
  EXPECT_EQ(job.mesh.sp_size, 2);
  EXPECT_EQ(job.mesh.dp_size, world_size / 2);
  EXPECT_EQ(job.mesh.sp_rank, world().rank() % 2);
  EXPECT_EQ(job.mesh.dp_rank, world().rank() / 2);
}

TEST_F(JobSessionTest, PlansWithoutABackendWhenAsked) {
  const std::string path = write_config(model_);
  // device: cuda on a machine without a GPU: no backend is made, so nothing fails.
  JobSession job = open_job(path, {"device=cuda"}, "plan", world(), false);
  EXPECT_EQ(job.backend, nullptr);
  EXPECT_EQ(name_of(job.config.device), "cuda");
}

TEST_F(JobSessionTest, ABadConfigEndsTheJobOnEveryRankWithStatusTwo) {
  const std::string path = write_config(model_);
  try {
    open_job(path, {"train.seq_len_schedule=33@0, 48@1", "parallel.sp=2"}, "train", world());
    ADD_FAILURE() << "a schedule that does not end at train.seq_len was accepted";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(error.what()).find("is not train.seq_len"), std::string::npos)
        << error.what();
  }
}

TEST_F(JobSessionTest, RanksThatRunDifferentJobsAreStoppedTogether) {
  const std::string path = write_config(model_);
  // The last rank alone trains for more steps.
  const bool odd_one = world().rank() == world().size() - 1;
  try {
    open_job(path, {odd_one ? "train.steps=3" : "train.steps=2"}, "train", world());
    ADD_FAILURE() << "ranks with different train.steps were let through";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
    if (error.print_here())
      EXPECT_NE(std::string(error.what()).find("train.steps"), std::string::npos) << error.what();
  }
}

// The same config with another command (one rank resumes, the others start afresh) is
// another job.
TEST_F(JobSessionTest, RanksThatRunDifferentCommandsAreStoppedTogether) {
  const std::string path = write_config(model_);
  const bool odd_one = world().rank() == world().size() - 1;
  try {
    open_job(path, {}, odd_one ? "train --resume auto" : "train", world());
    ADD_FAILURE() << "ranks with different commands were let through";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::bad_input);
    if (error.print_here())
      EXPECT_NE(std::string(error.what()).find("command: rank 0 has 'train'"), std::string::npos)
          << error.what();
  }
}

// With memory.limit_gib above a rank's memory, the check against that memory only warns, on
// rank 0; every rank still leaves the check together. (A rank that skipped it and went on to
// the next collective would meet rank 0 still agreeing on the check's verdict: the verdict's
// all-reduce would take this test's value for a failure.)
TEST_F(JobSessionTest, AMemoryLimitAboveTheMachineIsCheckedInStepOnEveryRank) {
  const std::string path = write_config(model_);
  const Config config = load_config(path, {"memory.limit_gib=1000", "train.seq_len=4096"});
  const RankMemory small{int64_t(1) << 20, "a fixed 1 MiB", 1};
  EXPECT_NO_THROW(check_stages_fit(world(), config, 1, "ulysses-train plan", small, RankMemory{}));
  double values[2] = {10.0 + world().rank(), 0.0};
  world().all_reduce_host(values, 2, ReduceOp::max);
  EXPECT_EQ(values[0], 10.0 + world().size() - 1);
}

}  // namespace
}  // namespace ulysses
