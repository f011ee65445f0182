// `ulysses-train plan --json`: the report of plan_report.h as one JSON object per line, for
// scripts (docs/memory.md, "The planner"). Sizes are bytes per rank, as numbers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/plan/memory_plan.h"
#include "core/plan/plan_search.h"

namespace ulysses {

// A (seq_len, sp) point as print_plan_point reports it, with the ring splits of sp (none for
// sp 1): {"kind": "point", ...}.
nlohmann::json plan_point_json(const PlanPoint& point, const PlanTarget& target,
                               const std::vector<RingSplit>& splits);

// plan --longest for one sp: {"kind": "longest", ...} per option set, or one with "error".
std::vector<nlohmann::json> longest_fits_json(const LongestFits& longest, const PlanTarget& target,
                                              int sp, int64_t granule);

}  // namespace ulysses
