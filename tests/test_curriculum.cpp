// The sequence-length curriculum (train.seq_len_schedule, docs/configuration.md#curriculum)
// and the placement of the synthetic task's keys across the sp slices (the main job's log):
// the schedule's parsing, rules and lengths per step; a run that changes length and batch
// mid-way resumes bit-exactly on both sides of the change; every query's key is where the
// data says, and with plant_fraction 1 keys sit in every rank's slice.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/config/seq_len_schedule.h"
#include "core/train/evaluate.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

TEST(SeqLenSchedule, ParsesLengthsBatchesAndSteps) {
  const std::vector<SeqLenStage> stages = parse_seq_len_schedule(" 256@0, 1024x8@400 ,4096x4@500");
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[0].seq_len, 256);
  EXPECT_EQ(stages[0].first_step, 0);
  EXPECT_EQ(stages[0].batch_size, 0);
  EXPECT_EQ(stages[1].seq_len, 1024);
  EXPECT_EQ(stages[1].batch_size, 8);
  EXPECT_EQ(stages[2].first_step, 500);
  EXPECT_TRUE(parse_seq_len_schedule("  ").empty());
  for (const char* bad : {"256", "256@", "@3", "256@0,", "256x@0", "256x0@0", "-1@0", "2e3@0"})
    EXPECT_THROW(parse_seq_len_schedule(bad), std::invalid_argument) << bad;
}

TEST(SeqLenSchedule, StageOfEachStepAndItsBatch) {
  const std::vector<SeqLenStage> stages = parse_seq_len_schedule("256@0, 1024x8@400, 4096x4@500");
  auto shape = [&](int64_t step) {
    const SeqLenStage stage = stage_at(stages, 4096, 16, step);
    return std::to_string(stage.seq_len) + "x" + std::to_string(stage.batch_size);
  };
  EXPECT_EQ(shape(0), "256x16");
  EXPECT_EQ(shape(399), "256x16");
  EXPECT_EQ(shape(400), "1024x8");
  EXPECT_EQ(shape(499), "1024x8");
  EXPECT_EQ(shape(500), "4096x4");
  EXPECT_EQ(shape(100000), "4096x4");
  const SeqLenStage none = stage_at({}, 512, 3, 7);
  EXPECT_EQ(none.seq_len, 512);
  EXPECT_EQ(none.batch_size, 3);
}

// The main job's earlier schedule: 540 steps, batch 16 at 256 tokens.
TEST(SeqLenSchedule, RemainingTimeScalesEachStepByItsStagesTokens) {
  const auto stages = parse_seq_len_schedule("256@0, 1024x8@400, 4096x4@500");
  const SeqLenStage last{4096, 500, 4}, middle{1024, 400, 8}, first{256, 0, 16};
  // From step 500: 40 steps of the last stage at its own rate.
  EXPECT_DOUBLE_EQ(remaining_seconds(stages, 4096, 16, 500, 540, last, 0.8), 32.0);
  // From step 400 at 0.2 s a step: 100 such steps, then 40 of twice the tokens.
  EXPECT_DOUBLE_EQ(remaining_seconds(stages, 4096, 16, 400, 540, middle, 0.2), 20.0 + 16.0);
  // From step 100 at 0.05 s: 300 steps, then 100 and 40 of 2 and 4 times the tokens.
  EXPECT_DOUBLE_EQ(remaining_seconds(stages, 4096, 16, 100, 540, first, 0.05),
                   15.0 + 100 * 0.1 + 40 * 0.2);
  // Without a curriculum every step costs the same.
  EXPECT_DOUBLE_EQ(remaining_seconds({}, 4096, 4, 10, 30, {4096, 0, 4}, 0.5), 10.0);
  EXPECT_DOUBLE_EQ(remaining_seconds(stages, 4096, 16, 540, 540, last, 0.8), 0.0);
}

TEST(SeqLenSchedule, RulesBetweenStagesNameTheProblem) {
  auto problem = [](const std::string& text, int64_t seq_len, int64_t steps) {
    return seq_len_schedule_problem(parse_seq_len_schedule(text), seq_len, steps);
  };
  EXPECT_EQ(problem("256@0, 4096@500", 4096, 600), "");
  EXPECT_NE(problem("256@10, 4096@500", 4096, 600).find("must start at step 0"), std::string::npos);
  EXPECT_NE(problem("256@0, 4096@0", 4096, 600).find("not after stage 1"), std::string::npos);
  EXPECT_NE(problem("1024@0, 512@100", 512, 600).find("not longer than stage 1"),
            std::string::npos);
  EXPECT_NE(problem("256@0, 2048@500", 4096, 600).find("is not train.seq_len = 4096"),
            std::string::npos);
  EXPECT_NE(problem("256@0, 4096@600", 4096, 600).find("it would never train"), std::string::npos);
}

