#include "core/jobs/memory_fit.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/jobs/job_session.h"
#include "kernels/host_memory.h"
#include "parallel/agreement.h"
#include "parallel/mpi_comm.h"

namespace ulysses {

namespace {

// A curriculum stage as the config writes it: "seq_len x batch @ step", e.g. 65536x1@1.
std::string stage_name(const SeqLenStage& stage) {
  return std::to_string(stage.seq_len) + "x" + std::to_string(stage.batch_size) + "@" +
         std::to_string(stage.first_step);
}

// Why a curriculum stage does not fit memory.limit_gib (limit bytes), or "".
std::string limit_problem(const std::vector<StagePlan>& stages, int64_t limit) {
  for (const StagePlan& plan : stages) {
    if (plan.device_peak <= limit) continue;
    return "train.seq_len_schedule: the stage " + stage_name(plan.stage) +
           " (seq_len x batch @ step) would need " + format_bytes(plan.device_peak) +
           " per rank at its step peak, above memory.limit_gib (" + format_bytes(limit) +
           "); planned before the first step (docs/memory.md, \"The planner\"): shorten or "
           "split that stage, lower its batch, or take the memory options `ulysses-train "
           "plan` suggests";
  }
  return "";
}

// "65536 tokens x batch 1 (the train.seq_len_schedule stage 65536x1@100)"
std::string stage_shape(const StagePlan& plan, size_t stages) {
  return std::to_string(plan.stage.seq_len) + " tokens x batch " +
         std::to_string(plan.stage.batch_size) +
         (stages > 1 ? " (the train.seq_len_schedule stage " + stage_name(plan.stage) + ")" : "");
}

// On the cpu backend the offloaded layer inputs are host memory like the rest: " (2.00 GiB of
// it the layer inputs of memory.offload_checkpoints, ...)", or "".
std::string offloaded_share(const StagePlan& plan, const Config& config) {
  if (config.device != Device::cpu || plan.host_peak == 0) return "";
  return " (" + format_bytes(plan.host_peak) +
         " of it the layer inputs of memory.offload_checkpoints, which on the cpu backend stay in "
         "this memory)";
}

// Why a cuda eval's or sample's offloaded layer inputs (plan.host_peak) do not fit the host
// memory beside the GPU, or "".
std::string offloaded_inputs_problem(const std::string& job, const StagePlan& plan,
                                     const RankMemory& host_memory, const Config& config) {
  if (config.device != Device::cuda || host_memory.bytes <= 0) return "";
  if (plan.host_peak <= host_memory.bytes) return "";
  return job + " needs " + format_bytes(plan.host_peak) +
         " of host memory per rank for the layer inputs of memory.offload_checkpoints, more "
         "than " +
         rank_memory_text(host_memory) +
         ": memory.offload_checkpoints: false keeps them on the GPU (docs/memory.md, \"Memory "
         "the machine has\")";
}

// memory.limit_gib replaces the check against the machine's memory (docs/memory.md, "Memory
// the machine has"), as it should where that figure misleads; a run it lets past that memory
// is still told, since on a cpu machine the system may kill it within its first step.
void warn_past_machine(const std::string& problem) {
  if (problem.empty()) return;
  spdlog::warn(
      "memory.limit_gib is set, so this run is held to it and not checked against the "
      "memory the machine has, which it would not fit: {}",
      problem);
}

// Collective: problem_for(memory), the rank's memory unchecked when memory.limit_gib caps the
// tracked memory instead (then past it is a warning on rank 0); every rank throws
// JobError(runtime) when it is not "".
void agree_on_fit(Comm& world, const Config& config, const RankMemory& memory,
                  const std::function<std::string(const RankMemory&)>& problem_for) {
  const bool limited = memory_limit_bytes(config) > 0;
  const std::string problem = problem_for(limited ? RankMemory{} : memory);
  if (problem.empty() && limited && world.rank() == 0) warn_past_machine(problem_for(memory));
  agree_on_failure(world, problem, ExitCode::runtime);
}

}  // namespace

std::string rank_memory_text(const RankMemory& memory) {
  const std::string sharing =
      memory.sharing_ranks > 1
          ? ", split among the " + std::to_string(memory.sharing_ranks) + " ranks that share it"
          : "";
  return "the " + format_bytes(memory.bytes) + " this rank can have (" + memory.source + sharing +
         ")";
}

int64_t planned_step_peak(const std::vector<StagePlan>& stages) {
  int64_t peak = 0;
  for (const StagePlan& stage : stages) peak = std::max(peak, stage.rank_need);
  return peak;
}

RankMemory rank_memory(Comm& world, const Backend& backend) {
  const int ranks_here = std::max(1, ranks_on_this_node(world));
  const Backend::AvailableMemory available = backend.available_memory();
  RankMemory memory;
  memory.source = available.source;
  memory.sharing_ranks = ranks_here;
  if (!available.shared_by_node) {  // asked only here: it starts the CUDA runtime
    const int gpus_here = std::max(1, cuda_devices_visible());
    memory.sharing_ranks = (ranks_here + gpus_here - 1) / gpus_here;
  }
  if (available.bytes > 0)
    memory.bytes = available.bytes / memory.sharing_ranks + backend.memory().stats().total_current;
  return memory;
}

RankMemory host_rank_memory(Comm& world) {
  RankMemory memory;
  memory.sharing_ranks = std::max(1, ranks_on_this_node(world));
  memory.bytes = host_available_bytes() / memory.sharing_ranks;
  memory.source = kHostMemorySource;
  return memory;
}

std::string machine_fit_problem(const std::vector<StagePlan>& stages, const RankMemory& memory,
                                const Config& config, int world_size,
                                const std::string& plan_command) {
  if (memory.bytes <= 0) return "";
  for (const StagePlan& plan : stages) {
    const int64_t need = plan.rank_need;
    if (need <= memory.bytes) continue;
    const std::string shape = stage_shape(plan, stages.size());
    char budget_gib[32];
    std::snprintf(budget_gib, sizeof budget_gib, "%.2f",
                  double(memory.bytes) / (1024.0 * 1024.0 * 1024.0));
    std::string command = plan_command;
    if (plan.stage.batch_size != config.train.batch_size)
      command += " --set train.batch_size=" + std::to_string(plan.stage.batch_size);
    command += " --seq " + std::to_string(plan.stage.seq_len) + " --sp " +
               std::to_string(config.parallel.sp) + " --world " + std::to_string(world_size) +
               " --device-gib " + budget_gib;
    return "the memory plan needs " + format_bytes(need) + " per rank" +
           offloaded_share(plan, config) + " at the step peak of " + shape + ", more than " +
           rank_memory_text(memory) +
           ": the run would run out of memory within its first step at that length. `" + command +
           "` lists the memory options that fit (docs/memory.md, \"The planner\"); with "
           "memory.limit_gib set, the run is checked against that budget instead";
  }
  return "";
}

std::string host_fit_problem(const std::vector<StagePlan>& stages, const RankMemory& host_memory,
                             const Config& config) {
  if (config.device != Device::cuda || host_memory.bytes <= 0) return "";
  for (const StagePlan& plan : stages) {
    if (plan.host_peak <= host_memory.bytes) continue;
    return "the memory plan needs " + format_bytes(plan.host_peak) +
           " of host memory per rank at the step peak of " + stage_shape(plan, stages.size()) +
           " (the layer inputs of memory.offload_checkpoints, the weights passing through the "
           "host and the pinned staging of collectives), more than " +
           rank_memory_text(host_memory) +
           ": the system would kill the run or refuse its pinned memory. More ranks for "
           "parallel.sp divide the layer inputs; memory.offload_checkpoints: false keeps them on "
           "the GPU (docs/memory.md, \"Memory the machine has\")";
  }
  return "";
}

void check_stages_fit(Comm& world, const Config& config, int cpu_threads,
                      const std::string& plan_command, const RankMemory& memory,
                      const RankMemory& host_memory) {
  const int64_t limit = memory_limit_bytes(config);
  const bool check_machine = limit == 0 && memory.bytes > 0;
  const bool check_host = config.device == Device::cuda && host_memory.bytes > 0;
  const bool check_limit = limit > 0 && !config.train.seq_len_schedule.empty();
  const bool warn_machine = limit > 0 && memory.bytes > 0;
  if (!check_machine && !check_host && !check_limit && !warn_machine) return;
  const std::vector<StagePlan> stages = plan_stages(config, world.size(), cpu_threads);
  std::string error;
  if (check_limit && world.rank() == 0) error = limit_problem(stages, limit);
  if (error.empty() && check_machine)
    error = machine_fit_problem(stages, memory, config, world.size(), plan_command);
  if (error.empty()) error = host_fit_problem(stages, host_memory, config);
  if (error.empty() && warn_machine && world.rank() == 0)
    warn_past_machine(machine_fit_problem(stages, memory, config, world.size(), plan_command));
  if (error.empty() && check_machine && world.rank() == 0) {
    const int64_t peak = planned_step_peak(stages);
    spdlog::info("memory: planned step peak {} per rank, {:.1f}% of the {} this rank can have ({})",
                 format_bytes(peak), 100.0 * double(peak) / double(memory.bytes),
                 format_bytes(memory.bytes), memory.source);
  }
  agree_on_failure(world, error, ExitCode::runtime);
}

std::string eval_fit_problem(const Config& config, int world_size, int cpu_threads,
                             const RankMemory& memory, const RankMemory& host_memory) {
  const StagePlan plan = plan_eval(config, world_size, cpu_threads);
  const int64_t need = plan.rank_need;
  if (memory.bytes <= 0 || need <= memory.bytes)
    return offloaded_inputs_problem("evaluating", plan, host_memory, config);
  const TrainConfig& train = config.train;
  std::string problem =
      "evaluating needs " + format_bytes(need) + " per rank" + offloaded_share(plan, config) +
      " at the peak of a batch of " + std::to_string(train.batch_size) + " sequences of " +
      std::to_string(train.seq_len) + " tokens (train.batch_size, train.seq_len), more than " +
      rank_memory_text(memory) + ": the evaluation would run out of memory in its first batch. ";
  // Batches of a divisor of train.batch_size, eval_steps scaled up, read the same sequences
  // (core/train/evaluate.h): the largest that fits is the advice.
  Config smaller = config;
  for (int batch = train.batch_size - 1; batch >= 1; --batch) {
    if (train.batch_size % batch != 0) continue;
    smaller.train.batch_size = batch;
    smaller.train.eval_steps = train.eval_steps * (train.batch_size / batch);
    const int64_t smaller_need = plan_eval(smaller, world_size, cpu_threads).rank_need;
    if (smaller_need > memory.bytes) continue;
    return problem + "--set train.batch_size=" + std::to_string(batch) +
           " --set train.eval_steps=" + std::to_string(smaller.train.eval_steps) +
           " reads the same sequences in batches that fit (" + format_bytes(smaller_need) +
           " planned; docs/evaluation.md)";
  }
  return problem +
         "Even one sequence at a time does not fit: more ranks for parallel.sp split each "
         "sequence, and memory.activation_checkpointing: layer keeps one layer's activations "
         "(docs/memory.md, \"The planner\")";
}

void check_eval_fits(Comm& world, const Config& config, int cpu_threads, const RankMemory& memory,
                     const RankMemory& host_memory) {
  agree_on_fit(world, config, memory, [&](const RankMemory& checked) {
    return eval_fit_problem(config, world.size(), cpu_threads, checked, host_memory);
  });
}

std::string sample_fit_problem(const Config& config, int64_t context_len,
                               const std::string& context, int cpu_threads,
                               const RankMemory& memory, const RankMemory& host_memory) {
  const StagePlan plan = plan_sample(config, context_len, cpu_threads);
  const int64_t need = plan.rank_need;
  if (memory.bytes <= 0 || need <= memory.bytes)
    return offloaded_inputs_problem("sampling", plan, host_memory, config);
  return "sampling needs " + format_bytes(need) + offloaded_share(plan, config) +
         " at the peak of a forward over " + std::to_string(context_len) + " tokens (" + context +
         "), more than " + rank_memory_text(memory) +
         ": it would run out of memory in its first forward. A shorter context needs less, and "
         "memory.activation_checkpointing: layer keeps one layer's activations (docs/memory.md, "
         "\"The planner\")";
}

void check_sample_fits(Comm& world, const Config& config, int64_t context_len,
                       const std::string& context, int cpu_threads, const RankMemory& memory,
                       const RankMemory& host_memory) {
  agree_on_fit(world, config, memory, [&](const RankMemory& checked) {
    return sample_fit_problem(config, context_len, context, cpu_threads, checked, host_memory);
  });
}

}  // namespace ulysses
