// scripts/sweep-seqlen.sh as a user runs it: one CSV row per run, a failing run is a row
// with its error (not the end of the sweep), and --budget-gib finds the longest sequence.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::stringstream text(testing::read_text_file(path));
  std::string line;
  while (std::getline(text, line)) lines.push_back(line);
  return lines;
}

std::string sweep(const std::string& arguments) {
  return "cd " ULYSSES_SOURCE_DIR " && OMP_NUM_THREADS=1 scripts/sweep-seqlen.sh --binary " +
         std::string(ULYSSES_TRAIN_BIN) + " --config configs/passkey-tiny.yaml --set "
         "train.batch_size=1 --steps 1 " + arguments;
}

TEST(Sweep, FailedRunIsARowWithItsError) {
  TempDir dir;
  auto result = run_command(sweep("--seq-lens 128,256 --sp 1,3 --zero 0 --checkpointing none --out " +
                                  dir.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 5u) << result.output;  // header + 2 seq lens x 2 sp
  EXPECT_EQ(rows[0].rfind("seq_len,sp,zero_stage,checkpointing,tokens_per_s", 0), 0u);
  EXPECT_EQ(rows[1].rfind("128,1,0,none,", 0), 0u) << rows[1];
  EXPECT_NE(rows[1].find(",0,"), std::string::npos) << rows[1];  // exit status 0
  EXPECT_EQ(rows[3].rfind("128,3,0,none,", 0), 0u) << rows[3];
  EXPECT_NE(rows[3].find("parallel.sp=3"), std::string::npos) << rows[3];
  if (std::filesystem::exists("/usr/bin/gnuplot")) {
    EXPECT_TRUE(std::filesystem::exists(dir.file("memory.png")));
    EXPECT_TRUE(std::filesystem::exists(dir.file("throughput.png")));
  }
}

TEST(Sweep, BudgetFindsTheLongestSequenceThatFits) {
  TempDir dir;
  // 4 MiB per rank fits a few hundred tokens of this model on one rank, with
  // checkpointing more.
  auto result = run_command(sweep("--seq-lens 64 --sp 1 --zero 0 --checkpointing none,layer "
                                  "--budget-gib 0.004 --out " + dir.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> longest = lines_of(dir.file("longest.csv"));
  ASSERT_EQ(longest.size(), 3u) << result.output;
  auto seq_len = [](const std::string& row) { return std::stoi(row.substr(row.rfind(',') + 1)); };
  int plain = seq_len(longest[1]), recomputed = seq_len(longest[2]);
  EXPECT_GT(plain, 0) << result.output;
  EXPECT_GE(recomputed, plain) << result.output;
  EXPECT_NE(testing::read_text_file(dir.file("sweep.csv")).find("out of memory"), std::string::npos);
}

}  // namespace
}  // namespace ulysses