TEST(SeqLenSchedule, ConfigRefusesBadSchedulesNamingTheKey) {
  const std::string base =
      "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
      "train: {steps: 10, seq_len: 64}\ndata: {source: synthetic}\n";
  auto error_of = [&](const std::string& schedule) -> std::string {
    try {
      Config config = parse_config(base, {"train.seq_len_schedule=" + schedule}, "c.yaml");
      validate_for_world(config, 4);
      Config sp4 =
          parse_config(base, {"train.seq_len_schedule=" + schedule, "parallel.sp=4"}, "c.yaml");
      validate_for_world(sp4, 4);
    } catch (const std::exception& error) {
      return error.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("32@0, 64@5"), "");
  EXPECT_NE(error_of("32@0, 48@5").find("is not train.seq_len = 64"), std::string::npos);
  EXPECT_NE(error_of("32@0, 48@5").find("train.seq_len_schedule"), std::string::npos);
  EXPECT_EQ(error_of("30@0, 64@5"), "");  // 30 tokens on sp 4 are padded to 32
  EXPECT_NE(error_of("32 at 0").find("train.seq_len_schedule"), std::string::npos);
  EXPECT_NE(error_of("4@0, 64@5").find("too short for the synthetic task"), std::string::npos);
}

TEST(SyntheticPlacement, EveryQueryAsksForTheKeyWhereTheDataSaysItIs) {
  DataConfig data;
  data.n_pairs = 3;
  data.n_queries = 2;
  data.n_keys = 8;
  data.plant_fraction = 1.0;
  const int64_t seq_len = 512;
  auto dataset = make_dataset(data, Split::val, seq_len, synthetic_vocab(data).size(), 5);
  std::vector<int32_t> inputs(seq_len), targets(seq_len);
  for (int64_t index = 0; index < 20; ++index) {
    dataset->read_slice(index, 0, seq_len, inputs.data(), targets.data());
    const std::vector<Dataset::Query> queries = dataset->queries(index);
    ASSERT_EQ(queries.size(), 2u);
    for (const Dataset::Query& query : queries) {
      EXPECT_EQ(inputs[query.asked_at - 1], SyntheticVocab::kQuery);
      EXPECT_EQ(inputs[query.key_at - 1], SyntheticVocab::kPair);
      EXPECT_EQ(inputs[query.key_at], inputs[query.asked_at]) << "sequence " << index;
      EXPECT_GE(targets[query.asked_at], 0) << "the answer is scored";
    }
  }
}

TEST(SyntheticPlacement, KeysSitInEveryRanksSliceAndQueriesOnTheLast) {
  DataConfig data;
  data.n_pairs = 1;
  data.n_queries = 1;
  data.n_keys = 1;
  data.plant_fraction = 1.0;
  auto dataset = make_dataset(data, Split::val, 4096, synthetic_vocab(data).size(), 1);
  const QueryPlacement placement = query_placement(*dataset, 64, 4096, 4, 1);
  ASSERT_EQ(placement.queries, 64);
  for (int rank = 0; rank < 4; ++rank) EXPECT_GT(placement.keys_per_rank[rank], 5) << rank;
  EXPECT_EQ(placement.asked_per_rank[3], 64);
  EXPECT_EQ(placement.across_ranks, 64 - placement.keys_per_rank[3]);
  const std::string line = describe_placement(placement);
  EXPECT_NE(line.find("keys on sp ranks 0/1/2/3: "), std::string::npos) << line;
  EXPECT_NE(line.find("queries asked by rank 3: 64"), std::string::npos) << line;

  // The default plant_fraction (0.75) leaves the last slice without keys.
  data.plant_fraction = 0.75;
  auto early = make_dataset(data, Split::val, 4096, synthetic_vocab(data).size(), 1);
  EXPECT_EQ(query_placement(*early, 64, 4096, 4, 1).keys_per_rank[3], 0);
}

// A curriculum run changes length and batch at step 3; resuming before and after the change
// gives the uninterrupted run's losses bit for bit.
TEST(Curriculum, ResumeIsExactOnBothSidesOfALengthChange) {
  TempDir dir;
  auto yaml = [&](const std::string& name) {
    return "model: {family: llama, n_layers: 2, d_model: 32, n_heads: 4, d_ff: 64}\n"
           "train: {steps: 6, batch_size: 4, seq_len: 64, seq_len_schedule: '32@0, 64x2@3', "
           "lr: 3.0e-3, warmup_steps: 2, seed: 5, checkpoint: {dir: " +
           dir.file("ckpt_" + name) + ", every: 1}}\n" +
           "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n" +
           "log: {metrics_file: " + dir.file(name + ".jsonl") + "}\n";
  };
  for (const char* name : {"full", "from2", "from4"})
    testing::write_text_file(dir.file(std::string(name) + ".yaml"), yaml(name));
  const auto full = run_command(kTrain + " --config " + dir.file("full.yaml"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("seq_len 32 x batch 4 -> 64 x 2 from step 4"), std::string::npos)
      << full.output;
  std::vector<int64_t> tokens;
  for (const nlohmann::json& line : testing::read_metrics_lines(dir.file("full.jsonl")))
    if (line.contains("tokens")) tokens.push_back(line["tokens"].get<int64_t>());
  EXPECT_EQ(tokens, (std::vector<int64_t>{128, 128, 128, 128, 128, 128}))
      << "32 x 4 and 64 x 2 are both 128 tokens per step";

  const std::vector<double> losses = testing::read_step_losses(dir.file("full.jsonl"));
  ASSERT_EQ(losses.size(), 6u);
  for (int from : {2, 4}) {
    const std::string name = "from" + std::to_string(from);
    const auto resumed =
        run_command(kTrain + " --config " + dir.file(name + ".yaml") + " --resume " +
                    dir.file("ckpt_full/step_0000000" + std::to_string(from)));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const std::vector<double> tail = testing::read_step_losses(dir.file(name + ".jsonl"));
    ASSERT_EQ(tail.size(), size_t(6 - from));
    for (size_t i = 0; i < tail.size(); ++i)
      EXPECT_EQ(tail[i], losses[from + i]) << "resumed at " << from << ", step " << from + i + 1;
  }
}

}  // namespace
}  // namespace ulysses
