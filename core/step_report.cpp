#include "core/step_report.h"

#include <algorithm>
#include <cstdio>

#include "kernels/stopwatch.h"

namespace ulysses {

namespace {

// Phases spent waiting on other ranks, computing, and on everything else.
bool is_wait(const std::string& name) {
  return name == phase::kAllToAllWait || name == phase::kWeightGatherWait ||
         name == phase::kGradientReductionWait || name == phase::kScalarAllReduce;
}

bool is_overhead(const std::string& name) {
  return name == phase::kStep || name == phase::kAllToAllCopies || name == phase::kData;
}

double seconds_of(const std::map<std::string, PhaseTotals>& totals, const std::string& name) {
  auto found = totals.find(name);
  return found == totals.end() ? 0.0 : found->second.seconds;
}

std::string percent(double part, double whole) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

std::string rate(double bytes, double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", seconds > 0 ? bytes / seconds / 1e9 : 0.0);
  return text;
}

}  // namespace

const std::vector<std::string>& step_phases() {
  static const std::vector<std::string> phases = {phase::kData,
                                                  phase::kEmbedding,
                                                  phase::kQkvProjection,
                                                  phase::kAllToAllCopies,
                                                  phase::kAllToAllWait,
                                                  phase::kAttentionForward,
                                                  phase::kAttentionBackward,
                                                  phase::kOutputProjection,
                                                  phase::kMlp,
                                                  phase::kLoss,
                                                  phase::kRecompute,
                                                  phase::kWeightGatherWait,
                                                  phase::kGradientReductionWait,
                                                  phase::kScalarAllReduce,
                                                  phase::kOptimizer,
                                                  phase::kStep};
  return phases;
}

nlohmann::json phases_json(const std::map<std::string, PhaseTotals>& totals) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, phase] : totals) {
    nlohmann::json entry = {{"s", phase.seconds}, {"bytes", phase.bytes}};
    if (phase.flops > 0) entry["flops"] = phase.flops;
    object[name == phase::kStep ? "other" : name] = entry;
  }
  return object;
}

Verdict judge(const std::map<std::string, PhaseTotals>& totals, double step_seconds,
              const VerdictContext& context) {
  double waiting = 0.0, overhead = 0.0, computing = 0.0;
  for (const auto& [name, phase] : totals) {
    if (name.find("(in flight)") != std::string::npos) continue;
    if (is_wait(name)) {
      waiting += phase.seconds;
    } else if (is_overhead(name)) {
      overhead += phase.seconds;
    } else {
      computing += phase.seconds;
    }
  }
  const double all_to_all = seconds_of(totals, phase::kAllToAllWait);
  auto in_flight = totals.find(phase::kAllToAllInFlight);
  const double all_to_all_bytes = in_flight == totals.end() ? 0.0 : double(in_flight->second.bytes);
  const double all_to_all_flight = in_flight == totals.end() ? 0.0 : in_flight->second.seconds;

  Verdict verdict;
  const double memory_share =
      context.limit_bytes > 0 ? double(context.peak_bytes) / double(context.limit_bytes) : 0.0;
  if (memory_share >= 0.9) {
    verdict.kind = "memory-bound";
    verdict.line = "peak tracked memory is " +
                   percent(double(context.peak_bytes), double(context.limit_bytes)) +
                   " of memory.limit_gib; a longer sequence or batch will not fit. Try "
                   "memory.activation_checkpointing: layer, parallel.zero_stage: 3, or more sp "
                   "ranks";
    return verdict;
  }
  if (waiting >= 0.4 * step_seconds) {
    verdict.kind = "communication-bound";
    verdict.line = "waiting on other ranks is " + percent(waiting, step_seconds) +
                   " of the step (all-to-all " + percent(all_to_all, step_seconds);
    if (all_to_all_flight > 0) verdict.line += " at " + rate(all_to_all_bytes, all_to_all_flight);
    verdict.line += ", weight gathers " +
                    percent(seconds_of(totals, phase::kWeightGatherWait), step_seconds) +
                    ", gradient reductions " +
                    percent(seconds_of(totals, phase::kGradientReductionWait), step_seconds) + ")";
    if (context.bare_all_to_all_gbps > 0)
      verdict.line += "; a bare all-to-all of " + std::to_string(context.bare_all_to_all_bytes) +
                      " bytes per rank reaches " + rate(context.bare_all_to_all_gbps * 1e9, 1.0) +
                      " here";
    // Far below the bare rate, the wait is for other ranks to arrive, not for the bytes.
    const bool arriving =
        all_to_all_flight > 0 && context.bare_all_to_all_gbps > 0 &&
        all_to_all_bytes / all_to_all_flight < 0.25e9 * context.bare_all_to_all_gbps;
    const bool shared_cores = context.ranks_on_node > context.cores_on_node;
    if (arriving)
      verdict.line += std::string(
                          ", so most of the wait is for the other ranks to reach the "
                          "all-to-all, not for the transfer") +
                      (shared_cores ? " (" + std::to_string(context.ranks_on_node) +
                                          " ranks share " + std::to_string(context.cores_on_node) +
                                          " cores: each waits while the others compute)"
                                    : " (the ranks' work is uneven)");
    verdict.line += shared_cores ? ". Try at most one rank per core (fewer ranks, or more cores)"
                                 : ". Try longer sequences per rank (more compute per byte moved)";
    verdict.line +=
        ", fewer sp ranks per node, or parallel.zero_stage <= 2 when weight gathers "
        "dominate";
    return verdict;
  }
  if (overhead >= 0.4 * step_seconds) {
    verdict.kind = "overhead-bound";
    verdict.line =
        "time outside the named compute phases (norms, RoPE, copies, all-to-all "
        "packing, data) is " +
        percent(overhead, step_seconds) +
        " of the step: the operations are too small to keep the cores busy. Try a "
        "longer sequence or a larger batch per rank";
    return verdict;
  }
  verdict.kind = "compute-bound";
  verdict.line = "compute phases are " + percent(computing, step_seconds) +
                 " of the step (waiting " + percent(waiting, step_seconds) + ", overhead " +
                 percent(overhead, step_seconds) +
                 "). The cores are busy with GEMMs and attention: more threads per rank or a "
                 "faster device is what helps";
  return verdict;
}

