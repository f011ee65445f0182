// The bad-input corpus (tests/bad_inputs/, docs/failures.md): one test per line of
// cases.tsv — configs, token shards, text, checkpoints, safetensors, Hugging Face folders and
// llm.c files that are broken in one way each — asserting the exit status and a fragment
// of the message that names the problem. tests/bad_inputs/run_cases.sh runs the same table
// from a shell; tests/bad_inputs/make_corpus.sh says how each generated file was broken.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace ulysses {
namespace {

const std::string kCorpus = std::string(ULYSSES_SOURCE_DIR) + "/tests/bad_inputs";

struct BadInput {
  std::string name;
  int exit_code = 0;
  std::string fragment;
  std::string command;
};

// name <TAB> expected_exit <TAB> message_fragment <TAB> command; '#' lines are comments.
std::vector<BadInput> read_cases() {
  std::vector<BadInput> cases;
  std::ifstream in(kCorpus + "/cases.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::stringstream stream(line);
    for (std::string field; std::getline(stream, field, '\t');) fields.push_back(field);
    BadInput bad;
    bad.name = fields.size() == 4 ? fields[0] : "malformed_line_" + std::to_string(cases.size());
    if (fields.size() == 4) {
      bad.exit_code = std::stoi(fields[1]);
      bad.fragment = fields[2];
      bad.command = fields[3];
    }
    cases.push_back(bad);
  }
  return cases;
}

// GoogleTest prints a failing parameter: its name, not its bytes.
void PrintTo(const BadInput& bad, std::ostream* out) {
  *out << bad.name;
}

class BadInputs : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputs, ExitStatusAndMessageNameTheProblem) {
  const BadInput& bad = GetParam();
  ASSERT_FALSE(bad.command.empty()) << "cases.tsv: a line without four tab-separated fields";
  testing::TempDir scratch;
  testing::write_text_file(scratch.file("case.sh"), bad.command + "\n");
  // mpirun(ranks) is "env ... mpirun --bind-to none -np N ": the cases append the count.
  std::string mpirun = testing::mpirun(0);
  mpirun = mpirun.substr(0, mpirun.rfind("-np ") + 3);
  const std::string environment = "cd " + kCorpus + " && TRAIN=" + ULYSSES_TRAIN_BIN +
                                  " DIR=" + kCorpus + " TMP=" + scratch.path() + " MPIRUN='" +
                                  mpirun + "' OMP_NUM_THREADS=1 ";
  const auto result = testing::run_command(environment + "timeout -k 10 60 bash " +
                                           scratch.file("case.sh") + " </dev/null");
  EXPECT_EQ(result.exit_code, bad.exit_code) << bad.command << "\n" << result.output;
  EXPECT_NE(result.output.find(bad.fragment), std::string::npos)
      << "expected '" << bad.fragment << "' in the output of\n"
      << bad.command << "\n"
      << result.output;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInputs, ::testing::ValuesIn(read_cases()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           std::string name = info.param.name;  // GoogleTest allows [A-Za-z0-9_]
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace ulysses
