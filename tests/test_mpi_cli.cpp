// ulysses-train under real mpirun: the main job's config, errors that every rank sees
// alike (exit 2 everywhere), and a fatal error on one rank only (the whole job ends
// promptly with that rank's message, no rank left hanging in a collective).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/token_stream.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

std::string mpirun(int ranks, const std::string& arguments) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 timeout 120 mpirun -np " +
         std::to_string(ranks) + " --bind-to none " + kTrain + " " + arguments;
}

// model_extra must give n_heads (and may give n_kv_heads).
std::string tiny_yaml(const std::string& model_extra, const std::string& parallel) {
  return "model: {family: llama, n_layers: 1, d_model: 48" + model_extra +
         ", d_ff: 64}\n"
         "train: {steps: 3, batch_size: 2, seq_len: 64, seed: 3}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
         "parallel: {" +
         parallel + "}\n";
}

TEST(MpiCli, HeadsNotDivisibleBySpExitsTwoOnEveryRankNamingTheNumbers) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml(", n_heads: 6", "sp: 4"));
  auto result = run_command(mpirun(4, "--config " + dir.file("c.yaml")));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("model.n_heads=6 is not divisible by parallel.sp=4"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("sp can be 1, 2, 3 or 6"), std::string::npos) << result.output;
}

// scripts/launch.sh, as the README's first command runs it, from another folder: the config
// and the paths in it are the caller's, as with mpirun itself (it used to read them from the
// repository's root, so a config beside the caller was "not found" and the metrics went there).
TEST(MpiCli, LaunchScriptReadsTheConfigAndItsPathsFromWhereItRuns) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"),
                           tiny_yaml(", n_heads: 4", "sp: 2") + "log: {metrics_file: run.jsonl}\n");
  const std::string launch = "cd " + dir.path() + " && OMP_NUM_THREADS=1 timeout 120 " +
                             ULYSSES_SOURCE_DIR "/scripts/launch.sh ";
  auto result = run_command(launch + "2 c.yaml --set train.steps=2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream metrics(dir.file("run.jsonl"));
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) steps += line.find("\"loss\"") != line.npos;
  EXPECT_EQ(steps, 2) << result.output;

  for (const std::string& ranks : {"four", "0", "-2"}) {
    auto refused = run_command(launch + ranks + " c.yaml");
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("NUM_RANKS must be a positive whole number, got '" + ranks + "'"),
              std::string::npos)
        << refused.output;
  }
}

TEST(MpiCli, SpNotDividingTheWorldExitsTwo) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml(", n_heads: 4", "sp: 3"));
  auto result = run_command(mpirun(4, "--config " + dir.file("c.yaml")));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("parallel.sp=3"), std::string::npos) << result.output;
}

TEST(MpiCli, GqaThatCannotBeSplitOrReplicatedIsRefused) {
  TempDir dir;
  // 3 kv heads on sp 2: 3 % 2 != 0 and 2 % 3 != 0.
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml(", n_heads: 6, n_kv_heads: 3", "sp: 2"));
  auto result = run_command(mpirun(2, "--config " + dir.file("c.yaml")));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("n_kv_heads=3"), std::string::npos) << result.output;
}

TEST(MpiCli, BadTokenInOneRanksSliceEndsTheWholeJobWithItsMessage) {
  TempDir dir;
  // One shard: every token is valid except one in the second half of the first sequence,
  // which only rank 1 (sp = 2) reads.
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 50);
  const int64_t seq_len = 64;
  std::string yaml =
      "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64, "
      "vocab_size: 100}\n"
      "train: {steps: 3, batch_size: 1, seq_len: " +
      std::to_string(seq_len) +
      ", seed: 3}\n"
      "data: {source: tokens, path: " +
      dir.file("shard.bin") +
      ", val_fraction: 0.1}\n"
      "parallel: {sp: 2}\n";
  testing::write_text_file(dir.file("c.yaml"), yaml);
  // The first sequence read is a shuffled window; poison every window's second half.
  for (size_t start = 0; start + seq_len < tokens.size(); start += seq_len)
    tokens[start + seq_len / 2 + 5] = 4242;
  write_token_shard(dir.file("shard.bin"), tokens, 1);
  auto result = run_command(mpirun(2, "--config " + dir.file("c.yaml")));
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 124) << "the job hung until the timeout:\n" << result.output;
  EXPECT_NE(result.output.find("[rank 1]"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("4242"), std::string::npos) << result.output;
}

TEST(MpiCli, SequenceParallelRunWritesCommunicationMetrics) {
  TempDir dir;
  testing::write_text_file(
      dir.file("c.yaml"),
      tiny_yaml(", n_heads: 4", "sp: 2") + "log: {metrics_file: " + dir.file("m.jsonl") + "}\n");
  auto result = run_command(mpirun(4, "--config " + dir.file("c.yaml")));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("dp 2 x sp 2"), std::string::npos) << result.output;
  int steps = 0;
  for (const nlohmann::json& json : testing::read_metrics_lines(dir.file("m.jsonl"))) {
    ++steps;
    EXPECT_GT(json["all_to_all_bytes"].get<int64_t>(), 0);
    EXPECT_GT(json["grad_comm_bytes"].get<int64_t>(), 0);
    EXPECT_GE(json["all_to_all_s"].get<double>(), 0.0);
    // The wait is a part of the step; the collectives' in-flight time need not be.
    EXPECT_GT(json["comm_wait_s"].get<double>(), 0.0);
    EXPECT_LE(json["comm_wait_s"].get<double>(), json["step_ms"].get<double>() / 1e3);
  }
  EXPECT_EQ(steps, 3);
  EXPECT_MENTIONS(result.output, " | comm wait ");
}

