// `ulysses-train eval` and `sample` under real mpirun: a run trained on 2 ranks evaluates,
// on the same mesh, to exactly what its trainer logged; sample refuses more than one rank.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "tests/eval_testing.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

std::string on_two_ranks(const std::string& arguments) {
  return "timeout 120 " + testing::mpirun(2) + kTrain + " " + arguments;
}

// A mesh of two ranks: its parallel section, --set overrides of both the run and the eval,
// and its ring degree.
struct EvalMesh {
  std::string parallel;
  std::string overrides;
  int ring;
};
void PrintTo(const EvalMesh& mesh, std::ostream* out) {
  *out << mesh.parallel << mesh.overrides;
}

class MpiEval : public ::testing::TestWithParam<EvalMesh> {};

TEST_P(MpiEval, ACheckpointEvaluatesToWhatTheTrainerLoggedOnTheSameMesh) {
  TempDir dir;
  testing::write_text_file(
      dir.file("c.yaml"), testing::eval_run_yaml(dir, "parallel: {" + GetParam().parallel + "}\n"));
  const std::string config = "--config " + dir.file("c.yaml") + GetParam().overrides;
  const auto run = run_command(on_two_ranks(config));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int step : {2, 4}) {
    const auto result =
        run_command(on_two_ranks("eval " + config + " --checkpoint " +
                                 dir.file("ckpt/step_0000000" + std::to_string(step)) + " --json"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json line = testing::last_json_line(result.output);
    const nlohmann::json logged = testing::trainer_eval_at(dir, step);
    EXPECT_EQ(line["loss"].get<double>(), logged["eval_loss"].get<double>()) << step;
    EXPECT_EQ(line["accuracy"].get<double>(), logged["eval_accuracy"].get<double>()) << step;
    EXPECT_EQ(line["tokens"].get<int64_t>(), logged["eval_tokens"].get<int64_t>()) << step;
    EXPECT_EQ(line["world"].get<int>(), 2);
    EXPECT_EQ(line["ring"].get<int>(), GetParam().ring);
  }
}

// sp 2: each sequence split over both ranks; sp 1: two data-parallel ranks, ZeRO-2; sp 2 as
// a ring of 2 at a length padded for the zigzag (62 held as 64).
INSTANTIATE_TEST_SUITE_P(
    Meshes, MpiEval,
    ::testing::Values(EvalMesh{"sp: 2", "", 1}, EvalMesh{"sp: 1, zero_stage: 2", "", 1},
                      EvalMesh{"sp: 2, ring: 2", " --set train.seq_len=62", 2}));

TEST(MpiEvalErrors, AMissingCheckpointExitsTwoOnEveryRankAndSampleRefusesTwoRanks) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), testing::eval_run_yaml(dir));
  const auto missing = run_command(
      on_two_ranks("eval --config " + dir.file("c.yaml") + " --checkpoint " + dir.file("missing")));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("missing' does not exist"), std::string::npos) << missing.output;
  const auto sample = run_command(
      on_two_ranks("sample --config " + dir.file("c.yaml") + " --init-from " + dir.file("c.yaml")));
  EXPECT_EQ(sample.exit_code, 2) << sample.output;
  EXPECT_NE(sample.output.find("sample runs on one rank"), std::string::npos) << sample.output;
}

}  // namespace
}  // namespace ulysses
