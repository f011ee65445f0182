// How `ulysses-train plan` and `--dry-run` print a plan (docs/memory.md, "The planner").
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/plan/memory_plan.h"
#include "core/plan/plan_search.h"

namespace ulysses {

// Per category: persistent bytes and the step's peak; the device total; bytes sent per step;
// host memory per rank.
void print_memory_plan(std::ostream& out, const MemoryPlan& plan);
// A (seq_len, sp) point: divisibility, the plan as configured, fits or not, the cheapest
// option set that fits.
void print_plan_point(std::ostream& out, const PlanPoint& point, const PlanTarget& target);
// plan --longest: for each sp and each option set, the longest seq_len (a multiple of
// granule · sp) that fits the target's budget.
// Every (sp/ring, ring) split of sp at seq_len (docs/parallelism.md, "Ulysses × ring"), as
// configured otherwise: per-rank peak, bytes of the all-to-alls and of the ring's point to
// point per step, whether it fits, and which fitting split moves the fewest bytes.
void print_ring_splits(std::ostream& out, const PlanTarget& target, int64_t seq_len, int sp);

void print_longest_fits(std::ostream& out, const PlanTarget& target, const std::vector<int>& sps,
                        int64_t granule);

}  // namespace ulysses
