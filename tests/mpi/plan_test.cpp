// The planner against real runs (docs/memory.md, "The planner"): short cpu training runs
// under mpirun over a grid of sp, ZeRO stage, layer checkpointing, head chunks, tiled MLP,
// offload and ring, each compared per category with the plan of the same config. The planner runs
// the trainer's own step on a planning backend; a buffer it missed, or one it charged that the run
// does not allocate, fails here.
//
// One job of W ranks covers sp 1, 2 and 4 wherever sp divides W (ZeRO then shards over the
// whole world, as in a run). Registered for 2 and 4 ranks. Also here: the memory a run
// checks its plan against, the node's split among its ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/config/config.h"
#include "core/jobs/memory_fit.h"
#include "core/plan/memory_plan.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "kernels/planning_backend.h"
#include "parallel/mesh.h"
#include "parallel/sequence_padding.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

struct GridPoint {
  std::string family;
  int sp, zero_stage;
  bool checkpointing;
  int head_chunks;
  std::string tiled_mlp;
  bool offload;
  int ring = 1;  // parallel.ring: K/V blocks in flight, zigzag chunks
};

std::string describe(const GridPoint& p) {
  return p.family + " sp " + std::to_string(p.sp) + ", ZeRO " + std::to_string(p.zero_stage) +
         ", checkpointing " + (p.checkpointing ? "layer" : "none") + ", head_chunks " +
         std::to_string(p.head_chunks) + ", tiled_mlp " + p.tiled_mlp + ", offload " +
         (p.offload ? "true" : "false") + ", ring " + std::to_string(p.ring);
}

// Byte-level text has a target at every token, so the loss tiles are as large in the run as
// the planner charges them (it counts every row; sparse targets make it an upper bound).
Config grid_config(const GridPoint& p) {
  const std::string kv = p.family == "llama" ? ", n_kv_heads: 4, d_ff: 96" : "";
  return parse_config(
      "model: {family: " + p.family + ", n_layers: 2, d_model: 64, n_heads: 8" + kv + "}\n" +
          "train: {steps: 2, batch_size: 1, seq_len: 128, grad_accum: 2, seed: 5}\n" +
          "data: {source: text, path: " + ULYSSES_SOURCE_DIR + "/docs}\n" + "parallel: {sp: " +
          std::to_string(p.sp) + ", zero_stage: " + std::to_string(p.zero_stage) +
          ", head_chunks: " + std::to_string(p.head_chunks) + ", ring: " + std::to_string(p.ring) +
          "}\n" + "memory: {activation_checkpointing: " + (p.checkpointing ? "layer" : "none") +
          ", tiled_mlp: " + p.tiled_mlp +
          ", offload_checkpoints: " + (p.offload ? "true" : "false") + ", loss_tile_tokens: 16}\n",
      {}, "plan_test.yaml");
}

class PlanAgainstRuns : public testing::MpiTest {
 protected:
  // The largest per-category peak of two real steps, each measured from its start as the
  // metrics file's mem_peak_bytes is.
  MemoryStats measured_peaks(const Config& config) {
    auto backend = make_backend(BackendKind::cpu, 0);
    backend->set_num_threads(1);
    Mesh mesh = make_mesh(world(), config.parallel.sp, config.parallel.ring);
    Trainer trainer(config, *backend, mesh);
    MemoryStats largest;
    for (int step = 0; step < 2; ++step) {
      backend->memory().reset_peaks();
      trainer.train_step();
      const MemoryStats& stats = backend->memory().stats();
      for (int i = 0; i < kNumMemCategories; ++i)
        largest.peak[i] = std::max(largest.peak[i], stats.peak[i]);
      largest.total_peak = std::max(largest.total_peak, stats.total_peak);
    }
    return largest;
  }
};

TEST_F(PlanAgainstRuns, PeakOfEveryCategoryWithinFivePercent) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const GridPoint grid[] = {
      {"llama", 1, 0, false, 1, "false", false},    {"llama", 1, 2, false, 1, "auto", false},
      {"llama", 2, 1, true, 1, "false", false},     {"llama", 2, 3, true, 2, "auto", true},
      {"llama", 2, 2, false, 2, "false", false},    {"llama", 4, 0, false, 2, "false", false},
      {"llama", 4, 3, true, 1, "4", false},         {"gpt2", 2, 1, true, 1, "false", false},
      {"llama", 2, 0, false, 1, "false", false, 2}, {"llama", 4, 2, true, 2, "auto", false, 2},
      {"gpt2", 4, 3, false, 1, "false", false, 4},
  };
  int planned = 0;
  for (const GridPoint& point : grid) {
    if (world().size() % point.sp != 0) continue;
    const Config config = grid_config(point);
    const MemoryStats measured = measured_peaks(config);
    const MemoryPlan plan = plan_memory(config, world().size(), 1);
    ++planned;
    for (int i = 0; i < kNumMemCategories; ++i) {
      const double run = double(measured.peak[i]);
      EXPECT_NEAR(double(plan.peak[i]), run, 0.05 * run)
          << describe(point) << ": " << mem_category_name(MemCategory(i)) << " on rank "
          << world().rank();
    }
    EXPECT_NEAR(double(plan.device_peak), double(measured.total_peak),
                0.05 * double(measured.total_peak))
        << describe(point) << ": device total on rank " << world().rank();
  }
  EXPECT_GE(planned, 5);
}

