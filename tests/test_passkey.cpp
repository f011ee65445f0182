// The shipped passkey configs learn the task (>= 95% answer accuracy), on one rank and
// as the main job (sp = 4 under mpirun), where the passkey sits in another rank's slice
// than the question. The tests run them on sequences of 128 tokens rather than 256, with one
// eval (64 sequences) after the last of the 500 steps rather than one every 100: the same
// task, model and schedule at about half the cost. On this machine the one-rank run reaches
// 100% at steps 450 and 500 with seeds 1 to 4 (measured with the counter-based initial
// weights of core/model/param_init.h).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "data/dataset.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kConfigs = std::string(ULYSSES_SOURCE_DIR) + "/configs/";
const std::vector<std::string> kShortRun = {"train.seq_len=128", "train.eval_every=500"};

std::string short_run_options() {
  std::string options;
  for (const std::string& setting : kShortRun) options += " --set " + setting;
  return options;
}

double last_eval_accuracy(const std::string& metrics) {
  double accuracy = -1.0;
  for (const nlohmann::json& line : testing::read_metrics_lines(metrics))
    if (line.contains("eval_accuracy")) accuracy = line["eval_accuracy"].get<double>();
  return accuracy;
}

// The model, trainer and optimizer learn the task without sequence parallelism: the control
// that tells a learning problem apart from a sequence-parallel one. One thread, as each rank
// of the mpirun tests has: ctest runs tests side by side, and OpenMP threads that outnumber
// the free cores wait on each other.
TEST(Passkey, TinyConfigLearnsTheTaskOnOneRank) {
  TempDir dir;
  auto result = run_command("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + kTrain + " --config " +
                            kConfigs + "passkey-tiny.yaml" + short_run_options() +
                            " --set log.metrics_file=" + dir.file("m.jsonl"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_GE(last_eval_accuracy(dir.file("m.jsonl")), 0.95) << result.output;
}

// Over 50 sequences of the main job, the answer is planted in another rank's slice than the
// question.
void expect_passkey_in_another_slice(const Config& config) {
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
    ASSERT_GE(planted, 0) << "seq_len " << seq_len << " sequence " << index;
    EXPECT_NE(planted / slice, question / slice) << "seq_len " << seq_len << " sequence " << index;
  }
}

// As shipped and as the learning test below runs it.
TEST(Passkey, MainJobPlantsThePasskeyInAnotherRanksSliceThanTheQuestion) {
  for (const auto& overrides : {std::vector<std::string>{}, kShortRun}) {
    expect_passkey_in_another_slice(load_config(kConfigs + "passkey-sp4.yaml", overrides));
  }
}

// The same learning with every sequence split over 4 ranks, the passkey in another rank's
// slice than the question: solved only if attention crosses the slices (Ulysses all-to-all).
TEST(Passkey, MainJobLearnsTheTaskWithSequenceParallelismOverFourRanks) {
  TempDir dir;
  auto result = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout 600 mpirun -np 4 --bind-to none " +
      kTrain + " --config " + kConfigs + "passkey-sp4.yaml" + short_run_options() +
      " --set log.metrics_file=" + dir.file("m.jsonl"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("dp 1 x sp 4"), std::string::npos) << result.output;
  EXPECT_GE(last_eval_accuracy(dir.file("m.jsonl")), 0.95) << result.output;
}

}  // namespace
}  // namespace ulysses
