// ulysses-train as a user runs it: --help, --dry-run, config errors, metrics file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/memory.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;

// A one-layer model on the synthetic task; train_extra goes inside the train map.
std::string tiny_yaml(const std::string& extra = "", const std::string& train_extra = "") {
  return "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
         "train: {steps: 4, batch_size: 2, seq_len: 64, seed: 3" +
         train_extra +
         "}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n" +
         extra;
}

TEST(Cli, HelpListsEveryOption) {
  auto result = run_command(kTrain + " --help");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* option : {"--config", "--set", "--dry-run", "--resume"})
    EXPECT_NE(result.output.find(option), std::string::npos) << option;
}

// --version, for a script that records what it ran: the version each run logs first.
TEST(Cli, VersionIsTheOneARunLogs) {
  auto version = run_command(kTrain + " --version");
  ASSERT_EQ(version.exit_code, 0) << version.output;
  ASSERT_EQ(version.output.rfind("ulysses-train ", 0), 0u) << version.output;
  const std::string text = version.output.substr(0, version.output.find('\n'));
  ASSERT_GT(text.size(), std::string("ulysses-train ").size()) << version.output;
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml());
  auto trained = run_command("cd " + dir.path() + " && " + kTrain + " --config " +
                             dir.file("c.yaml") + " --set train.steps=1");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("info " + text + ": "), std::string::npos) << text << "\n"
                                                                           << trained.output;
}

TEST(Cli, MissingConfigOptionExitsTwo) {
  auto result = run_command(kTrain);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--config"), std::string::npos) << result.output;
}

TEST(Cli, BadConfigExitsTwoNamingKeyAndLine) {
  TempDir dir;
  testing::write_text_file(dir.file("bad.yaml"), tiny_yaml("train_typo: 3\n"));
  auto result = run_command(kTrain + " --config " + dir.file("bad.yaml"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("train_typo"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(":4"), std::string::npos) << result.output;

  testing::write_text_file(dir.file("good.yaml"), tiny_yaml());
  result = run_command(kTrain + " --config " + dir.file("good.yaml") + " --set train.lr=-1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("train.lr"), std::string::npos) << result.output;
}

TEST(Cli, DryRunPrintsResolvedConfigParametersAndMemoryPlan) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml());
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml") + " --dry-run");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"parameters", "params:", "grads:", "optimizer:", "activations:",
                           "attention:", "total:", "n_layers: 1", "ZeRO stage 0: 3 units"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
  EXPECT_FALSE(std::ifstream(dir.file("metrics.jsonl")).good());
}

// The dry run says how the run's check against this machine's memory would go: it fits, or
// the run would stop before its first step (the dry run itself still exits 0: the config is
// valid), or memory.limit_gib replaces the check.
TEST(Cli, DryRunSaysWhetherTheStepFitsThisMachine) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml());
  const std::string dry_run = kTrain + " --config " + dir.file("c.yaml") + " --dry-run";
  auto fits = run_command(dry_run);
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_NE(fits.output.find("# this machine: the step peak "), std::string::npos) << fits.output;
  EXPECT_NE(fits.output.find(" this rank can have (host memory"), std::string::npos) << fits.output;
  // 2^31 - 1 tokens x 1024: more than any machine has.
  const std::string huge = " --set train.seq_len=2147483647 --set train.batch_size=1024";
  auto too_big = run_command(dry_run + huge);
  EXPECT_EQ(too_big.exit_code, 0) << too_big.output;
  EXPECT_NE(too_big.output.find("# this machine: the run would stop before its first step (exit "
                                "1): the memory plan needs "),
            std::string::npos)
      << too_big.output;
  auto limited = run_command(dry_run + huge + " --set memory.limit_gib=1073741824");
  EXPECT_NE(limited.output.find("# this machine: memory.limit_gib is set, so the run is held to "
                                "it, not to this machine's memory"),
            std::string::npos)
      << limited.output;
  // What the dry run said is what the run does.
  auto run = run_command(kTrain + " --config " + dir.file("c.yaml") + huge);
  EXPECT_EQ(run.exit_code, 1) << run.output;
}