// `ulysses-train eval`'s plan (plan_eval) against the tracked peak of a real model built
// as the eval job builds it and evaluating a batch: the check that refuses an evaluation too
// large for the machine is only as good as this plan. A training step holds more (gradients'
// traffic, backward, the optimizer), so the eval plan is also below the training plan.
TEST_F(PlanAgainstRuns, EvalPeakWithinFivePercentOfARealEvaluation) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const GridPoint grid[] = {
      {"llama", 1, 0, false, 1, "false", false}, {"llama", 2, 3, true, 2, "auto", true},
      {"llama", 2, 1, false, 1, "false", false}, {"llama", 4, 2, true, 1, "4", false},
      {"gpt2", 2, 1, true, 1, "false", false},
  };
  int planned = 0;
  for (const GridPoint& point : grid) {
    if (world().size() % point.sp != 0) continue;
    Config config = grid_config(point);
    config.train.batch_size = 2;
    auto backend = make_backend(BackendKind::cpu, 0);
    backend->set_num_threads(1);
    Mesh mesh = make_mesh(world(), config.parallel.sp, config.parallel.ring);
    const int64_t seq_local = padded_seq_local(config.train.seq_len, mesh.sp_size, mesh.ring_size);
    Model model(config, *backend, *mesh.sp, *mesh.world, config.train.batch_size, seq_local,
                ring_comms(mesh));
    std::unique_ptr<Dataset> data = make_dataset(config.data, Split::val, config.train.seq_len,
                                                 config.model.vocab_size, config.train.seed);
    evaluate_model(model, *data, mesh, config.train.batch_size, config.train.seq_len, 2);
    const double run = double(backend->memory().stats().total_peak);
    const StagePlan plan = plan_eval(config, world().size(), 1);
    ++planned;
    EXPECT_NEAR(double(plan.device_peak), run, 0.05 * run)
        << describe(point) << " on rank " << world().rank();
    EXPECT_EQ(plan.host_peak, backend->memory().stats().peak[int(MemCategory::checkpoints_host)])
        << describe(point) << ": offloaded layer inputs";
    EXPECT_LT(plan.device_peak, plan_memory(config, world().size(), 1).device_peak)
        << describe(point);
  }
  EXPECT_GE(planned, 3);
}

// A backend that computes nothing and reports a fixed amount of available memory, shared by
// the node's ranks (host memory) or not (a GPU's).
class FixedMemoryBackend final : public ComputeFreeBackend {
 public:
  FixedMemoryBackend(int64_t bytes, bool shared_by_node)
      : ComputeFreeBackend(0), bytes_(bytes), shared_by_node_(shared_by_node) {}
  std::string name() const override { return "fixed memory"; }
  BackendKind kind() const override { return BackendKind::cpu; }
  DType compute_dtype() const override { return DType::f32; }
  void set_num_threads(int) override {}
  void* raw_alloc(size_t bytes) override { return ::operator new(bytes == 0 ? 1 : bytes); }
  void raw_free(void* pointer) override { ::operator delete(pointer); }
  void synchronize() override {}
  AvailableMemory available_memory() const override { return {bytes_, shared_by_node_, "fixed"}; }

 private:
  int64_t bytes_;
  bool shared_by_node_;
};

// What a run checks its plan against (docs/memory.md, "Memory the machine has"): host memory
// split among the node's ranks (every rank of these tests is on one node), a GPU's among the
// ranks on it, each with the tracked bytes the backend holds already, which the plan counts.
TEST_F(PlanAgainstRuns, EachRankGetsItsShareOfTheMemoryItDrawsOn) {
  const int64_t available = int64_t(12) << 30;
  const int ranks = world().size();
  const int gpus = std::max(1, cuda_devices_visible());
  const int on_each_gpu = (ranks + gpus - 1) / gpus;
  for (const bool host : {true, false}) {
    SCOPED_TRACE(host ? "host memory" : "a GPU's memory");
    FixedMemoryBackend backend(available, host);
    const Buffer held = backend.alloc(MemCategory::params, DType::f32, {1 << 20}, "held");
    const RankMemory memory = rank_memory(world(), backend);
    const int sharing = host ? ranks : on_each_gpu;
    EXPECT_EQ(memory.sharing_ranks, sharing);
    EXPECT_EQ(memory.bytes, available / sharing + int64_t(held.tensor().bytes()));
    EXPECT_EQ(memory.source, "fixed");
  }
  // The planning and emulated backends know no memory: nothing is checked.
  FixedMemoryBackend unknown(0, true);
  EXPECT_EQ(rank_memory(world(), unknown).bytes, 0);
}

}  // namespace
}  // namespace ulysses
