#include "core/report/step_report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <utility>

#include "kernels/stopwatch.h"

namespace ulysses {

namespace {

// Phases spent waiting on other ranks, computing, and on everything else.
bool is_wait(const std::string& name) {
  return name == phase::kAllToAllWait || name == phase::kRingWait ||
         name == phase::kWeightGatherWait || name == phase::kGradientReductionWait ||
         name == phase::kScalarAllReduce;
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

// The name a phase has in the metrics, the table and the verdict.
std::string display_name(const std::string& name) {
  return name == phase::kStep ? "other (norms, RoPE, copies)" : name;
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
                                                  phase::kRingWait,
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

nlohmann::json phases_json(const ProfileTotals& totals) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, phase] : totals.phases) {
    nlohmann::json entry = {
        {"s", phase.seconds}, {"host_s", phase.host_seconds}, {"bytes", phase.bytes}};
    if (totals.device_timed) entry["busy_s"] = phase.busy_seconds;
    if (phase.flops > 0) entry["flops"] = phase.flops;
    object[name == phase::kStep ? "other" : name] = entry;
  }
  return object;
}

namespace {

// The launch-bound line's phases: where the host spends the most time beyond what the device
// is busy with, per step.
std::string host_heavy_phases(const std::map<std::string, PhaseTotals>& phases, double steps) {
  std::vector<std::pair<double, std::string>> excess;
  for (const std::string& name : step_phases()) {
    auto found = phases.find(name);
    if (found == phases.end()) continue;
    const double beyond = found->second.host_seconds - found->second.busy_seconds;
    if (beyond > 0) excess.emplace_back(beyond, name);
  }
  std::sort(excess.begin(), excess.end(), std::greater<>());
  std::string text;
  for (size_t i = 0; i < excess.size() && i < 3; ++i) {
    const PhaseTotals& phase = phases.at(excess[i].second);
    char numbers[96];
    std::snprintf(numbers, sizeof numbers, " (host %.2f ms, device busy %.2f ms per step)",
                  1e3 * phase.host_seconds / steps, 1e3 * phase.busy_seconds / steps);
    text += (i > 0 ? ", " : "") + display_name(excess[i].second) + numbers;
  }
  return text;
}

}  // namespace

double waiting_seconds(const ProfileTotals& totals) {
  double waiting = 0.0;
  for (const std::string& name : step_phases())
    if (is_wait(name)) waiting += seconds_of(totals.phases, name);
  return waiting;
}

Verdict judge(const ProfileTotals& totals, double step_seconds, int64_t steps,
              const VerdictContext& context) {
  const std::map<std::string, PhaseTotals>& phases = totals.phases;
  const bool device = totals.device_timed;
  double waiting = 0.0, overhead = 0.0, computing = 0.0;
  std::string largest_compute;
  double largest_compute_seconds = 0.0;
  for (const std::string& name : step_phases()) {
    const double seconds = seconds_of(phases, name);
    if (is_wait(name)) {
      waiting += seconds;
    } else if (is_overhead(name)) {
      overhead += seconds;
    } else {
      computing += seconds;
      if (seconds > largest_compute_seconds) {
        largest_compute_seconds = seconds;
        largest_compute = name;
      }
    }
  }
  const double all_to_all = seconds_of(phases, phase::kAllToAllWait);
  auto in_flight = phases.find(phase::kAllToAllInFlight);
  const double all_to_all_bytes = in_flight == phases.end() ? 0.0 : double(in_flight->second.bytes);
  const double all_to_all_flight = in_flight == phases.end() ? 0.0 : in_flight->second.seconds;
  const double per_step = double(std::max<int64_t>(steps, 1));

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
                    percent(seconds_of(phases, phase::kWeightGatherWait), step_seconds) +
                    ", gradient reductions " +
                    percent(seconds_of(phases, phase::kGradientReductionWait), step_seconds) + ")";
    auto stream = phases.find(phase::kCollectivesStream);
    if (stream != phases.end() && stream->second.seconds > 0) {
      char moved[160];
      std::snprintf(moved, sizeof moved,
                    "; on the device the collectives moved %.1f MB per step in %.2f ms, ",
                    double(stream->second.bytes) / per_step / 1e6,
                    1e3 * stream->second.seconds / per_step);
      verdict.line += moved + rate(double(stream->second.bytes), stream->second.seconds);
    }
    if (context.bare_all_to_all_gbps > 0)
      verdict.line += "; a bare all-to-all of " + std::to_string(context.bare_all_to_all_bytes) +
                      " bytes per rank reaches " + rate(context.bare_all_to_all_gbps * 1e9, 1.0) +
                      " here";
    // Far below the bare rate, the wait is for other ranks to arrive, not for the bytes.
    const bool arriving =
        all_to_all_flight > 0 && context.bare_all_to_all_gbps > 0 &&
        all_to_all_bytes / all_to_all_flight < 0.25e9 * context.bare_all_to_all_gbps;
    // Ranks taking turns on shared cores is a cpu backend's trouble; a device computes apart.
    const bool shared_cores = !device && context.ranks_on_node > context.cores_on_node;
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
  if (device && totals.device_busy_seconds < 0.5 * step_seconds) {
    verdict.kind = "launch-bound";
    const double launches = double(totals.launches) / per_step;
    char numbers[160];
    std::snprintf(numbers, sizeof numbers,
                  " of the step: the host does not enqueue work fast enough (%.0f launches per "
                  "step, %.1f us of the step per launch)",
                  launches, launches > 0 ? 1e6 * step_seconds / per_step / launches : 0.0);
    verdict.line = "the device had work queued for only " +
                   percent(totals.device_busy_seconds, step_seconds) + numbers;
    const std::string heavy = host_heavy_phases(phases, per_step);
    if (!heavy.empty()) verdict.line += ". The host's time most exceeds the device's in " + heavy;
    verdict.line +=
        ". Try a longer sequence or a larger batch per rank (more work per launch), or a "
        "larger model per device";
    return verdict;
  }
  if (overhead >= 0.4 * step_seconds) {
    verdict.kind = "overhead-bound";
    verdict.line =
        "time outside the named compute phases (norms, RoPE, copies, all-to-all "
        "packing, data) is " +
        percent(overhead, step_seconds) + " of the step: the operations are too small to keep " +
        (device ? "the device" : "the cores") +
        " busy. Try a longer sequence or a larger batch per rank";
    return verdict;
  }
  verdict.kind = "compute-bound";
  verdict.line = "compute phases are " + percent(computing, step_seconds) +
                 " of the step (waiting " + percent(waiting, step_seconds) + ", overhead " +
                 percent(overhead, step_seconds);
  if (!device) {
    verdict.line +=
        "). The cores are busy with GEMMs and attention: more threads per rank or a faster "
        "device is what helps";
    return verdict;
  }
  if (!largest_compute.empty())
    verdict.line += "; the largest is " + largest_compute + " at " +
                    percent(largest_compute_seconds, step_seconds);
  const double attention =
      seconds_of(phases, phase::kAttentionForward) + seconds_of(phases, phase::kAttentionBackward);
  if (context.native_attention && attention >= 0.4 * step_seconds) {
    verdict.line += "). Attention is " + percent(attention, step_seconds) +
                    " of the device's step with the native kernels: try kernels.attention: "
                    "cudnn (docs/cuda.md)";
    return verdict;
  }
  verdict.line +=
      "). The device is busy with GEMMs and attention: more sp ranks (a shorter slice each) "
      "or a faster device is what helps";
  return verdict;
}

void RunProfile::add_step(const ProfileTotals& totals, double step_seconds) {
  for (const auto& [name, phase] : totals.phases) {
    PhaseTotals& sum = totals_.phases[name];
    sum.seconds += phase.seconds;
    sum.host_seconds += phase.host_seconds;
    sum.busy_seconds += phase.busy_seconds;
    sum.bytes += phase.bytes;
    sum.flops += phase.flops;
    sum.count += phase.count;
  }
  totals_.device_timed = totals_.device_timed || totals.device_timed;
  totals_.device_busy_seconds += totals.device_busy_seconds;
  totals_.launches += totals.launches;
  seconds_ += step_seconds;
  steps_ += 1;
}

std::string RunProfile::table(Comm& world) const {
  const std::vector<std::string>& phases = step_phases();
  const bool device = totals_.device_timed;
  // The rows: the step phases, the step, then (device-timed) the streams beside the compute.
  std::vector<std::string> rows = phases;
  const size_t step_row = rows.size();
  rows.push_back("");
  rows.push_back(phase::kRingInFlight);  // beside the compute, as the streams below
  if (device) rows.insert(rows.end(), {phase::kCollectivesStream, phase::kTransferStream});
  const size_t n = rows.size();
  const double steps = double(std::max<int64_t>(steps_, 1));
  // Per row: seconds per step, then the host's, then FLOPs per step (the step row: all its
  // phases'); then busy seconds and launches per step.
  const size_t host_at = n, flops_at = 2 * n, busy_at = 3 * n, launches_at = 3 * n + 1;
  std::vector<double> sum(3 * n + 2), max(n), slowest(n);
  for (size_t i = 0; i < n; ++i) {
    auto found = totals_.phases.find(rows[i]);
    const bool ran = found != totals_.phases.end();
    sum[i] = i == step_row ? seconds_ / steps : ran ? found->second.seconds / steps : 0.0;
    sum[host_at + i] = i == step_row ? seconds_ / steps
                       : ran         ? found->second.host_seconds / steps
                                     : 0.0;
    if (i != step_row) sum[flops_at + i] = ran ? found->second.flops / steps : 0.0;
    if (i < step_row) sum[flops_at + step_row] += sum[flops_at + i];
    max[i] = sum[i];
  }
  sum[busy_at] = totals_.device_busy_seconds / steps;
  sum[launches_at] = double(totals_.launches) / steps;
  world.all_reduce_host(max.data(), int(n), ReduceOp::max);
  for (size_t i = 0; i < n; ++i) slowest[i] = sum[i] == max[i] ? double(world.rank()) : -1.0;
  world.all_reduce_host(sum.data(), int(sum.size()), ReduceOp::sum);
  world.all_reduce_host(slowest.data(), int(n), ReduceOp::max);
  if (world.rank() != 0) return "";

  // A phase's rate: its FLOPs over its time, both summed over the ranks (a rank's rate); one
  // unit for the whole column.
  double fastest = 0.0;
  for (size_t i = 0; i <= step_row; ++i)
    if (sum[i] > 0.0) fastest = std::max(fastest, sum[flops_at + i] / sum[i]);
  const bool rates = fastest > 0.0;
  const bool tera = fastest >= 1e12;
  auto rate_text = [&](size_t i) -> std::string {
    if (i > step_row || sum[flops_at + i] == 0.0 || sum[i] == 0.0) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", sum[flops_at + i] / sum[i] / (tera ? 1e12 : 1e9));
    return text;
  };

  const double ranks = double(world.size()), step = sum[step_row] / ranks;
  std::string text = std::string("where the step time went (") + (device ? "device time; " : "") +
                     "mean over " + std::to_string(world.size()) + " ranks and " +
                     std::to_string(steps_) + " steps):\n";
  char line[200];
  auto add_row = [&](const std::string& name, size_t i, const std::string& share) {
    const std::string rank = "rank " + std::to_string(int(slowest[i]));
    int written = std::snprintf(line, sizeof line, "  %-26s %10.2f %7s", name.c_str(),
                                1e3 * sum[i] / ranks, share.c_str());
    if (rates)
      written += std::snprintf(line + written, sizeof line - size_t(written), " %9s",
                               rate_text(i).c_str());
    written += std::snprintf(line + written, sizeof line - size_t(written), " %12.2f %8s",
                             1e3 * max[i], rank.c_str());
    if (device && i <= step_row)
      std::snprintf(line + written, sizeof line - size_t(written), " %12.2f",
                    1e3 * sum[host_at + i] / ranks);
    text += line;
    text += "\n";
  };
  std::snprintf(line, sizeof line, "  %-26s %10s %7s%s %12s %8s%s\n", "phase", "ms/step", "share",
                rates ? (tera ? "   TFLOP/s" : "   GFLOP/s") : "", "max ms/step", "slowest",
                device ? "  host ms/step" : "");
  text += line;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (max[i] == 0.0) continue;
    add_row(display_name(phases[i]), i, percent(sum[i] / ranks, step));
  }
  add_row("step", step_row, "100%");
  for (size_t i = step_row + 1; i < n; ++i) {
    if (max[i] == 0.0) continue;
    add_row(rows[i] + " (beside)", i, percent(sum[i] / ranks, step));
  }
  if (device) {
    std::snprintf(line, sizeof line,
                  "  device busy (work queued) %s of the step; %.0f launches per step\n",
                  percent(sum[busy_at] / ranks, step).c_str(), sum[launches_at] / ranks);
    text += line;
  }
  return text;
}

