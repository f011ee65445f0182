// `ulysses-train sample`: greedy continuation token for token as the PyTorch reference's
// (tests/reference), seeded draws reproducible, top-k 1 greedy, the synthetic task's
// answers agreeing with eval's accuracy, and bad arguments exiting 2.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/eval_testing.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kReference =
    "/usr/bin/python3 " + std::string(ULYSSES_SOURCE_DIR) + "/tests/reference/reference_model.py";

bool torch_available() {
  return run_command("/usr/bin/python3 -c 'import torch'").exit_code == 0;
}

std::vector<int32_t> ints_after(const std::string& output, const std::string& prefix) {
  std::vector<int32_t> values;
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return values;
  std::istringstream line(output.substr(at + prefix.size(), output.find('\n', at) - at));
  for (int32_t value; line >> value;) values.push_back(value);
  return values;
}

// A random Hugging Face Llama (tests/reference) and a byte-level text config of its shape.
class SampleFromHf : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch_available()) GTEST_SKIP() << "/usr/bin/python3 with torch is absent";
    const auto made = run_command(kReference + " --hf-checkpoint " + dir_.file("hf") +
                                  " --seed 5 --vocab 257 --max-seq-len 64");
    ASSERT_EQ(made.exit_code, 0) << made.output;
    testing::write_text_file(dir_.file("corpus.txt"), "text the config names as its data\n");
    testing::write_text_file(
        dir_.file("c.yaml"),
        "model: {family: llama, n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ff: 160, "
        "vocab_size: 257, max_seq_len: 64, rope_theta: 10000}\n"
        "train: {batch_size: 1, seq_len: 16}\n"
        "data: {source: text, path: " +
            dir_.file("corpus.txt") + "}\n");
  }
  std::vector<int32_t> sample(const std::string& arguments) {
    const auto result =
        run_command(kTrain + " sample --config " + dir_.file("c.yaml") + " --init-from " +
                    dir_.file("hf") + " --prompt 'The ' --max-new-tokens 16 --json " + arguments);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (result.exit_code != 0) return {};
    const nlohmann::json line = testing::last_json_line(result.output);
    EXPECT_EQ(line["prompt_tokens"], nlohmann::json({84, 104, 101, 32}));  // "The "
    return line["new_tokens"].get<std::vector<int32_t>>();
  }
  TempDir dir_;
};

TEST_F(SampleFromHf, GreedyContinuationMatchesThePyTorchReferenceTokenByToken) {
  const auto reference = run_command(kReference + " --greedy " + dir_.file("hf") +
                                     " --prompt-tokens 84,104,101,32 --new-tokens 16");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::vector<int32_t> expected = ints_after(reference.output, "tokens ");
  ASSERT_EQ(expected.size(), 16u) << reference.output;
  // Far above fp32 round-off: the argmax is the model's, not a coin toss between near-ties.
  const double smallest_gap = std::stod(reference.output.substr(
      reference.output.find("smallest_gap ") + std::string("smallest_gap ").size()));
  ASSERT_GT(smallest_gap, 1e-3) << reference.output;
  EXPECT_EQ(sample("--temperature 0"), expected);
}

TEST_F(SampleFromHf, SeededDrawsAreReproducibleAndTopKOfOneIsGreedy) {
  const std::vector<int32_t> greedy = sample("--temperature 0");
  const std::vector<int32_t> drawn = sample("--temperature 1.5 --seed 7");
  EXPECT_EQ(sample("--temperature 1.5 --seed 7"), drawn);
  EXPECT_NE(sample("--temperature 1.5 --seed 8"), drawn);
  EXPECT_NE(drawn, greedy);
  EXPECT_EQ(sample("--temperature 1.5 --top-k 1 --seed 7"), greedy);
}

// A run's config for sp ranks, with a ring inside them, samples on one rank as written for one:
// with the ring kept it was refused ("parallel.ring=2 does not divide parallel.sp=1").
TEST_F(SampleFromHf, AConfigForSpAndRingSamplesOnOneRank) {
  const std::vector<int32_t> greedy = sample("--temperature 0");
  ASSERT_FALSE(greedy.empty());
  EXPECT_EQ(sample("--temperature 0 --set parallel.sp=4 --set parallel.ring=2"), greedy);
}

TEST_F(SampleFromHf, PrintsTheDecodedTextWithoutJson) {
  const auto result =
      run_command(kTrain + " sample --config " + dir_.file("c.yaml") + " --init-from " +
                  dir_.file("hf") + " --prompt 'Once upon' --max-new-tokens 4 --temperature 0");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("\nOnce upon"), std::string::npos) << result.output;
}