TEST(Cli, TrainsAndWritesOneMetricsLinePerStep) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"),
                           tiny_yaml("log: {metrics_file: " + dir.file("m.jsonl") + "}\n",
                                     ", eval_every: 2, eval_steps: 1"));
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("tok/s"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("ETA"), std::string::npos) << result.output;
  auto lines = testing::read_metrics_lines(dir.file("m.jsonl"));
  int steps = 0, evals = 0;
  for (const auto& line : lines) {
    if (line.contains("eval_loss")) {
      ++evals;
      EXPECT_TRUE(line.contains("eval_accuracy"));
      continue;
    }
    ++steps;
    EXPECT_EQ(line["step"].get<int>(), steps);
    for (const char* key :
         {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms", "mem_peak_bytes",
          "accuracy", "all_to_all_bytes", "grad_comm_bytes", "comm_wait_s"})
      EXPECT_TRUE(line.contains(key)) << key;
    EXPECT_TRUE(line["mem_peak_bytes"].contains("attention"));
    EXPECT_GT(line["mem_peak_bytes"]["params"].get<int64_t>(), 0);
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(evals, 2);
}

// log.metrics_file and log.trace_file may name folders that do not exist yet, as
// train.checkpoint.dir may: the run creates them (docs/configuration.md#log).
TEST(Cli, CreatesTheFoldersOfItsLogFiles) {
  TempDir dir;
  const std::string metrics = dir.file("runs/a/metrics.jsonl");
  const std::string trace = dir.file("runs/b/traces/trace.json");
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml("log: {metrics_file: " + metrics +
                                                         ", trace_file: " + trace + "}\n"));
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(testing::read_metrics_lines(metrics).size(), 4u);
  EXPECT_TRUE(nlohmann::json::parse(testing::read_text_file(trace)).contains("traceEvents"));
}

TEST(Cli, MemoryLimitFailsWithTheHeldBytesByCategory) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml("memory: {limit_gib: 0.0005}\n"));
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  for (const char* text : {"out of memory", "memory.limit_gib", "params", "activations", "held"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
}

// The plan needs no device: a cuda plan charges bf16 compute copies and cuBLASLt's workspace.
TEST(Cli, DryRunPlansCudaWithoutAGpu) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml("device: cuda\n"));
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml") + " --dry-run");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"on cuda", "params:", "step peak", "workspace: 32."})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
}

