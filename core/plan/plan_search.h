// What `ulysses-train plan` asks of the planner (core/plan/memory_plan.h): a config planned at
// given sequence lengths and sp degrees, whether it fits a device budget, the cheapest set of
// memory options that does, and the longest sequence each option set fits (docs/memory.md,
// "The planner").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/plan/memory_plan.h"

namespace ulysses {

// A config file with overrides, planned for a world of world_size ranks.
struct PlanTarget {
  std::string config_path;
  std::vector<std::string> overrides;  // "a.b=value", applied before the planner's own
  int world_size = 1;
  int cpu_threads = 1;
  int64_t budget_bytes = 0;  // device memory per rank
};

// A set of memory options, as config overrides. The ladder goes from the cheapest in
// compute and communication to the most frugal in memory; each step keeps the ones before.
struct OptionSet {
  std::string name;
  std::vector<std::string> overrides;
};
std::vector<OptionSet> option_ladder(const Config& config, int world_size);

// One (seq_len, sp) point: the config as given and the first option set on the ladder that
// fits. verdict is the config error that makes the point impossible, empty when it plans.
struct PlanPoint {
  int64_t seq_len = 0;
  int sp = 1;
  std::string verdict;
  bool loaded = false;  // the config itself is valid (verdict then comes from the world)
  Config config;
  MemoryPlan plan;
  bool fits = false;
  std::optional<OptionSet> cheapest;
  MemoryPlan cheapest_plan;
};
PlanPoint plan_point(const PlanTarget& target, int64_t seq_len, int sp);

// The longest seq_len, a multiple of granule, whose plan with these options fits the
// budget; 0 when not even granule fits. Bisection: a handful of plans, none allocating.
int64_t longest_fitting_seq(const PlanTarget& target, int sp, const OptionSet& options,
                            int64_t granule);

// heads, kv heads, seq_len and head_chunks against sp, one line each ("ok" or why not).
std::vector<std::string> divisibility_verdicts(const Config& config, int64_t seq_len, int sp);

}  // namespace ulysses
