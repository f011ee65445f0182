// A job's memory plan checked against the memory a rank can have, before the model is built
// (docs/memory.md, "Memory the machine has"): a training run's every curriculum stage (against
// memory.limit_gib when set), `eval`'s batch and `sample`'s context. Past that memory a cpu run
// was killed by the system partway through a step, with no message, however long it took to
// get there; a cuda run failed its allocation there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/plan/memory_plan.h"
#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

// The memory a rank can have: what the backend reports as available, divided among the ranks
// that share it (docs/memory.md, "Memory the machine has").
struct RankMemory {
  int64_t bytes = 0;  // 0: not known, nothing is checked
  std::string source;
  int sharing_ranks = 1;
};

// "the 22.91 GiB this rank can have (host memory: ..., split among the 2 ranks that share it)"
std::string rank_memory_text(const RankMemory& memory);

// The largest planned step peak (rank_need) of the stages.
int64_t planned_step_peak(const std::vector<StagePlan>& stages);

// Collective: memory for this rank on its node (ranks_on_this_node shares host memory among
// all of them, a GPU's among the ranks on it), with the tracked bytes the backend holds
// already, which the plan counts too.
RankMemory rank_memory(Comm& world, const Backend& backend);

// Collective: the host memory a rank of a cuda run can have beside its GPU's, the host's
// available memory divided among the ranks on its node.
RankMemory host_rank_memory(Comm& world);

// Why the stages of config on world_size ranks do not fit the rank's memory, or "" when every
// planned step peak (rank_need) does. plan_command ("ulysses-train plan --config FILE" with
// the job's --set overrides) starts the command the message suggests.
std::string machine_fit_problem(const std::vector<StagePlan>& stages, const RankMemory& memory,
                                const Config& config, int world_size,
                                const std::string& plan_command);

// Why the stages of a cuda run do not fit the host memory beside the GPU (each stage's
// host_peak: offloaded checkpoints, weights I/O, pinned staging), or "" when they do, when
// host memory is not known, or on the cpu backend (whose one memory machine_fit_problem checks).
std::string host_fit_problem(const std::vector<StagePlan>& stages, const RankMemory& host_memory,
                             const Config& config);

// Collective: every stage's planned step peak (core/plan/memory_plan.h, cpu_threads as the
// run's backend has them) fits, else every rank throws JobError(runtime) before the model is
// built. With memory.limit_gib, a curriculum's stages are checked against it: the status of
// an allocation past the limit, reached before the first step instead of at the stage change.
// Without it, every stage is checked against memory (0: not known, nothing checked), and a
// run that fits logs its peak; with it, a stage past memory is a warning. A cuda run's stages are
// also checked against host_memory, whatever the limit (it caps the device only). plan_command
// starts the command the message suggests.
void check_stages_fit(Comm& world, const Config& config, int cpu_threads,
                      const std::string& plan_command, const RankMemory& memory,
                      const RankMemory& host_memory);

// Why `ulysses-train eval` of config on world_size ranks does not fit the rank's memory (its
// plan_eval's rank_need; not checked when memory.bytes is 0), or, on
// cuda, why its offloaded layer inputs do not fit host_memory; "" when it fits. The message
// names the largest batch that reads the same sequences and fits, where one does.
std::string eval_fit_problem(const Config& config, int world_size, int cpu_threads,
                             const RankMemory& memory, const RankMemory& host_memory);

// Collective: eval_fit_problem, the rank's memory unchecked when memory.limit_gib caps the
// tracked memory instead (past it is then a warning); every rank throws JobError(runtime)
// with it before the model is built.
void check_eval_fits(Comm& world, const Config& config, int cpu_threads, const RankMemory& memory,
                     const RankMemory& host_memory);

// Why `ulysses-train sample` over a context of context_len tokens (described by `context`,
// e.g. "the prompt's 12 tokens and --max-new-tokens 64") does not fit, as eval_fit_problem
// (its plan: plan_sample), or "".
std::string sample_fit_problem(const Config& config, int64_t context_len,
                               const std::string& context, int cpu_threads,
                               const RankMemory& memory, const RankMemory& host_memory);

// Collective: sample_fit_problem, as check_eval_fits.
void check_sample_fits(Comm& world, const Config& config, int64_t context_len,
                       const std::string& context, int cpu_threads, const RankMemory& memory,
                       const RankMemory& host_memory);

}  // namespace ulysses
