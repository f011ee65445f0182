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

// One (sp/ring, ring) split of sp (docs/parallelism.md, "Ulysses × ring"), as configured
// otherwise: its plan and whether it fits, or why it cannot be planned.
struct RingSplit {
  int ring = 1;
  std::string error;  // empty when planned
  MemoryPlan plan;
  bool fits = false;
};
// Every split of sp at seq_len, ring = 1 first.
std::vector<RingSplit> ring_splits(const PlanTarget& target, int64_t seq_len, int sp);

// plan --longest for one sp: each option set of the ladder with the longest seq_len it fits
// (longest_fitting_seq, lengths a multiple of granule · sp), or why sp cannot be planned.
struct LongestFit {
  OptionSet options;
  int64_t seq_len = 0;
  double seconds = 0;  // the search's time
};
struct LongestFits {
  std::string verdict;  // empty when sp plans
  std::vector<LongestFit> fits;
};
LongestFits longest_fits(const PlanTarget& target, int sp, int64_t granule);

// An option set's overrides with each key once, at its last value, in the order the keys first
// appear: what a run's --set takes.
std::vector<std::string> distinct_overrides(const std::vector<std::string>& overrides);

// heads, kv heads, seq_len and head_chunks against sp, one line each ("ok" or why not).
std::vector<std::string> divisibility_verdicts(const Config& config, int64_t seq_len, int sp);

}  // namespace ulysses
