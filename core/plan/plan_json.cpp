#include "core/plan/plan_json.h"

#include <string>

#include "core/config/config.h"

namespace ulysses {

namespace {

nlohmann::json by_category(const std::array<int64_t, kNumMemCategories>& bytes) {
  nlohmann::json object = nlohmann::json::object();
  for (int i = 0; i < kNumMemCategories; ++i) object[mem_category_name(MemCategory(i))] = bytes[i];
  return object;
}

nlohmann::json options_json(const Config& config) {
  return {{"zero_stage", config.parallel.zero_stage},
          {"activation_checkpointing", name_of(config.memory.activation_checkpointing)},
          {"head_chunks", config.parallel.head_chunks},
          {"tiled_mlp", tiled_mlp_text(config.memory.tiled_mlp)},
          {"offload_checkpoints", config.memory.offload_checkpoints},
          {"ring", config.parallel.ring}};
}

nlohmann::json option_set_json(const OptionSet& options) {
  return {{"name", options.name}, {"overrides", distinct_overrides(options.overrides)}};
}

// What every line says of its target.
nlohmann::json target_json(const char* kind, const PlanTarget& target, int sp) {
  nlohmann::json line = {{"kind", kind},
                         {"sp", sp},
                         {"world", target.world_size},
                         {"budget_bytes", target.budget_bytes}};
  if (target.world_size % sp == 0) line["dp"] = target.world_size / sp;
  return line;
}

// A plan's categories (persistent and step peak), device total, rank need, bytes sent per step
// and host memory.
nlohmann::json memory_plan_json(const MemoryPlan& plan) {
  return {{"persistent_bytes", by_category(plan.persistent)},
          {"peak_bytes", by_category(plan.peak)},
          {"device_peak_bytes", plan.device_peak},
          {"rank_need_bytes", plan.rank_need},
          {"workspace_bound", plan.workspace_bound},
          {"all_to_all_bytes", plan.all_to_all_bytes},
          {"ring_bytes", plan.ring_bytes},
          {"grad_comm_bytes", plan.grad_comm_bytes},
          {"host_bytes",
           {{"offloaded_checkpoints", plan.host_checkpoints},
            {"weights_io", plan.host_weights_io},
            {"staging", plan.host_staging}}}};
}

}  // namespace

nlohmann::json plan_point_json(const PlanPoint& point, const PlanTarget& target,
                               const std::vector<RingSplit>& splits) {
  nlohmann::json line = target_json("point", target, point.sp);
  line["seq_len"] = point.seq_len;
  if (point.loaded) line["checks"] = divisibility_verdicts(point.config, point.seq_len, point.sp);
  if (!point.verdict.empty()) {
    line["error"] = point.verdict;
    return line;
  }
  line["device"] = name_of(point.config.device);
  line["params"] = point.plan.num_params;
  line["options"] = options_json(point.config);
  line["plan"] = memory_plan_json(point.plan);
  line["fits"] = point.fits;
  if (point.cheapest) {
    nlohmann::json cheapest = option_set_json(*point.cheapest);
    cheapest["rank_need_bytes"] = point.cheapest_plan.rank_need;
    cheapest["all_to_all_bytes"] = point.cheapest_plan.all_to_all_bytes;
    line["cheapest"] = cheapest;
  } else {
    line["cheapest"] = nullptr;
  }
  nlohmann::json rings = nlohmann::json::array();
  for (const RingSplit& split : splits) {
    nlohmann::json ring = {{"ring", split.ring}, {"sp_per_ring", point.sp / split.ring}};
    if (!split.error.empty()) {
      ring["error"] = split.error;
    } else {
      ring["rank_need_bytes"] = split.plan.rank_need;
      ring["all_to_all_bytes"] = split.plan.all_to_all_bytes;
      ring["ring_bytes"] = split.plan.ring_bytes;
      ring["fits"] = split.fits;
    }
    rings.push_back(ring);
  }
  line["ring_splits"] = rings;
  return line;
}

std::vector<nlohmann::json> longest_fits_json(const LongestFits& longest, const PlanTarget& target,
                                              int sp, int64_t granule) {
  nlohmann::json common = target_json("longest", target, sp);
  common["granule_tokens"] = granule * sp;
  if (!longest.verdict.empty()) {
    common["error"] = longest.verdict;
    return {common};
  }
  std::vector<nlohmann::json> lines;
  for (const LongestFit& fit : longest.fits) {
    nlohmann::json line = common;
    line["options"] = option_set_json(fit.options);
    line["longest_seq_len"] = fit.seq_len;
    lines.push_back(line);
  }
  return lines;
}

}  // namespace ulysses
