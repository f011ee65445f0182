// scripts/sweep-seqlen.sh as a user runs it: one CSV row per run, a failing run is a row
// with its error (not the end of the sweep), and --budget-gib finds the longest sequence.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
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
  while (std::getline(text, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // the CSV's line ends are \r\n
    lines.push_back(line);
  }
  return lines;
}

std::string sweep_of(const std::string& binary, const std::string& arguments) {
  return "cd " ULYSSES_SOURCE_DIR " && OMP_NUM_THREADS=1 scripts/sweep-seqlen.sh --binary " +
         binary + " --config configs/passkey-tiny.yaml --set train.batch_size=1 " + arguments;
}

std::string sweep(const std::string& arguments) {
  return sweep_of(ULYSSES_TRAIN_BIN, "--steps 1 " + arguments);
}

int count_of(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// The field `column` (named in the header) of a CSV row without quoted fields.
std::string field(const std::string& header, const std::string& row, const std::string& column) {
  auto fields = [](const std::string& line) {
    std::vector<std::string> parts;
    std::stringstream text(line);
    std::string part;
    while (std::getline(text, part, ',')) parts.push_back(part);
    return parts;
  };
  const std::vector<std::string> names = fields(header), values = fields(row);
  for (size_t i = 0; i < names.size() && i < values.size(); ++i)
    if (names[i] == column) return values[i];
  return "?";
}

TEST(Sweep, FailedRunIsARowWithItsError) {
  TempDir dir;
  auto result = run_command(
      sweep("--seq-lens 128,256 --sp 1,3 --zero 0 --checkpointing none --out " + dir.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 5u) << result.output;  // header + 2 seq lens x 2 sp
  EXPECT_NE(result.output.find("[1/4] seq      128 sp 1 "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[4/4] seq      256 sp 3 "), std::string::npos) << result.output;
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
  auto result =
      run_command(sweep("--seq-lens 64 --sp 1 --zero 0 --checkpointing none,layer "
                        "--budget-gib 0.004 --out " +
                        dir.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> longest = lines_of(dir.file("longest.csv"));
  ASSERT_EQ(longest.size(), 3u) << result.output;
  auto seq_len = [](const std::string& row) { return std::stoi(row.substr(row.rfind(',') + 1)); };
  int plain = seq_len(longest[1]), recomputed = seq_len(longest[2]);
  EXPECT_GT(plain, 0) << result.output;
  EXPECT_GE(recomputed, plain) << result.output;
  EXPECT_NE(longest[1].find(",budget,"), std::string::npos) << longest[1];
  EXPECT_NE(longest[2].find(",budget,"), std::string::npos) << longest[2];
  EXPECT_NE(testing::read_text_file(dir.file("sweep.csv")).find("out of memory"),
            std::string::npos);
}

// A sweep stopped part way is continued by the same command: the runs already in sweep.csv
// are not measured again, except a run that timed out; a row torn by a kill is dropped.
TEST(Sweep, ContinuesWhereItStopped) {
  TempDir dir;
  const std::string out = " --zero 0 --checkpointing none --sp 1 --out " + dir.path();
  auto first = run_command(sweep("--seq-lens 128" + out));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string measured = testing::read_text_file(dir.file("sweep.csv"));

  auto longer = run_command(sweep("--seq-lens 128,192" + out));
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_NE(longer.output.find("1 run(s) already measured"), std::string::npos) << longer.output;
  EXPECT_EQ(count_of(longer.output, "(in sweep.csv already)"), 1) << longer.output;
  std::vector<std::string> rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 3u) << longer.output;
  EXPECT_EQ(testing::read_text_file(dir.file("sweep.csv")).rfind(measured, 0), 0u)
      << "the rows measured before are kept as they were";

  // The 192-token run timed out, and a kill tore the row after it.
  const std::string timed_out = std::regex_replace(
      rows[2], std::regex("," + field(rows[0], rows[2], "exit_status") + ",,"), ",124,,");
  ASSERT_EQ(field(rows[0], timed_out, "exit_status"), "124") << timed_out;
  testing::write_text_file(dir.file("sweep.csv"),
                           rows[0] + "\n" + rows[1] + "\n" + timed_out + "\n256,1,0,no");
  auto again = run_command(sweep("--seq-lens 128,192" + out));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("1 run(s) already measured, 1 that timed out measured again, a "
                              "torn last row dropped"),
            std::string::npos)
      << again.output;
  rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 3u) << testing::read_text_file(dir.file("sweep.csv"));
  EXPECT_EQ(field(rows[0], rows[2], "seq_len"), "192");
  EXPECT_EQ(field(rows[0], rows[2], "exit_status"), "0");

  // Rows of another build are kept, with a warning naming both versions.
  nlohmann::json recorded = nlohmann::json::parse(testing::read_text_file(dir.file("sweep.json")));
  EXPECT_EQ(recorded["binary_version"].get<std::string>().rfind("ulysses-train ", 0), 0u);
  recorded["binary_sha256"] = "another build";
  recorded["binary_version"] = "ulysses-train v0";
  testing::write_text_file(dir.file("sweep.json"), recorded.dump());
  auto rebuilt = run_command(sweep("--seq-lens 128,192" + out));
  ASSERT_EQ(rebuilt.exit_code, 0) << rebuilt.output;
  EXPECT_NE(rebuilt.output.find("the trainer binary changed (ulysses-train v0 there, "),
            std::string::npos)
      << rebuilt.output;
  EXPECT_EQ(lines_of(dir.file("sweep.csv")).size(), 3u) << rebuilt.output;
}

// --ring sweeps Ulysses x ring inside each sp group (ring 2 only where it divides sp); a sweep
// from before --ring (no ring column) continues as ring 1 and gains the column.
TEST(Sweep, RingDegreesAreRowsAndOlderSweepsGainTheColumn) {
  TempDir dir;
  const std::string out = " --seq-lens 128 --zero 0 --checkpointing none --out " + dir.path();
  auto result = run_command(sweep("--sp 1,2 --ring 1,2" + out));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 4u) << result.output;  // sp 1 ring 1, sp 2 ring 1, sp 2 ring 2
  EXPECT_EQ(field(rows[0], rows[3], "sp") + " " + field(rows[0], rows[3], "ring"), "2 2");
  EXPECT_EQ(field(rows[0], rows[3], "exit_status"), "0") << rows[3];
  EXPECT_MENTIONS(result.output, "[3/3] seq      128 sp 2 zero0 none ring2");
  auto none = run_command(sweep("--sp 1 --ring 2" + out));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_MENTIONS(none.output, "--ring 2 divides none of --sp 1");

  // The same CSV as a sweep before --ring wrote it: without the last column.
  std::string older;
  for (const std::string& row : std::vector<std::string>(rows.begin(), rows.begin() + 3))
    older += row.substr(0, row.rfind(',')) + "\n";
  testing::write_text_file(dir.file("sweep.csv"), older);
  auto continued = run_command(sweep("--sp 1,2 --ring 1,2" + out));
  ASSERT_EQ(continued.exit_code, 0) << continued.output;
  EXPECT_MENTIONS(continued.output, "2 run(s) already measured");
  EXPECT_EQ(count_of(continued.output, "(in sweep.csv already)"), 2) << continued.output;
  rows = lines_of(dir.file("sweep.csv"));
  ASSERT_EQ(rows.size(), 4u) << continued.output;
  EXPECT_EQ(field(rows[0], rows[1], "ring"), "1") << rows[1];
  EXPECT_EQ(field(rows[0], rows[3], "ring"), "2") << rows[3];
}

// Rows of other settings would not compare: the folder is refused and left as it was.
TEST(Sweep, RefusesTheFolderOfASweepWithOtherSettings) {
  TempDir dir;
  const std::string out =
      " --seq-lens 128 --zero 0 --checkpointing none --sp 1 --out " + dir.path();
  auto first = run_command(sweep(out));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = testing::snapshot_files(dir.path());

  auto other = run_command(sweep_of(ULYSSES_TRAIN_BIN, "--steps 2" + out));
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("holds a sweep with other settings (--steps 1 there, 2 here)"),
            std::string::npos)
      << other.output;
  auto extra = run_command(sweep("--set train.seed=7" + out));
  EXPECT_EQ(extra.exit_code, 2) << extra.output;
  EXPECT_NE(extra.output.find(
                "--set ['train.batch_size=1'] there, ['train.batch_size=1', 'train.seed=7'] here"),
            std::string::npos)
      << extra.output;
  EXPECT_EQ(testing::snapshot_files(dir.path()), before);

  auto unrecorded = run_command("rm " + dir.file("sweep.json") + " && " + sweep(out));
  EXPECT_EQ(unrecorded.exit_code, 2) << unrecorded.output;
  EXPECT_NE(unrecorded.output.find("settings were not recorded"), std::string::npos)
      << unrecorded.output;
}

TEST(Sweep, RefusesAnOverrideOfWhatItSets) {
  TempDir dir;
  auto result =
      run_command(sweep("--seq-lens 128 --sp 1 --set train.seq_len=4096 --out " + dir.file("out")));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--set train.seq_len would override what the sweep sets for "
                               "each run: choose it with --seq-lens"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}

// Run from another folder, a sweep reads --config and writes --out there, as the trainer
// would (it used to change to the repository's root first).
TEST(Sweep, ReadsAndWritesItsPathsWhereItRuns) {
  TempDir dir;
  testing::write_text_file(
      dir.file("my.yaml"),
      testing::read_text_file(ULYSSES_SOURCE_DIR "/configs/passkey-tiny.yaml"));
  auto result = run_command("cd " + dir.path() +
                            " && OMP_NUM_THREADS=1 " ULYSSES_SOURCE_DIR
                            "/scripts/sweep-seqlen.sh --binary " ULYSSES_TRAIN_BIN
                            " --config my.yaml --set train.batch_size=1 --steps 1 --seq-lens 128 "
                            "--sp 1 --zero 0 --checkpointing none --out out");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> rows = lines_of(dir.file("out/sweep.csv"));
  ASSERT_EQ(rows.size(), 2u) << result.output;
  EXPECT_EQ(field(rows[0], rows[1], "exit_status"), "0") << rows[1];
}

// Lengths are written as `ulysses-train plan --seq` takes them; what is not a count is refused
// before any run, not a Python traceback.
TEST(Sweep, LengthsTakeThePlansSuffixes) {
  TempDir dir;
  auto result = run_command(
      sweep("--seq-lens 1k --sp 1 --zero 0 --checkpointing none --out " + dir.file("out")));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> rows = lines_of(dir.file("out/sweep.csv"));
  ASSERT_EQ(rows.size(), 2u) << result.output;
  EXPECT_EQ(field(rows[0], rows[1], "seq_len"), "1024") << rows[1];

  for (const std::string& bad : {"--seq-lens 1x", "--seq-lens 1", "--sp 0"}) {
    auto refused = run_command(sweep(bad + " --out " + dir.file("refused")));
    EXPECT_EQ(refused.exit_code, 2) << bad << ": " << refused.output;
    EXPECT_NE(refused.output.find("error: argument " + bad.substr(0, bad.find(' '))),
              std::string::npos)
        << bad << ": " << refused.output;
    EXPECT_EQ(refused.output.find("Traceback"), std::string::npos) << refused.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("refused")));
}

