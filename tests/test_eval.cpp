// `ulysses-train eval` on one rank: a checkpoint evaluates to exactly what the trainer's
// evaluation reported at that step, --json parses, and bad arguments exit 2 saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "tests/eval_testing.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

class EvalCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_text_file(dir_.file("c.yaml"), testing::eval_run_yaml(dir_));
    const auto run = run_command(kTrain + " --config " + dir_.file("c.yaml"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  testing::CommandResult eval(const std::string& arguments) {
    return run_command(kTrain + " eval --config " + dir_.file("c.yaml") + " " + arguments);
  }
  TempDir dir_;
};

TEST_F(EvalCommand, ACheckpointEvaluatesToWhatTheTrainerLoggedAtThatStep) {
  for (int step : {2, 4}) {
    const nlohmann::json logged = testing::trainer_eval_at(dir_, step);
    ASSERT_FALSE(logged.is_null()) << "no eval line at step " << step;
    const std::string folder = dir_.file("ckpt/step_0000000" + std::to_string(step));
    const auto result = eval("--checkpoint " + folder + " --json");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json line = testing::last_json_line(result.output);
    // The same weights, data and mesh: the same sums in the same order.
    EXPECT_EQ(line["loss"].get<double>(), logged["eval_loss"].get<double>()) << step;
    EXPECT_EQ(line["accuracy"].get<double>(), logged["eval_accuracy"].get<double>()) << step;
    EXPECT_EQ(line["tokens"].get<int64_t>(), logged["eval_tokens"].get<int64_t>()) << step;
    EXPECT_DOUBLE_EQ(line["perplexity"].get<double>(), std::exp(line["loss"].get<double>()));
    EXPECT_EQ(line["weights"].get<std::string>(), folder);
    EXPECT_EQ(line["split"].get<std::string>(), "held-out");
    EXPECT_EQ(line["sequences"].get<int>(), 4);  // eval_steps 2 x batch_size 2
  }
  // The two steps' weights differ, so the comparison above tells them apart.
  EXPECT_NE(testing::trainer_eval_at(dir_, 2)["eval_loss"],
            testing::trainer_eval_at(dir_, 4)["eval_loss"]);
}

TEST_F(EvalCommand, ACheckpointDirMeansItsNewestAndInitFromReadsTheSameWeights) {
  const auto from_dir = eval("--checkpoint " + dir_.file("ckpt") + " --json");
  ASSERT_EQ(from_dir.exit_code, 0) << from_dir.output;
  const nlohmann::json line = testing::last_json_line(from_dir.output);
  EXPECT_EQ(line["weights"].get<std::string>(), dir_.file("ckpt/step_00000004"));
  EXPECT_EQ(line["loss"].get<double>(),
            testing::trainer_eval_at(dir_, 4)["eval_loss"].get<double>());
  const auto init_from = eval("--init-from " + dir_.file("ckpt/step_00000004") + " --json");
  ASSERT_EQ(init_from.exit_code, 0) << init_from.output;
  EXPECT_EQ(testing::last_json_line(init_from.output)["loss"], line["loss"]);
}

// Without --checkpoint or --init-from, the run the config describes: the newest checkpoint of
// its train.checkpoint.dir.
TEST_F(EvalCommand, WithoutWeightsItEvaluatesTheNewestCheckpointOfTheConfigsRun) {
  const auto result = eval("--json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json line = testing::last_json_line(result.output);
  EXPECT_EQ(line["weights"].get<std::string>(), dir_.file("ckpt/step_00000004"));
  EXPECT_EQ(line["loss"].get<double>(),
            testing::trainer_eval_at(dir_, 4)["eval_loss"].get<double>());
}

TEST_F(EvalCommand, WithoutJsonPrintsLossPerplexityTokensAndAccuracy) {
  const auto result = eval("--checkpoint " + dir_.file("ckpt"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"eval loss ", "perplexity ", " tokens", "acc ", "held-out"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
}

// The batch an evaluation too large for the machine is advised to take (core/jobs/memory_fit.h):
// batches of a divisor of train.batch_size, eval_steps scaled up, read the same sequences.
// Other sequences would count other answers and give another loss; the same ones give the
// same answers, the loss apart only by the fp32 rounding of another batch shape's GEMMs and
// the order of its sums (4e-10 relative here; the bound is some 170 units of fp32 rounding;
// half the sequences give a loss 1% away).
TEST_F(EvalCommand, SmallerBatchesReadTheSameSequences) {
  const auto whole = eval("--checkpoint " + dir_.file("ckpt") + " --json");
  const auto halves = eval("--checkpoint " + dir_.file("ckpt") +
                           " --json --set train.batch_size=1 --set train.eval_steps=4");
  const auto others = eval("--checkpoint " + dir_.file("ckpt") +
                           " --json --set train.batch_size=1 --set train.eval_steps=2");
  for (const auto* run : {&whole, &halves, &others}) ASSERT_EQ(run->exit_code, 0) << run->output;
  const nlohmann::json a = testing::last_json_line(whole.output);
  const nlohmann::json b = testing::last_json_line(halves.output);
  EXPECT_EQ(b["sequences"], a["sequences"]);
  EXPECT_EQ(b["tokens"], a["tokens"]);
  EXPECT_EQ(b["accuracy"], a["accuracy"]);
  EXPECT_NEAR(b["loss"].get<double>(), a["loss"].get<double>(), 1e-5 * a["loss"].get<double>());
  // Half the sequences: the check above could tell them apart.
  EXPECT_GT(std::abs(testing::last_json_line(others.output)["loss"].get<double>() -
                     a["loss"].get<double>()),
            1e-3 * a["loss"].get<double>());
}

TEST_F(EvalCommand, BadArgumentsExitTwoSayingWhy) {
  struct Case {
    std::string arguments, message;
  };
  std::filesystem::create_directory(dir_.file("empty"));
  const Case cases[] = {
      {"--set \"train.checkpoint.dir=''\"",
       "give the weights: --checkpoint DIR or --init-from PATH, or a config whose "
       "train.checkpoint.dir holds the run's checkpoints"},
      {"--set train.checkpoint.dir=" + dir_.file("missing"),
       "train.checkpoint.dir: '" + dir_.file("missing") + "' does not exist"},
      {"--checkpoint " + dir_.file("ckpt") + " --init-from " + dir_.file("ckpt"),
       "--checkpoint excludes --init-from"},
      {"--checkpoint " + dir_.file("missing"), "missing' does not exist"},
      {"--init-from " + dir_.file("missing"), "missing' does not exist"},
      {"--checkpoint " + dir_.file("empty"), "no manifest.json and no step_* folders"},
      {"--checkpoint " + dir_.file("ckpt") + " --set model.d_model=64", "d_model"},
  };
  for (const Case& c : cases) {
    const auto result = eval(c.arguments);
    EXPECT_EQ(result.exit_code, 2) << c.arguments << "\n" << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << c.arguments << "\n"
                                                                << result.output;
  }
}

}  // namespace
}  // namespace ulysses