// A long context's prompt comes from a file (or standard input): the same tokens as --prompt.
TEST_F(SampleFromHf, APromptFileIsThePromptsBytes) {
  testing::write_text_file(dir_.file("prompt.txt"), "The ");
  const std::vector<int32_t> greedy = sample("--temperature 0");
  ASSERT_FALSE(greedy.empty());
  const std::string command = kTrain + " sample --config " + dir_.file("c.yaml") + " --init-from " +
                              dir_.file("hf") +
                              " --max-new-tokens 16 --json --temperature 0 --prompt-file ";
  for (const std::string& source : {dir_.file("prompt.txt"), "- < " + dir_.file("prompt.txt")}) {
    const auto result = run_command(command + source);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json line = testing::last_json_line(result.output);
    EXPECT_EQ(line["prompt_tokens"], nlohmann::json({84, 104, 101, 32})) << source;
    EXPECT_EQ(line["new_tokens"].get<std::vector<int32_t>>(), greedy) << source;
  }
}

TEST_F(SampleFromHf, BadPromptsExitTwoSayingWhy) {
  struct Case {
    std::string arguments, message;
  };
  const Case cases[] = {
      {"--prompt-tokens 1,300", "token 300 is outside the vocabulary [0, 257)"},
      {"--prompt-tokens 1,2 --max-new-tokens 63", "make 65 tokens, more than model.max_seq_len 64"},
      {"--prompt a --prompt-tokens 1", "--prompt excludes --prompt-tokens"},
      {"", "give a prompt"},
      {"--prompt a --temperature -1", "temperature"},
      {"--prompt-file " + dir_.file("absent.txt"),
       "--prompt-file '" + dir_.file("absent.txt") + "' does not exist"},
      {"--prompt-file " + dir_.path(), "is a folder, not a file"},
      {"--prompt-file " + dir_.file("empty.txt"), "is empty: there is no prompt to continue"},
      {"--prompt a --prompt-file " + dir_.file("c.yaml"), "--prompt excludes --prompt-file"},
      {"--prompt-tokens 1 --prompt-file " + dir_.file("c.yaml"),
       "--prompt-file excludes --prompt-tokens"},
  };
  testing::write_text_file(dir_.file("empty.txt"), "");
  for (const Case& c : cases) {
    const auto result = run_command(kTrain + " sample --config " + dir_.file("c.yaml") +
                                    " --init-from " + dir_.file("hf") + " " + c.arguments);
    EXPECT_EQ(result.exit_code, 2) << c.arguments << "\n" << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << c.arguments << "\n"
                                                                << result.output;
  }
}

TEST(SampleSynthetic, GreedyAnswersAgreeWithEvalAccuracyOnTheSameSequences) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), testing::eval_run_yaml(dir));
  ASSERT_EQ(run_command(kTrain + " --config " + dir.file("c.yaml")).exit_code, 0);
  // eval reads validation sequences 0-3 (2 batches of 2); sample answers the same 4.
  const auto sampled =
      run_command(kTrain + " sample --config " + dir.file("c.yaml") + " --checkpoint " +
                  dir.file("ckpt") + " --temperature 0 --sequences 4 --json");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  const nlohmann::json answers = testing::last_json_line(sampled.output);
  ASSERT_EQ(answers["queries"].size(), 8u);  // 2 queries per sequence
  int right = 0;
  for (const nlohmann::json& query : answers["queries"]) {
    // The true value is the planted value: a value symbol (ids after the 3 specials, 16
    // fillers and 8 keys), asked for with a key symbol.
    EXPECT_GE(query["expected"].get<int>(), 3 + 16 + 8) << query;
    EXPECT_GE(query["key"].get<int>(), 3 + 16) << query;
    EXPECT_LT(query["key"].get<int>(), 3 + 16 + 8) << query;
    right += query["answer"] == query["expected"];
  }
  EXPECT_DOUBLE_EQ(answers["accuracy"].get<double>(), right / 8.0);
  EXPECT_DOUBLE_EQ(answers["accuracy"].get<double>(),
                   testing::trainer_eval_at(dir, 4)["eval_accuracy"].get<double>());

  const auto readable = run_command(kTrain + " sample --config " + dir.file("c.yaml") +
                                    " --checkpoint " + dir.file("ckpt") + " --temperature 0");
  ASSERT_EQ(readable.exit_code, 0) << readable.output;
  for (const char* text : {"query k", "-> model ", ", true v", "answers right"})
    EXPECT_NE(readable.output.find(text), std::string::npos) << text << "\n" << readable.output;
}

}  // namespace
}  // namespace ulysses