ProfileTotals RunProfile::mean_over_ranks(Comm& world) const {
  std::vector<std::string> names = step_phases();
  names.insert(names.end(), {phase::kAllToAllInFlight, phase::kRingInFlight,
                             phase::kCollectivesStream, phase::kTransferStream});
  constexpr size_t kValues = 4;  // seconds, host seconds, busy seconds, bytes
  std::vector<double> values;
  for (const std::string& name : names) {
    auto found = totals_.phases.find(name);
    const bool ran = found != totals_.phases.end();
    values.push_back(ran ? found->second.seconds : 0.0);
    values.push_back(ran ? found->second.host_seconds : 0.0);
    values.push_back(ran ? found->second.busy_seconds : 0.0);
    values.push_back(ran ? double(found->second.bytes) : 0.0);
  }
  values.push_back(totals_.device_busy_seconds);
  values.push_back(double(totals_.launches));
  world.all_reduce_host(values.data(), int(values.size()), ReduceOp::sum);
  const double ranks = double(world.size());
  ProfileTotals mean;
  mean.device_timed = totals_.device_timed;
  for (size_t i = 0; i < names.size(); ++i) {
    const double* value = &values[kValues * i];
    if (value[0] == 0.0 && value[1] == 0.0 && value[3] == 0.0) continue;
    PhaseTotals& phase = mean.phases[names[i]];
    phase.seconds = value[0] / ranks;
    phase.host_seconds = value[1] / ranks;
    phase.busy_seconds = value[2] / ranks;
    phase.bytes = int64_t(value[3] / ranks);
  }
  mean.device_busy_seconds = values[kValues * names.size()] / ranks;
  mean.launches = int64_t(values[kValues * names.size() + 1] / ranks);
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