TEST(Cli, PlanRunsWithoutMpiAndExplainsItself) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml());
  auto help = run_command(kTrain + " plan --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* option : {"--seq", "--sp", "--world", "--device-gib", "--longest"})
    EXPECT_NE(help.output.find(option), std::string::npos) << option;
  auto result = run_command(kTrain + " plan --config " + dir.file("c.yaml") +
                            " --seq 64,66 --sp 1,2 --device-gib 1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"FITS", "all-to-all", "host per rank", "seq_len 66 % sp 2: ok"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
  auto bad = run_command(kTrain + " plan --config " + dir.file("c.yaml") + " --seq 12q");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

// With a ring the head rules bind sp / ring: llama3-8b's 32 heads on sp 64 as 32 x ring 2
// plan (they crashed the planner's option ladder, which looked for head chunks of sp 64).
TEST(Cli, PlanWithARingSplitsTheHeadsOverSpOverRing) {
  const std::string plan = kTrain + " plan -c " ULYSSES_SOURCE_DIR
                                    "/configs/llama3-8b.yaml --set parallel.ring=2 --sp 64 "
                                    "--device-gib 80";
  auto point = run_command(plan + " --seq 8k");
  EXPECT_EQ(point.exit_code, 0) << point.output;
  for (const char* text : {"heads 32 % sp/ring 32: ok", "kv heads 8 on sp/ring 32: replicated",
                           "FITS", "cheapest options that fit"})
    EXPECT_NE(point.output.find(text), std::string::npos) << text << "\n" << point.output;
  auto longest = run_command(plan + " --longest --granule 8192");
  EXPECT_EQ(longest.exit_code, 0) << longest.output;
  EXPECT_NE(longest.output.find("sp 64  ZeRO-3 + layer checkpointing"), std::string::npos)
      << longest.output;
}

std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  std::stringstream text(output);
  for (std::string line; std::getline(text, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// A plan command's report and the lines of the same command with --json, both run.
struct PlanOutputs {
  std::string report;
  std::vector<nlohmann::json> lines;
};
PlanOutputs report_and_json(const std::string& plan) {
  auto report = run_command(plan);
  auto json = run_command(plan + " --json");
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_EQ(json.exit_code, 0) << json.output;
  if (json.exit_code != 0) return {report.output, {}};
  return {report.output, json_lines(json.output)};
}

// plan --json, for scripts: the report's numbers, and a cheapest option set whose overrides,
// given back as --set, plan to exactly what it said.
TEST(Cli, PlanJsonHasTheReportsNumbersAndOverridesThatRun) {
  const std::string plan = kTrain + " plan -c " ULYSSES_SOURCE_DIR
                                    "/configs/llama3-8b.yaml --seq 128k --sp 8 --device-gib 30";
  const auto [report, lines] = report_and_json(plan);
  ASSERT_EQ(lines.size(), 1u) << report;
  const nlohmann::json& point = lines[0];
  EXPECT_EQ(point["kind"], "point");
  EXPECT_EQ(point["seq_len"], 131072);
  EXPECT_EQ(point["sp"], 8);
  EXPECT_EQ(point["dp"], 1);
  EXPECT_EQ(point["budget_bytes"], int64_t(30) << 30);
  EXPECT_EQ(point["fits"], false) << "30 GiB is below the peak of the config's own options";
  EXPECT_NE(report.find("DOES NOT FIT: peak " +
                        format_bytes(point["plan"]["rank_need_bytes"].get<int64_t>())),
            std::string::npos)
      << report << point.dump(2);
  ASSERT_TRUE(point["cheapest"].is_object()) << point.dump(2);
  const nlohmann::json& cheapest = point["cheapest"];
  EXPECT_NE(report.find("cheapest options that fit: " + cheapest["name"].get<std::string>() +
                        " (peak " + format_bytes(cheapest["rank_need_bytes"].get<int64_t>())),
            std::string::npos)
      << report << point.dump(2);
  ASSERT_EQ(point["ring_splits"].size(), 4u) << point.dump(2);  // ring 1, 2, 4, 8
  EXPECT_EQ(point["ring_splits"][0]["rank_need_bytes"], point["plan"]["rank_need_bytes"]);

  std::string with_cheapest = plan + " --json";
  for (const nlohmann::json& override_text : cheapest["overrides"])
    with_cheapest += " --set " + override_text.get<std::string>();
  auto again = run_command(with_cheapest);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const nlohmann::json replanned = json_lines(again.output).at(0);
  EXPECT_EQ(replanned["fits"], true) << replanned.dump(2);
  EXPECT_EQ(replanned["plan"]["rank_need_bytes"], cheapest["rank_need_bytes"]);
}

TEST(Cli, PlanLongestJsonHasTheReportsLengths) {
  const std::string plan =
      kTrain + " plan -c " ULYSSES_SOURCE_DIR
               "/configs/llama3-8b.yaml --sp 3,8 --device-gib 80 --longest --granule 8192";
  const auto [report, lines] = report_and_json(plan);
  ASSERT_GE(lines.size(), 2u) << report;
  EXPECT_EQ(lines[0]["sp"], 3);
  EXPECT_NE(lines[0]["error"].get<std::string>().find("does not divide the 8 ranks"),
            std::string::npos)
      << lines[0].dump();
  int longer_than_zero = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["kind"], "longest");
    EXPECT_EQ(lines[i]["sp"], 8);
    EXPECT_EQ(lines[i]["granule_tokens"], 8 * 8192);
    const int64_t longest = lines[i]["longest_seq_len"];
    longer_than_zero += longest > 0;
    char row[256];
    std::snprintf(row, sizeof row, "  sp 8  %-70s %12lld tokens",
                  lines[i]["options"]["name"].get<std::string>().c_str(), (long long)longest);
    EXPECT_NE(report.find(row), std::string::npos) << row << "\n" << report;
  }
  EXPECT_GT(longer_than_zero, 0) << report;
}

TEST(Cli, CudaWithoutAUsableGpuExitsTwoSayingSo) {
  TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), tiny_yaml("device: cuda\n"));
  auto result = run_command(kTrain + " --config " + dir.file("c.yaml"));
  bool no_device = result.output.find("no CUDA device") != std::string::npos;
  bool no_backend = result.output.find("no CUDA backend") != std::string::npos;
  if (!no_device && !no_backend && result.exit_code == 0)
    GTEST_SKIP() << "a CUDA device is present: nothing to refuse";
  EXPECT_TRUE(no_device || no_backend) << result.output;
  EXPECT_EQ(result.exit_code, 2) << result.output;
}

}  // namespace
}  // namespace ulysses
