// What scripts/gpu-check.sh runs beside the GPU tests, run here on the cpu so that a GPU
// session does not find their bugs: ulysses-bench-gemm (its --shapes form; also the square
// form scripts/bench-cpu.sh reads), ulysses-bench-attention's arguments (and its cpu form) and
// the table of scripts/gpu_table.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kBench = ULYSSES_BENCH_GEMM_BIN;
const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kBenchAttention = ULYSSES_BENCH_ATTENTION_BIN;

// Shapes whose operands differ in every dimension and layout: a buffer made with the wrong
// extent for its transpose fails the backend's shape contract and the run.
TEST(BenchGemm, TimesEachShapeAndTheirFlopWeightedRate) {
  const auto result =
      run_command(kBench +
                  " --device cpu --shapes 48x40x24:nt,40x24x48:nn,24x48x40:tn,8x16x32:tt "
                  "--repeats 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* shape : {"gemm 48x40x24:nt f32: ", "gemm 40x24x48:nn f32: ",
                            "gemm 24x48x40:tn f32: ", "gemm 8x16x32:tt f32: "})
    EXPECT_MENTIONS(result.output, shape);
  EXPECT_MENTIONS(result.output, "all 4 shapes: ");
  EXPECT_MENTIONS(result.output, "(FLOP-weighted; best of 2, cpu, host time)");
}

TEST(BenchGemm, TheSquareFormStaysAsBenchCpuReadsIt) {
  const auto result = run_command(kBench + " 64 1 portable");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "sgemm 64x64x64: ");
  EXPECT_MENTIONS(result.output, "GFLOP/s (best of 1, portable)");
}

TEST(BenchGemm, ABadShapeIsNamed) {
  for (const char* shapes : {"48x40:nt", "48x40x0:nt", "48x40x24:nx", "48x40x24:ntt", ""}) {
    const auto result = run_command(kBench + " --device cpu --shapes '" + shapes + "'");
    EXPECT_EQ(result.exit_code, 2) << shapes << ": " << result.output;
    EXPECT_MENTIONS(result.output, "--shapes");
  }
  const auto missing = run_command(kBench + " --device cpu");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_MENTIONS(missing.output, "--device needs --shapes");
}

// A partial tile (100 tokens) and two head dims: a row each, with its times and rates.
TEST(BenchAttention, TheCpuFormTimesEachLengthAndHeadDim) {
  const auto result = run_command(kBenchAttention + " --device cpu 100,64 16,32");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "causal attention on the cpu backend");
  for (const char* row :
       {"   16     100 | ", "   16      64 | ", "   32     100 | ", "   32      64 | "})
    EXPECT_MENTIONS(result.output, row);
}

TEST(BenchAttention, BadArgumentsAreNamed) {
  for (const char* args :
       {"--device tpu", "--device", "--device cpu 64 16 extra", "--device cpu 0"}) {
    const auto result = run_command(kBenchAttention + " " + args);
    EXPECT_EQ(result.exit_code, 2) << args << ": " << result.output;
    EXPECT_MENTIONS(result.output, "usage: ulysses-bench-attention");
  }
  const auto dim = run_command(kBenchAttention + " --device cpu 64 12");
  EXPECT_EQ(dim.exit_code, 2) << dim.output;
  EXPECT_MENTIONS(dim.output, "head dim 12 does not divide 2048");
}

// The table on a one-layer model at 128 and 256 tokens, on the cpu: every run trains (on the
// random-token shard, where every target counts), and each row has its numbers.
TEST(GpuTable, EveryRunOfTheTableTrainsAndFillsItsRow) {
  TempDir dir;
  const auto result = run_command(
      "/usr/bin/python3 " ULYSSES_SOURCE_DIR "/scripts/gpu_table.py --binary " + kTrain +
      " --logs " + dir.path() + " --device cpu --shape 1,64,4,2,128,512 --seqs 128,256");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("failed"), std::string::npos) << result.output;
  EXPECT_MENTIONS(result.output, "all 21 shapes: ");
  EXPECT_MENTIONS(result.output, "where the step time went");
  EXPECT_MENTIONS(result.output, "GFLOP/s");
  EXPECT_MENTIONS(result.output, "verdict: ");
  EXPECT_MENTIONS(result.output, "run                 | tokens | tok/s");
  for (const char* row : {"native              | 128    | ", "native + layer ckpt | 128    | ",
                          "native              | 256    | ", "native + layer ckpt | 256    | "})
    EXPECT_MENTIONS(result.output, row);
  // Each row's loss ms, GEMM rate and the GEMMs alone (columns 7 to 9): numbers, not "-".
  const size_t table = result.output.rfind("\nrun ");
  ASSERT_NE(table, std::string::npos) << result.output;
  std::istringstream rows(result.output.substr(table + 1));
  std::string row;
  std::getline(rows, row);  // the header
  int checked = 0;
  while (std::getline(rows, row)) {
    std::vector<std::string> cells;
    for (size_t from = 0;;) {
      const size_t bar = row.find(" | ", from);
      cells.push_back(row.substr(from, bar == std::string::npos ? bar : bar - from));
      if (bar == std::string::npos) break;
      from = bar + 3;
    }
    ASSERT_EQ(cells.size(), 14u) << row;
    for (size_t column : {6u, 7u, 8u})
      EXPECT_GT(std::atof(cells[column].c_str()), 0.0) << "column " << column << ": " << row;
    ++checked;
  }
  EXPECT_EQ(checked, 4) << result.output;
  // Every target of the random-token shard counts: the loss phase computes all 128 rows.
  std::ifstream metrics(dir.file("native-plain-128.jsonl"));
  std::string line, last;
  while (std::getline(metrics, line))
    if (line.find("\"phases\"") != std::string::npos) last = line;
  const nlohmann::json step = nlohmann::json::parse(last);
  EXPECT_EQ(step["phases"]["loss"]["flops"].get<double>(), 3.0 * 2.0 * 128 * 64 * 512);
}

// --rows picks the runs and --set applies to every one: how a GPU session compares loss tiles.
TEST(GpuTable, RowsAndOverridesAreTheCallersChoice) {
  TempDir dir;
  const auto result =
      run_command("/usr/bin/python3 " ULYSSES_SOURCE_DIR "/scripts/gpu_table.py --binary " +
                  kTrain + " --logs " + dir.path() +
                  " --device cpu --shape 1,64,4,2,128,512 --seqs 128 --rows native "
                  "--set memory.loss_tile_tokens=32");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_MENTIONS(result.output, "every run with --set memory.loss_tile_tokens=32");
  EXPECT_MENTIONS(result.output, "\nnative | 128    | ");
  EXPECT_EQ(result.output.find("layer ckpt"), std::string::npos) << result.output;
  EXPECT_MENTIONS(testing::read_text_file(dir.file("native-plain-128.log")),
                  "loss tiles of 32 tokens");
}

}  // namespace
}  // namespace ulysses