void RunProfile::add_step(const std::map<std::string, PhaseTotals>& totals, double step_seconds) {
  for (const auto& [name, phase] : totals) {
    PhaseTotals& sum = totals_[name];
    sum.seconds += phase.seconds;
    sum.bytes += phase.bytes;
    sum.flops += phase.flops;
    sum.count += phase.count;
  }
  seconds_ += step_seconds;
  steps_ += 1;
}

std::string RunProfile::table(Comm& world) const {
  const std::vector<std::string>& phases = step_phases();
  const size_t n = phases.size();
  const double steps = double(std::max<int64_t>(steps_, 1));
  // Per phase: seconds per step; then the step itself.
  std::vector<double> sum(n + 1), max(n + 1), slowest(n + 1);
  for (size_t i = 0; i < n; ++i) sum[i] = seconds_of(totals_, phases[i]) / steps;
  sum[n] = seconds_ / steps;
  max = sum;
  world.all_reduce_host(sum.data(), int(n + 1), ReduceOp::sum);
  world.all_reduce_host(max.data(), int(n + 1), ReduceOp::max);
  for (size_t i = 0; i <= n; ++i)
    slowest[i] = (i < n ? seconds_of(totals_, phases[i]) / steps : seconds_ / steps) == max[i]
                     ? double(world.rank())
                     : -1.0;
  world.all_reduce_host(slowest.data(), int(n + 1), ReduceOp::max);
  if (world.rank() != 0) return "";

  const double ranks = double(world.size()), step = sum[n] / ranks;
  std::string text = "where the step time went (mean over " + std::to_string(world.size()) +
                     " ranks and " + std::to_string(steps_) + " steps):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-26s %10s %7s %12s %8s\n", "phase", "ms/step", "share",
                "max ms/step", "slowest");
  text += line;
  for (size_t i = 0; i < n; ++i) {
    if (max[i] == 0.0) continue;
    const std::string name = phases[i] == phase::kStep ? "other (norms, RoPE, copies)" : phases[i];
    std::snprintf(line, sizeof line, "  %-26s %10.2f %7s %12.2f %8s\n", name.c_str(),
                  1e3 * sum[i] / ranks, percent(sum[i] / ranks, step).c_str(), 1e3 * max[i],
                  ("rank " + std::to_string(int(slowest[i]))).c_str());
    text += line;
  }
  std::snprintf(line, sizeof line, "  %-26s %10.2f %7s %12.2f %8s\n", "step", 1e3 * step, "100%",
                1e3 * max[n], ("rank " + std::to_string(int(slowest[n]))).c_str());
  text += line;
  return text;
}

std::map<std::string, PhaseTotals> RunProfile::mean_over_ranks(Comm& world) const {
  std::vector<std::string> names = step_phases();
  names.push_back(phase::kAllToAllInFlight);
  std::vector<double> values;
  for (const std::string& name : names) {
    auto found = totals_.find(name);
    values.push_back(found == totals_.end() ? 0.0 : found->second.seconds);
    values.push_back(found == totals_.end() ? 0.0 : double(found->second.bytes));
  }
  world.all_reduce_host(values.data(), int(values.size()), ReduceOp::sum);
  std::map<std::string, PhaseTotals> mean;
  for (size_t i = 0; i < names.size(); ++i) {
    if (values[2 * i] == 0.0 && values[2 * i + 1] == 0.0) continue;
    mean[names[i]].seconds = values[2 * i] / world.size();
    mean[names[i]].bytes = int64_t(values[2 * i + 1] / world.size());
  }
  return mean;
}

double measure_all_to_all_gbps(Comm& comm, Backend& backend, int64_t bytes) {
  if (comm.size() == 1) return 0.0;
  const int64_t elements = std::max<int64_t>(comm.size(), bytes / 4 / comm.size() * comm.size());
  Buffer send = backend.alloc(MemCategory::comm, DType::f32, {elements}, "bare all-to-all send");
  Buffer recv = backend.alloc(MemCategory::comm, DType::f32, {elements}, "bare all-to-all recv");
  backend.fill_zero(send);
  comm.all_to_all(send, recv);  // warm-up: connections and buffers
  double best = 0.0;
  for (int repetition = 0; repetition < 3; ++repetition) {
    comm.barrier();
    const Stopwatch clock;
    comm.all_to_all(send, recv);
    double seconds = clock.seconds();
    comm.all_reduce_host(&seconds, 1, ReduceOp::max);  // the slowest rank decides
    const double sent = double(elements) * 4.0 / comm.size() * (comm.size() - 1);
    best = std::max(best, sent / seconds / 1e9);
  }
  return best;
}

}  // namespace ulysses
