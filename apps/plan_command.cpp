#include "apps/plan_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "apps/common_options.h"
#include "core/jobs/job_errors.h"
#include "core/plan/plan_json.h"
#include "core/plan/plan_report.h"
#include "core/plan/plan_search.h"
#include "kernels/host_memory.h"

namespace ulysses {

namespace {

// "32k" = 32768, "1m" = 1048576, "500000" as written, in [low, high]; messages name the option.
int64_t parse_count(const std::string& text, const std::string& option, int64_t low, int64_t high) {
  const std::string rule = "must be between " + std::to_string(low) + " and " +
                           std::to_string(high) + ", got '" + text + "'";
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string suffix = text.substr(digits);
  int64_t unit = 1;
  if (suffix == "k" || suffix == "K")
    unit = 1024;
  else if (suffix == "m" || suffix == "M")
    unit = 1024 * 1024;
  else if (digits == 0 || !suffix.empty())
    throw CLI::ValidationError(option, "'" + text + "' is not a count (e.g. 32k, 1m, 500000)");
  // Compared digit by digit against high / unit, so no count overflows.
  int64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    value = value * 10 + (text[i] - '0');
    if (value > high / unit) throw CLI::ValidationError(option, rule);
  }
  value *= unit;
  if (value < low) throw CLI::ValidationError(option, rule);
  return value;
}

}  // namespace

int run_plan_command(int argc, char** argv) {
  PlanTarget target;
  std::vector<std::string> seqs, sps;
  int world = 0;
  double device_gib = 0.0;
  bool longest = false;
  bool json = false;
  int64_t granule = 1024;
  constexpr int64_t kLargestInt = std::numeric_limits<int>::max();  // train.seq_len, parallel.sp
  CLI::App app{
      "ulysses-train plan: plans the memory of a training step on any machine, without a GPU "
      "and without allocating: for each (seq_len, sp) the bytes per rank by category "
      "(persistent and step peak), the all-to-all bytes per step, the divisibility checks, "
      "whether it fits --device-gib, and the cheapest memory options that fit. device: cuda "
      "is planned with the cuda backend's dtypes and buffers (bf16 compute, fp32 master); "
      "cuDNN workspaces, known only on a device, are charged at a documented upper bound.\n"
      "Runs in one process (no mpirun). Exit status: 0 planned, 2 bad arguments or config.",
      "ulysses-train plan"};
  app.add_option("--config,-c", target.config_path, "YAML config file (docs/configuration.md)")
      ->required();
  app.add_option("--set", target.overrides, "override a config key, e.g. --set train.batch_size=1");
  app.add_option("--seq", seqs,
                 "sequence lengths, e.g. 32k,128k,1m (k = 1024, m = 1024²); "
                 "default: train.seq_len")
      ->delimiter(',');
  app.add_option("--sp", sps, "sequence-parallel degrees, e.g. 1,2,4,8; default: parallel.sp")
      ->delimiter(',');
  app.add_option("--world", world,
                 "ranks of the job (dp x sp); default: the largest --sp. ZeRO shards over it")
      ->check(number_between(1, kLargestInt));
  app.add_option("--device-gib", device_gib,
                 "device memory per rank in GiB (e.g. 80, 141); default: memory.limit_gib")
      ->check(number_between(kSmallestLimitGib, kLargestLimitGib));
  app.add_option("--cpu-threads", target.cpu_threads,
                 "device: cpu only: threads per rank, which size the attention tiles (default 1)")
      ->check(number_between(1, kLargestInt));
  app.add_flag("--longest", longest,
               "instead of the points: for each --sp and each option set, the longest seq_len "
               "that fits (bisection over multiples of --granule x sp)");
  app.add_option("--granule", granule, "--longest: lengths are multiples of this x sp (1024)")
      ->check(number_between(1, kLargestInt));
  app.add_flag("--json", json,
               "one JSON object per line instead of the report: a point's plan in bytes per rank, "
               "whether it fits, the cheapest option set (with the --set overrides it takes) and "
               "the ring splits; with --longest, each option set's longest seq_len");
  app.footer(
      "Option sets, cheapest first, each keeping the ones before: none, ZeRO-1/2/3 (world > 1), "
      "layer checkpointing, tiled MLP (auto), head chunks (the most the heads allow), offloaded "
      "layer inputs. Docs: docs/memory.md (\"The planner\").");
  try {
    app.parse(argc - 1, argv + 1);  // argv[1] is "plan"
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(ExitCode::bad_input);
  }

  try {
    std::vector<int64_t> seq_lens;
    for (const std::string& text : seqs)
      seq_lens.push_back(parse_count(text, "--seq", 2, kLargestInt));
    std::vector<int> sp_values;
    for (const std::string& text : sps)
      sp_values.push_back(int(parse_count(text, "--sp", 1, kLargestInt)));
    std::vector<std::string> warnings;
    const Config base = load_config(target.config_path, target.overrides, &warnings);
    for (const std::string& warning : warnings) std::cerr << "plan: warning: " << warning << "\n";
    if (seq_lens.empty()) seq_lens.push_back(base.train.seq_len);
    if (sp_values.empty()) sp_values.push_back(base.parallel.sp);
    target.world_size = world > 0 ? world : *std::max_element(sp_values.begin(), sp_values.end());
    const double gib = device_gib > 0 ? device_gib : base.memory.limit_gib;
    if (gib <= 0) {
      // A hint for a cpu run on this machine: what a run without a limit is checked against.
      const int64_t here = host_available_bytes();
      char hint[96] = "";
      if (base.device == BackendKind::cpu && here > 0)
        std::snprintf(hint, sizeof hint,
                      " (this machine has %.2f GiB available, for all its ranks)",
                      double(here) / (1024.0 * 1024.0 * 1024.0));
      throw CLI::ValidationError(
          "--device-gib",
          std::string("no budget: give --device-gib or set memory.limit_gib") + hint);
    }
    target.budget_bytes = int64_t(gib * 1024.0 * 1024.0 * 1024.0);
    if (longest && json) {
      for (int sp : sp_values)
        for (const nlohmann::json& line :
             longest_fits_json(longest_fits(target, sp, granule), target, sp, granule))
          std::cout << line.dump() << std::endl;
      return 0;
    }
    if (longest) {
      print_longest_fits(std::cout, target, sp_values, granule);
      return 0;
    }
    for (int sp : sp_values)
      for (int64_t seq_len : seq_lens) {
        const PlanPoint point = plan_point(target, seq_len, sp);
        if (json) {
          const std::vector<RingSplit> splits =
              sp > 1 ? ring_splits(target, seq_len, sp) : std::vector<RingSplit>{};
          std::cout << plan_point_json(point, target, splits).dump() << std::endl;
          continue;
        }
        print_plan_point(std::cout, point, target);
        if (sp > 1) print_ring_splits(std::cout, target, seq_len, sp);
      }
  } catch (const CLI::ValidationError& error) {
    std::cerr << "plan: " << error.what() << "\n";
    return int(ExitCode::bad_input);
  } catch (const std::exception& error) {
    std::cerr << "plan: " << error.what() << "\n";
    return int(exit_code_for(error));
  }
  return 0;
}

}  // namespace ulysses