// Replicated and ZeRO-3 state alike (gpt2: the tied embedding is gathered at both ends).
TEST(MpiCli, ResumeUnderMpirunContinuesWithTheSameLosses) {
  for (int stage : {0, 3}) {
    TempDir dir;
    auto yaml = [&](const std::string& name) {
      return std::string(
                 "model: {family: gpt2, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n") +
             "train: {steps: 4, batch_size: 1, seq_len: 64, seed: 3, checkpoint: {dir: " +
             dir.file(name + "_ckpt") + ", every: 1}}\n" +
             "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n" +
             "parallel: {sp: 2, zero_stage: " + std::to_string(stage) +
             "}\nlog: {metrics_file: " + dir.file(name + ".jsonl") + "}\n";
    };
    testing::write_text_file(dir.file("a.yaml"), yaml("a"));
    testing::write_text_file(dir.file("b.yaml"), yaml("b"));
    auto a = run_command(mpirun(4, "--config " + dir.file("a.yaml")));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = run_command(mpirun(
        4, "--config " + dir.file("b.yaml") + " --resume " + dir.file("a_ckpt/step_00000002")));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    std::vector<double> full = testing::read_step_losses(dir.file("a.jsonl"));
    std::vector<double> resumed = testing::read_step_losses(dir.file("b.jsonl"));
    ASSERT_EQ(full.size(), 4u);
    ASSERT_EQ(resumed.size(), 2u);
    EXPECT_EQ(resumed[0], full[2]) << "zero stage " << stage;
    EXPECT_EQ(resumed[1], full[3]) << "zero stage " << stage;
  }
}

// Sharded checkpoints hold one optimizer file per rank; resuming on another world size and
// under another ZeRO stage reshards them and continues with the same losses (the global
// batch is the same: dp × B sequences of the same indices).
TEST(MpiCli, ShardedCheckpointResumesOnAnotherWorldSize) {
  TempDir dir;
  auto yaml = [&](const std::string& name, int batch, int stage) {
    return std::string("model: {family: llama, n_layers: 2, d_model: 32, n_heads: 4, d_ff: 64}\n") +
           "train: {steps: 5, batch_size: " + std::to_string(batch) +
           ", seq_len: 64, seed: 3, checkpoint: {dir: " + dir.file(name + "_ckpt") +
           ", every: 1}}\n" +
           "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n" +
           "parallel: {sp: 2, zero_stage: " + std::to_string(stage) +
           ", bucket_mb: 1.0e-6}\nlog: {metrics_file: " + dir.file(name + ".jsonl") + "}\n";
  };
  // 4 ranks = dp 2 x sp 2 with 1 sequence each; 2 ranks = dp 1 x sp 2 with 2 sequences.
  // Stage 3 on 4 ranks, then stage 2 on 2, then stage 1 on 4, one unit per layer.
  testing::write_text_file(dir.file("four.yaml"), yaml("four", 1, 3));
  testing::write_text_file(dir.file("two.yaml"), yaml("two", 2, 2));
  testing::write_text_file(dir.file("back.yaml"), yaml("back", 1, 1));
  auto four = run_command(mpirun(4, "--config " + dir.file("four.yaml")));
  ASSERT_EQ(four.exit_code, 0) << four.output;
  for (int shard = 0; shard < 4; ++shard)
    EXPECT_TRUE(std::ifstream(dir.file("four_ckpt/step_00000005/optimizer-0000" +
                                       std::to_string(shard) + "-of-00004.safetensors"))
                    .good());
  auto two = run_command(mpirun(
      2, "--config " + dir.file("two.yaml") + " --resume " + dir.file("four_ckpt/step_00000002")));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto back = run_command(mpirun(
      4, "--config " + dir.file("back.yaml") + " --resume " + dir.file("two_ckpt/step_00000004")));
  ASSERT_EQ(back.exit_code, 0) << back.output;
  std::vector<double> reference = testing::read_step_losses(dir.file("four.jsonl"));
  std::vector<double> resharded = testing::read_step_losses(dir.file("two.jsonl"));
  std::vector<double> resharded_back = testing::read_step_losses(dir.file("back.jsonl"));
  ASSERT_EQ(reference.size(), 5u);
  ASSERT_EQ(resharded.size(), 3u);
  ASSERT_EQ(resharded_back.size(), 1u);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(resharded[i], reference[i + 2], 1e-6 * reference[i + 2])
        << "4 -> 2, step " << i + 3;
  EXPECT_NEAR(resharded_back[0], reference[4], 1e-6 * reference[4]) << "2 -> 4, step 5";
}

}  // namespace
}  // namespace ulysses
