#include "core/plan/memory_plan.h"

#include <algorithm>

#include "core/train/trainer.h"
#include "kernels/planning_backend.h"
#include "parallel/planning_comm.h"
#include "parallel/sequence_padding.h"

namespace ulysses {

namespace {

// The planning backend of config's device. A job resolves kernels.attention: auto before it
// plans (core/jobs/job_session.cpp); the plan command resolves it here, for this machine's
// cuDNN.
PlanningBackend planning_backend(const Config& config, int cpu_threads) {
  const AttentionKernel attention =
      choose_attention(config.kernels.attention, config.device,
                       config.model.d_model / config.model.n_heads, cudnn_loaded_version(),
                       attention_has_documents(config))
          .kernel;
  return PlanningBackend(config.device, attention, cpu_threads);
}

// The model `eval` or `sample` builds for micro-batches of batch_size sequences of seq_len
// tokens (split over parallel.sp), and one forward of them with the loss, or with the logits
// of one row as a sampler reads them.
StagePlan plan_forward(const Config& config, int world_size, int cpu_threads, int64_t batch_size,
                       int64_t seq_len, bool logits) {
  PlanningBackend backend = planning_backend(config, cpu_threads);
  PlanningMesh planned = make_planning_mesh(world_size, config.parallel.sp, config.parallel.ring);
  const Mesh& mesh = planned.mesh;
  MicroBatch batch;  // shapes only, as in a planned step
  batch.batch = batch_size;
  batch.seq_local = padded_seq_local(seq_len, mesh.sp_size, mesh.ring_size);
  batch.pos_offset = int64_t(mesh.sp_rank) * batch.seq_local;
  Model model(config, backend, *mesh.sp, *mesh.world, batch.batch, batch.seq_local,
              ring_comms(mesh));
  if (logits)
    model.logits(batch, {0});
  else
    model.evaluate(batch);
  const MemoryStats& stats = backend.memory().stats();
  const int64_t offloaded = stats.peak[int(MemCategory::checkpoints_host)];
  return {{seq_len, 0, batch_size},
          stats.total_peak,
          rank_need(config.device, stats.total_peak, offloaded),
          offloaded};
}

}  // namespace

int64_t rank_need(Device device, int64_t device_peak, int64_t offloaded_checkpoints) {
  return device_peak + (device == Device::cpu ? offloaded_checkpoints : 0);
}

MemoryPlan plan_memory(const Config& config, int world_size, int cpu_threads) {
  PlanningBackend backend = planning_backend(config, cpu_threads);
  PlanningMesh planned = make_planning_mesh(world_size, config.parallel.sp, config.parallel.ring);
  Trainer trainer(config, backend, planned.mesh);
  MemoryPlan plan;
  plan.persistent = backend.memory().stats().current;
  std::vector<const Comm*> comms = {planned.mesh.world, planned.mesh.sp.get(),
                                    planned.mesh.dp.get()};
  if (planned.mesh.ring)
    comms.insert(comms.end(), {planned.mesh.ulysses.get(), planned.mesh.ring.get()});
  const CommStats before = sum_stats(comms);
  trainer.plan_step();
  const CommStats after = sum_stats(comms);
  const MemoryStats& stats = backend.memory().stats();
  plan.peak = stats.peak;
  plan.device_peak = stats.total_peak;
  plan.rank_need =
      rank_need(config.device, plan.device_peak, stats.peak[int(MemCategory::checkpoints_host)]);
  plan.num_params = trainer.model().num_params();
  const ZeroState& state = trainer.model().state();
  plan.zero_stage = state.stage();
  plan.zero_units = int64_t(state.layout().units().size());
  for (const ShardUnit& unit : state.layout().units())
    plan.largest_unit = std::max(plan.largest_unit, unit.numel());
  plan.shard_numel = state.layout().shard_numel();
  plan.all_to_all_bytes = after.all_to_all_bytes - before.all_to_all_bytes;
  plan.ring_bytes = after.p2p_bytes - before.p2p_bytes;
  plan.grad_comm_bytes =
      after.reduce_bytes + after.gather_bytes - before.reduce_bytes - before.gather_bytes;
  plan.host_checkpoints = stats.peak[int(MemCategory::checkpoints_host)];
  // Initialising, loading and saving the weights and moments move one ZeRO unit at a time
  // through the host; a curriculum's stage change keeps the weights this rank stores there
  // (docs/memory.md, "Host memory per rank").
  plan.host_weights_io = state.host_piece() * int64_t(sizeof(float));
  if (!config.train.seq_len_schedule.empty())
    plan.host_weights_io =
        std::max(plan.host_weights_io, state.layout().shard_numel() * int64_t(sizeof(float)));
  if (config.device == Device::cuda)
    for (const Comm* comm : comms)
      plan.host_staging =
          std::max(plan.host_staging, static_cast<const PlanningComm*>(comm)->largest_call_bytes());
  plan.workspace_bound = backend.used_workspace_bound();
  return plan;
}

std::vector<StagePlan> plan_stages(const Config& config, int world_size, int cpu_threads) {
  std::vector<SeqLenStage> stages = parse_seq_len_schedule(config.train.seq_len_schedule);
  if (stages.empty()) stages.push_back({config.train.seq_len, 0, 0});
  std::vector<StagePlan> plans;
  for (SeqLenStage stage : stages) {
    if (stage.batch_size == 0) stage.batch_size = config.train.batch_size;
    Config shape = config;  // the stage as a run of its own
    shape.train.seq_len_schedule.clear();
    shape.train.seq_len = int(stage.seq_len);
    shape.train.batch_size = int(stage.batch_size);
    const MemoryPlan plan = plan_memory(shape, world_size, cpu_threads);
    // On the cpu backend the weights I/O fills the master weights in place (docs/memory.md,
    // "Host memory per rank"): only the offloaded checkpoints are apart.
    const int64_t host_peak =
        plan.host_checkpoints +
        (config.device == Device::cuda ? plan.host_weights_io + plan.host_staging : 0);
    plans.push_back({stage, plan.device_peak, plan.rank_need, host_peak});
  }
  return plans;
}

StagePlan plan_eval(const Config& config, int world_size, int cpu_threads) {
  return plan_forward(config, world_size, cpu_threads, config.train.batch_size,
                      config.train.seq_len, false);
}

StagePlan plan_sample(const Config& config, int64_t context_len, int cpu_threads) {
  return plan_forward(config, 1, cpu_threads, 1, context_len, true);
}

}  // namespace ulysses