// --from-csv redraws earlier sweeps; a file that is none is named, with status 2.
TEST(Sweep, FromCsvNamesAFileThatIsNotASweep) {
  TempDir dir;
  testing::write_text_file(dir.file("other.csv"), "a,b\n1,2\n");
  for (const std::string& name : {"other.csv", "missing.csv"}) {
    auto result = run_command(sweep("--from-csv " + dir.file(name) + " --out " + dir.file("p")));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(result.output.rfind("sweep: ", 0), 0u) << result.output;
    EXPECT_EQ(result.output.find("Traceback"), std::string::npos) << result.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("p")));
}

// A sweep told to stop ends the run it waits for: no mpirun or rank is left training. While it
// runs, a second sweep into its folder is refused.
TEST(Sweep, StopSignalEndsTheRunningJob) {
  TempDir dir;
  // The ranks are found by this binary's path, which no other test's processes have.
  const std::string binary = dir.file("sweep-stop-ulysses-train");
  std::filesystem::create_symlink(ULYSSES_TRAIN_BIN, binary);
  // In the background as a simple command, so that $! is the sweep's own pid. Steps of 65536
  // tokens take seconds here, so the ranks print nothing for a while: a job left behind is
  // not ended early by writing into the pipe of a sweep that has gone.
  const std::string sweep_command =
      "cd " ULYSSES_SOURCE_DIR "; OMP_NUM_THREADS=1 scripts/sweep-seqlen.sh --binary " + binary +
      " --steps 100000 --seq-lens 65536 --zero 0 --checkpointing none --sp 2 --out " +
      dir.file("out");
  // The live processes of the job: mpirun and its ranks, whose command lines have the binary
  // followed by --config ("[s]weep" matches them, not the shell's own command line; a rank
  // that ended is a zombie until its new parent reaps it).
  const std::string live = "ps -eo stat=,args= | grep -v '^Z' | grep -c '" +
                           dir.file("[s]weep-stop-ulysses-train --config") + "'";
  auto result = run_command(
      sweep_command + " > " + dir.file("log") + " 2>&1 & sweep=$!; " +
      "for i in $(seq 600); do [ $(" + live + ") -ge 3 ] && break; sleep 0.1; done; " +
      "sleep 1; timeout -s KILL 20 env " + sweep_command.substr(sweep_command.find("OMP_")) +
      " 2>&1; echo \"second sweep exit $?\"; " +
      "kill -TERM $sweep; wait $sweep; echo \"sweep exit $?\"; " + "for i in $(seq 60); do [ $(" +
      live + ") = 0 ] && break; sleep 0.1; done; " + "echo \"left: $(" + live + ")\"; cat " +
      dir.file("log") + "; pkill -KILL -f '" + dir.file("[s]weep-stop-ulysses-train --config") +
      "'");
  EXPECT_NE(result.output.find("is in use by another sweep: let it end, or choose another --out\n"
                               "second sweep exit 2"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("sweep exit 143"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("left: 0"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("stopped by SIGTERM: 0 run(s)"), std::string::npos) << result.output;
}

// A run that fails for a reason other than the budget ends that option set's search at once,
// and longest.csv says so instead of "none fits".
TEST(Sweep, BudgetSearchEndsAtAFailureThatIsNotMemory) {
  TempDir dir;
  auto result =
      run_command(sweep("--seq-lens 1024 --sp 3 --zero 0 --checkpointing none "
                        "--budget-gib 0.004 --out " +
                        dir.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(lines_of(dir.file("sweep.csv")).size(), 2u) << result.output;  // header + one run
  const std::string longest = testing::read_text_file(dir.file("longest.csv"));
  EXPECT_NE(longest.find(",ended_by,longest_seq_len"), std::string::npos) << longest;
  EXPECT_NE(longest.find("\"failed at 960 tokens (exit 2): model.n_heads=4 is not divisible by "
                         "parallel.sp=3"),
            std::string::npos)
      << longest;
  EXPECT_NE(result.output.find("search ended: failed at 960 tokens"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace ulysses
