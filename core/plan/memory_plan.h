// The planner's core: one training step of a config, run on the planning backend and
// planning communicators (kernels/planning_backend.h, parallel/planning_comm.h), so every
// byte it reports is charged by the trainer's own allocations, on any machine and for
// either device (docs/memory.md, "The planner").
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/config/seq_len_schedule.h"
#include "kernels/memory.h"

namespace ulysses {

// What a rank's memory must hold at a peak: the device categories' device_peak, and on the cpu
// backend, whose device memory is the host's, the offloaded checkpoints too (docs/memory.md,
// "Memory the machine has").
int64_t rank_need(Device device, int64_t device_peak, int64_t offloaded_checkpoints);

struct MemoryPlan {
  // Per rank, by category: after the trainer is built (persistent buffers), and the peak
  // of a step (what the metrics file reports as mem_peak_bytes).
  std::array<int64_t, kNumMemCategories> persistent{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t device_peak = 0;  // device categories together (what memory.limit_gib caps)
  // What the rank's memory must hold at the peak: device_peak, and on the cpu backend, whose
  // device memory is the host's, the offloaded checkpoints too (docs/memory.md, "Memory the
  // machine has"). What `plan` checks against its budget.
  int64_t rank_need = 0;
  int64_t num_params = 0;
  // ZeRO as the trainer built it (a world of one rank is stage 0): its units of the flat
  // buffer and the parameters of state this rank owns (docs/memory.md, "ZeRO").
  int zero_stage = 0;
  int64_t zero_units = 0, largest_unit = 0, shard_numel = 0;
  // Bytes this rank sends in a step: all-to-all (Ulysses), and gradient/weight collectives.
  int64_t all_to_all_bytes = 0;
  int64_t ring_bytes = 0;  // ring attention's point to point (parallel.ring > 1)
  int64_t grad_comm_bytes = 0;
  // Host memory per rank, untracked by the device budget.
  int64_t host_checkpoints = 0;  // memory.offload_checkpoints (checkpoints_host)
  int64_t host_weights_io = 0;   // weights and moments in and out: one unit at a time, or
                                 // the rank's stored weights at a curriculum stage change
  int64_t host_staging = 0;      // cuda without NCCL: the largest collective staged at once
  bool workspace_bound = false;  // a cuDNN workspace was charged at its documented bound
};

// Plans one step of config on rank 0 of world_size ranks. config must already be valid for
// that world (load_config, validate_for_world). cpu_threads sizes the cpu attention tiles.
MemoryPlan plan_memory(const Config& config, int world_size, int cpu_threads);

// Each stage of train.seq_len_schedule planned as plan_memory plans the last (one entry, the
// run's own shape, without a curriculum): a run builds the later stages' model only at their
// step, so they are checked against memory.limit_gib when it starts.
struct StagePlan {
  SeqLenStage stage;  // batch_size resolved
  int64_t device_peak = 0;
  int64_t rank_need = 0;  // as MemoryPlan::rank_need
  // Host memory the plan keeps apart from the device categories: the offloaded checkpoints
  // (on the cpu backend in the same memory as the rest), and on cuda the weights I/O and the
  // pinned staging too.
  int64_t host_peak = 0;
};
std::vector<StagePlan> plan_stages(const Config& config, int world_size, int cpu_threads);

// `ulysses-train eval` of config on world_size ranks as a stage of its own shape (train.seq_len
// x train.batch_size): the model it builds and one batch's forward and loss (Model::evaluate),
// without the gradients' traffic, the backward and the optimizer's step that a training step
// adds. Its host part is the offloaded layer inputs (memory.offload_checkpoints).
StagePlan plan_eval(const Config& config, int world_size, int cpu_threads);

// `ulysses-train sample` (one rank, parallel.sp 1) over a context of context_len tokens, as
// plan_eval: the model it builds and one forward with a row of logits.
StagePlan plan_sample(const Config& config, int64_t context_len, int cpu_threads);

}  // namespace ulysses
