#include "core/plan/plan_report.h"

#include <cstdio>
#include <string>

#include "core/config/config.h"
#include "core/plan/memory_plan.h"
#include "parallel/mesh.h"

namespace ulysses {

namespace {

std::string row(const std::string& name, const std::string& first, const std::string& second) {
  char text[160];
  std::snprintf(text, sizeof text, "  %-18s %14s %14s\n", name.c_str(), first.c_str(),
                second.c_str());
  return text;
}

std::string options_of(const Config& config) {
  return "ZeRO " + std::to_string(config.parallel.zero_stage) + ", checkpointing " +
         name_of(config.memory.activation_checkpointing) + ", head_chunks " +
         std::to_string(config.parallel.head_chunks) + ", tiled_mlp " +
         tiled_mlp_text(config.memory.tiled_mlp) + ", offload " +
         (config.memory.offload_checkpoints ? "true" : "false");
}

}  // namespace

void print_memory_plan(std::ostream& out, const MemoryPlan& plan) {
  out << row("category", "persistent", "step peak");
  for (int i = 0; i < kNumMemCategories; ++i)
    out << row(mem_category_name(MemCategory(i)), format_bytes(plan.persistent[i]),
               format_bytes(plan.peak[i]));
  out << row("device total", "", format_bytes(plan.device_peak));
  if (plan.workspace_bound)
    out << "  (cuDNN attention workspaces charged at their documented upper bound: they are "
           "known only on a device)\n";
  out << "  sent per step per rank: all-to-all " << format_bytes(plan.all_to_all_bytes);
  if (plan.ring_bytes > 0) out << ", ring p2p " << format_bytes(plan.ring_bytes);
  out << ", gradient and weight collectives " << format_bytes(plan.grad_comm_bytes) << "\n";
  out << "  host per rank: offloaded checkpoints " << format_bytes(plan.host_checkpoints)
      << ", weights I/O " << format_bytes(plan.host_weights_io)
      << " (one ZeRO unit at a time; a curriculum keeps this rank's stored weights)";
  if (plan.host_staging > 0)
    out << ", pinned staging without NCCL up to " << format_bytes(plan.host_staging);
  out << "\n";
}

void print_plan_point(std::ostream& out, const PlanPoint& point, const PlanTarget& target) {
  const int ring =
      point.loaded && point.sp % point.config.parallel.ring == 0 ? point.config.parallel.ring : 1;
  out << "== seq_len " << point.seq_len << ", sp " << point.sp << " (world " << target.world_size
      << " = " << mesh_text(target.world_size, point.sp, ring) << "), budget "
      << format_bytes(target.budget_bytes) << " per rank\n";
  if (!point.loaded) {
    out << "  cannot plan: " << point.verdict << "\n";
    return;
  }
  for (const std::string& line : divisibility_verdicts(point.config, point.seq_len, point.sp))
    out << "  " << line << "\n";
  if (!point.verdict.empty()) {
    out << "  cannot plan: " << point.verdict << "\n";
    return;
  }
  out << "  as configured (" << options_of(point.config) << "), device "
      << name_of(point.config.device) << ", " << point.plan.num_params << " parameters:\n";
  print_memory_plan(out, point.plan);
  const int64_t margin = target.budget_bytes - point.plan.rank_need;
  const std::string offloaded =
      point.plan.rank_need > point.plan.device_peak
          ? " (the device total and " +
                format_bytes(point.plan.rank_need - point.plan.device_peak) +
                " of offloaded layer inputs, the same host memory on the cpu backend)"
          : "";
  out << "  " << (point.fits ? "FITS" : "DOES NOT FIT") << ": peak "
      << format_bytes(point.plan.rank_need) << offloaded << " of "
      << format_bytes(target.budget_bytes)
      << (point.fits ? " (" + format_bytes(margin) + " to spare)"
                     : " (" + format_bytes(-margin) + " over)")
      << "\n";
  if (point.cheapest)
    out << "  cheapest options that fit: " << point.cheapest->name << " (peak "
        << format_bytes(point.cheapest_plan.rank_need) << ", all-to-all "
        << format_bytes(point.cheapest_plan.all_to_all_bytes) << " per step)\n";
  else
    out << "  no option set fits: more sp ranks, a shorter sequence or a larger device\n";
}

void print_ring_splits(std::ostream& out, const PlanTarget& target, int64_t seq_len, int sp) {
  out << "== Ulysses x ring splits of sp " << sp << " at seq_len " << seq_len
      << " (per rank, per step)\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-16s %12s %12s %12s %12s  %s\n", "sp/ring x ring", "peak",
                "all-to-all", "ring p2p", "both", "verdict");
  out << line;
  int64_t fewest = -1;
  std::string fewest_split;
  for (const RingSplit& ring_split : ring_splits(target, seq_len, sp)) {
    const std::string split =
        std::to_string(sp / ring_split.ring) + " x " + std::to_string(ring_split.ring);
    if (!ring_split.error.empty()) {
      out << "  " << split << ": cannot: " << ring_split.error << "\n";
      continue;
    }
    const MemoryPlan& plan = ring_split.plan;
    const int64_t both = plan.all_to_all_bytes + plan.ring_bytes;
    std::snprintf(line, sizeof line, "  %-16s %12s %12s %12s %12s  %s\n", split.c_str(),
                  format_bytes(plan.rank_need).c_str(), format_bytes(plan.all_to_all_bytes).c_str(),
                  format_bytes(plan.ring_bytes).c_str(), format_bytes(both).c_str(),
                  ring_split.fits ? "fits" : "does not fit");
    out << line;
    if (ring_split.fits && (fewest < 0 || both < fewest)) {
      fewest = both;
      fewest_split = split;
    }
  }
  if (fewest >= 0)
    out << "  fewest bytes among those that fit: " << fewest_split << " (" << format_bytes(fewest)
        << " per step)\n";
  else
    out << "  no split fits\n";
}

void print_longest_fits(std::ostream& out, const PlanTarget& target, const std::vector<int>& sps,
                        int64_t granule) {
  out << "== longest seq_len that fits " << format_bytes(target.budget_bytes) << " per rank, world "
      << target.world_size << " (multiples of " << granule << " x sp tokens)\n";
  for (int sp : sps) {
    const LongestFits longest = longest_fits(target, sp, granule);
    if (!longest.verdict.empty()) {
      out << "  sp " << sp << ": cannot plan: " << longest.verdict << "\n";
      continue;
    }
    for (const LongestFit& fit : longest.fits) {
      char line[256];
      std::snprintf(line, sizeof line, "  sp %d  %-70s %12lld tokens  (%.2f s)\n", sp,
                    fit.options.name.c_str(), (long long)fit.seq_len, fit.seconds);
      out << line;
    }
  }
}

}  // namespace ulysses
