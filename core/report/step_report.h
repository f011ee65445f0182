// What the phases of the steps say about a run (docs/profiling.md): each step's phases for
// the metrics file, the end-of-run table over the ranks (share of the step, max over ranks,
// slowest rank; on a device, its busy share and launches) and a one-line verdict on what
// bounds the run, with the numbers behind it and what to try.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"

namespace ulysses {

// Every phase of a step, in table order (kernels/profiler.h). The in-flight spans of
// collectives overlap these and are not among them.
const std::vector<std::string>& step_phases();

// {"qkv projection": {"s": seconds, "host_s": host seconds, "bytes": bytes, "flops": flops},
// ...} for the phases that ran; s is device time where the totals are device-timed, which
// also gives each phase "busy_s".
nlohmann::json phases_json(const ProfileTotals& totals);

// Seconds of the step phases spent waiting on other ranks (all-to-all, ring, weight gather and
// gradient reduction waits, the scalar all-reduce): what communication cost the step. The
// collectives' in-flight time (CommStats) can pass the step's, since they overlap compute and
// each other.
double waiting_seconds(const ProfileTotals& totals);

// What the verdict needs besides the phases.
struct VerdictContext {
  double bare_all_to_all_gbps = 0.0;  // measured at start-up on the sp group; 0 when sp = 1
  int64_t bare_all_to_all_bytes = 0;  // the message size it was measured with
  int64_t peak_bytes = 0;             // tracked, this rank
  int64_t limit_bytes = 0;            // memory.limit_gib; 0 = none
  int sp = 1;
  int ranks_on_node = 1;  // ranks sharing this rank's node
  int cores_on_node = 1;
  bool native_attention = false;  // kernels.attention: native (what a device run may change)
};

struct Verdict {
  // communication-bound | launch-bound | compute-bound | memory-bound | overhead-bound
  std::string kind;
  std::string line;  // the numbers behind it and what to try
};

// The kind and its line from one rank's totals over `steps` steps (time per phase, the
// in-flight collectives and, on a device, its busy time and launches), the steps' wall time,
// and the context. Device-timed totals get advice for the device.
Verdict judge(const ProfileTotals& totals, double step_seconds, int64_t steps,
              const VerdictContext& context);

// Sums the phases of the steps of a run on this rank.
class RunProfile {
 public:
  void add_step(const ProfileTotals& totals, double step_seconds);
  const ProfileTotals& totals() const { return totals_; }
  double seconds() const { return seconds_; }
  int64_t steps() const { return steps_; }

  // Collective over world: the end-of-run table (rank 0; "" elsewhere): per phase the mean
  // seconds per step over the ranks, its share of the step and, where it carries FLOPs, its
  // rate (docs/profiling.md), the max over ranks and the slowest rank; device-timed, also the
  // host's seconds, the device streams beside the compute one, the device's busy share and its
  // launches per step.
  std::string table(Comm& world) const;
  // Collective: the totals of the step phases, the all-to-alls in flight and the device
  // streams, averaged over the ranks (what the verdict judges).
  ProfileTotals mean_over_ranks(Comm& world) const;

 private:
  ProfileTotals totals_;
  double seconds_ = 0.0;
  int64_t steps_ = 0;
};

// Collective over comm: the bandwidth of a bare all-to-all of `bytes` per rank (this rank's
// send buffer), best of a few repetitions, in GB/s counted like CommStats (bytes sent to
// other ranks per second). 0 for a one-rank comm.
double measure_all_to_all_gbps(Comm& comm, Backend& backend, int64_t bytes);

}  // namespace ulysses
