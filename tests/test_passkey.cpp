// The shipped passkey configs learn the task (>= 95% answer accuracy), on one rank and
// as the main job (sp = 4 under mpirun), where the passkey sits in another rank's slice
// than the question.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "data/dataset.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kConfigs = std::string(ULYSSES_SOURCE_DIR) + "/configs/";

double last_eval_accuracy(const std::string& metrics) {
  double accuracy = -1.0;
  for (const nlohmann::json& line : testing::read_metrics_lines(metrics))
    if (line.contains("eval_accuracy")) accuracy = line["eval_accuracy"].get<double>();
  return accuracy;
}

TEST(Passkey, TinyConfigLearnsTheTaskOnOneRank) {
  TempDir dir;
  auto result = run_command(kTrain + " --config " + kConfigs +
                            "passkey-tiny.yaml --set log.metrics_file=" + dir.file("m.jsonl"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_GE(last_eval_accuracy(dir.file("m.jsonl")), 0.95) << result.output;
}

TEST(Passkey, MainJobPlantsThePasskeyInAnotherRanksSliceThanTheQuestion) {
  Config config = load_config(kConfigs + "passkey-sp4.yaml", {});
  const int sp = config.parallel.sp;
  const int64_t seq_len = config.train.seq_len, slice = seq_len / sp;
  auto dataset = make_dataset(config.data, Split::train, seq_len, config.model.vocab_size, 1);
  std::vector<int32_t> inputs(static_cast<size_t>(seq_len)), targets(inputs.size());
  for (int64_t index = 0; index < 50; ++index) {
    dataset->read_slice(index, 0, seq_len, inputs.data(), targets.data());
    int64_t question = -1;
    for (int64_t t = 0; t < seq_len; ++t)
      if (targets[size_t(t)] >= 0) question = t;
    ASSERT_GE(question, 0);
    int64_t planted = -1;  // where the answer appears earlier as an input
    for (int64_t t = 0; t < question - 1; ++t)
      if (inputs[size_t(t)] == targets[size_t(question)]) planted = t;
    ASSERT_GE(planted, 0) << "sequence " << index;
    EXPECT_NE(planted / slice, question / slice) << "sequence " << index;
  }
}

TEST(Passkey, MainJobLearnsTheTaskWithSequenceParallelismOverFourRanks) {
  TempDir dir;
  auto result = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout 600 mpirun -np 4 --bind-to none " +
      kTrain + " --config " + kConfigs +
      "passkey-sp4.yaml --set log.metrics_file=" + dir.file("m.jsonl"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("dp 1 x sp 4"), std::string::npos) << result.output;
  EXPECT_GE(last_eval_accuracy(dir.file("m.jsonl")), 0.95) << result.output;
}

}  // namespace
}  // namespace ulysses
