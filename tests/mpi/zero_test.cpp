// ZeRO stages 1-3 (docs/memory.md, ZeRO) against replicated state over 5 AdamW steps, within
// bounds derived from fp32 arithmetic (tests/mpi/training_bounds.h): the first step's
// gradients and parameters, every loss, the last parameters; for both families, with and
// without layer checkpointing, with one unit per layer and with the default bucket. And the
// per-rank bytes of every stage, which must shrink as 1/world up to one unit of staging or
// gathering.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <utility>

#include "core/config/config.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"
#include "tests/mpi/training_bounds.h"

namespace ulysses {
namespace {

using testing::TrainingOutcome;

class Zero : public testing::MpiTest {};

// A bucket this small puts every layer in a unit of its own.
constexpr double kOneLayerPerUnit = 1e-6;

struct Setup {
  int sp;
  ActivationCheckpointing checkpointing;
  double bucket_mb;
};

constexpr int kSteps = 5;

// Stage 0 without checkpointing: the run every stage and setup is compared with. It depends
// on the family and sp only, so each is trained once per process and kept for the later
// tests (every rank runs the tests in the same order, so every rank trains the same ones).
const TrainingOutcome& replicated_run(const std::string& family, int sp, Comm& world) {
  static std::map<std::pair<std::string, int>, TrainingOutcome> runs;
  auto [entry, added] = runs.try_emplace({family, sp});
  if (added)
    entry->second =
        testing::train_for(testing::tiny_training_config(family, 4, sp, 2), world, kSteps);
  return entry->second;
}

// Stages 2-3 reduce-scatter every micro-batch where stage 0 all-reduces the accumulated
// gradient, so the same sums are taken in another order: the bounds of
// tests/mpi/training_bounds.h, which say why each holds.
void expect_stage_matches(const std::string& family, int stage, const Setup& setup, Comm& world) {
  Config sharded = testing::tiny_training_config(family, 4, setup.sp, 2);
  sharded.memory.activation_checkpointing = setup.checkpointing;
  sharded.parallel.bucket_mb = setup.bucket_mb;
  sharded.parallel.zero_stage = stage;
  const TrainingOutcome& replicated = replicated_run(family, setup.sp, world);
  const TrainingOutcome outcome = testing::train_for(sharded, world, kSteps);
  const std::string where = family + " stage " + std::to_string(stage) + " sp " +
                            std::to_string(setup.sp) + " " + name_of(setup.checkpointing) +
                            " bucket " + std::to_string(setup.bucket_mb);
  testing::expect_same_training(outcome, replicated, sharded,
                                testing::tokens_per_step(sharded, world.size()), where);
}

void expect_every_setup_matches(int stage, Comm& world) {
  using AC = ActivationCheckpointing;
  std::vector<Setup> setups = {{world.size(), AC::none, 25.0},
                               {world.size(), AC::layer, kOneLayerPerUnit},
                               {1, AC::layer, kOneLayerPerUnit}};
  if (world.size() == 4) setups.push_back({2, AC::none, kOneLayerPerUnit});
  for (const char* family : {"llama", "gpt2"})
    for (const Setup& setup : setups) expect_stage_matches(family, stage, setup, world);
}

TEST_F(Zero, Stage1MatchesReplicatedState) {
  expect_every_setup_matches(1, world());
}
TEST_F(Zero, Stage2MatchesReplicatedState) {
  expect_every_setup_matches(2, world());
}
TEST_F(Zero, Stage3MatchesReplicatedState) {
  expect_every_setup_matches(3, world());
}

struct Bytes {
  int64_t params, grads, optimizer;
};

Bytes held_bytes(const MemoryTracker& memory) {
  return {memory.current(MemCategory::params), memory.current(MemCategory::grads),
          memory.current(MemCategory::optimizer)};
}

// Per rank, with f32 compute: N parameters over a world of W, units of at most U elements
// (padded to W blocks). The shard of a unit is ceil(numel / W), so the shard of the whole
// buffer is at most N/W + one element per unit. Stages 2-3 stage and gather one unit per
// slot: two with parallel.prefetch (one in flight while another computes), one without.
TEST_F(Zero, EveryStageHoldsItsShareOfTheState) {
  const int world_size = world().size();
  for (int setup = 0; setup < 8; ++setup) {
    const int stage = setup % 4;
    const bool prefetch = setup < 4;
    const int slots = prefetch ? 2 : 1;
    Config config = testing::tiny_training_config("llama", 4, world_size, 2);
    config.model.n_layers = 6;
    config.parallel.zero_stage = stage;
    config.parallel.bucket_mb = kOneLayerPerUnit;
    config.parallel.prefetch = prefetch;
    auto backend = make_backend(BackendKind::cpu, 0);
    Mesh mesh = make_mesh(world(), config.parallel.sp);
    Trainer trainer(config, *backend, mesh);
    ASSERT_EQ(backend->compute_dtype(), DType::f32);
    const ShardLayout& layout = trainer.model().state().layout();
    const int64_t n = trainer.model().num_params(), units = int64_t(layout.units().size());
    const int64_t unit = layout.max_padded_unit();
    const int64_t shard_max = 4 * (n / world_size + units), shard_min = 4 * (n / world_size);
    const int64_t whole_max = 4 * (n + units * world_size);
    ASSERT_LT(unit, n / 4) << "the test needs units much smaller than the model";
    const std::string where =
        "stage " + std::to_string(stage) + (prefetch ? " with prefetch" : " without prefetch");

    Bytes bytes = held_bytes(backend->memory());
    if (stage == 0) {
      EXPECT_EQ(bytes.params, 4 * n) << where;
      EXPECT_EQ(bytes.grads, 4 * n) << where;
      EXPECT_EQ(bytes.optimizer, 2 * 4 * n) << where;
    } else {
      // Adam's two moments, plus the master weights unless stage 3 gathers from them.
      const int copies = stage == 3 ? 2 : 3;
      EXPECT_GE(bytes.optimizer, copies * shard_min) << where;
      EXPECT_LE(bytes.optimizer, copies * shard_max) << where;
    }
    if (stage == 1) {
      EXPECT_GE(bytes.grads, 4 * n + shard_min) << where;  // whole, and the reduced shard
      EXPECT_LE(bytes.grads, whole_max + shard_max) << where;
    }
    if (stage >= 2) {
      EXPECT_GE(bytes.grads, shard_min) << where;
      EXPECT_LE(bytes.grads, shard_max + slots * 4 * unit) << where;  // a unit per slot staged
      EXPECT_GT(bytes.grads, shard_max + (slots - 1) * 4 * unit) << where;
    }
    if (stage == 1 || stage == 2) {
      EXPECT_GE(bytes.params, 4 * n) << where;
      EXPECT_LE(bytes.params, whole_max) << where;
    }
    if (stage == 3) {
      EXPECT_GE(bytes.params, shard_min) << where;
      EXPECT_LE(bytes.params, shard_max + slots * 4 * unit) << where;  // a unit per slot
      EXPECT_GT(bytes.params, shard_max + (slots - 1) * 4 * unit) << where;
    }

    // A step allocates no more state: the peaks are what was charged up front.
    backend->memory().reset_peaks();
    trainer.train_step();
    EXPECT_EQ(backend->memory().peak(MemCategory::params), bytes.params) << where;
    EXPECT_EQ(backend->memory().peak(MemCategory::grads), bytes.grads) << where;
    EXPECT_EQ(backend->memory().peak(MemCategory::optimizer), bytes.optimizer) << where;
    // Collective staging stays within a unit per slot.
    EXPECT_LE(backend->memory().peak(MemCategory::comm),
              slots * 4 * unit +
                  4 * config.train.batch_size * config.train.seq_len * config.model.d_model)
        << where;
  }
}

// The schedule's overlap, seen in the profiler's spans of one step under ZeRO-3: with
// prefetch, most weight gathers and gradient reductions are in flight while compute runs
// (the gather of unit u+1 is issued before unit u computes; a unit's reduction travels while
// the next unit's backward runs). Without prefetch none is: each is waited for at once.
TEST_F(Zero, PrefetchKeepsGathersAndReductionsInFlightWhileUnitsCompute) {
  for (const bool prefetch : {true, false}) {
    Config config = testing::tiny_training_config("gpt2", 4, world().size(), 2);
    config.model.n_layers = 4;
    config.parallel.zero_stage = 3;
    config.parallel.bucket_mb = kOneLayerPerUnit;
    config.parallel.prefetch = prefetch;
    const std::vector<TraceSpan> spans = testing::traced_step(config, world());
    auto overlapped = [&](const std::string& in_flight) {
      int flights = 0, with_compute = 0;
      for (const TraceSpan& flight : spans) {
        if (flight.name != in_flight) continue;
        ++flights;
        const double end = flight.begin_us + flight.duration_us;
        for (const TraceSpan& work : spans)
          if (work.track == Profiler::kComputeTrack && work.flops > 0 &&
              work.begin_us >= flight.begin_us && work.begin_us + work.duration_us <= end) {
            ++with_compute;
            break;
          }
      }
      return std::pair<int, int>{flights, with_compute};
    };
    const auto [gathers, gathers_overlapped] = overlapped(phase::kWeightGatherInFlight);
    const auto [reductions, reductions_overlapped] = overlapped(phase::kGradientReductionInFlight);
    const std::string where = std::string(prefetch ? "with prefetch" : "without prefetch") + ": " +
                              std::to_string(gathers_overlapped) + " of " +
                              std::to_string(gathers) + " gathers, " +
                              std::to_string(reductions_overlapped) + " of " +
                              std::to_string(reductions) + " reductions overlapped";
    ASSERT_GT(gathers, 10) << where;
    ASSERT_GT(reductions, 10) << where;
    if (prefetch) {
      // Some have only a norm or the embedding (no FLOPs) to hide behind, or nothing: the
      // first gather and the last reduction of a pass. Most hide behind a GEMM.
      EXPECT_GT(2 * gathers_overlapped, gathers) << where;
      EXPECT_GT(2 * reductions_overlapped, reductions) << where;
    } else {
      EXPECT_EQ(gathers_overlapped, 0) << where;
      EXPECT_EQ(reductions_overlapped, 0) << where;
    }
  }
}

// Under sequence parallelism and ZeRO-3: layer checkpointing keeps one block's activations,
// and every extra layer adds one block input of this rank's N/sp tokens.
TEST_F(Zero, LayerCheckpointingAddsOneLayerInputPerLayerUnderStage3) {
  auto peaks = [&](int layers) {
    Config config = testing::tiny_training_config("llama", 4, world().size(), 2);
    config.model.n_layers = layers;
    config.memory.activation_checkpointing = ActivationCheckpointing::layer;
    config.parallel.zero_stage = 3;
    auto backend = make_backend(BackendKind::cpu, 0);
    Mesh mesh = make_mesh(world(), config.parallel.sp);
    Trainer trainer(config, *backend, mesh);
    backend->memory().reset_peaks();
    trainer.train_step();
    const MemoryTracker& memory = backend->memory();
    return std::array<int64_t, 3>{memory.peak(MemCategory::activations),
                                  memory.peak(MemCategory::attention),
                                  memory.peak(MemCategory::checkpoints)};
  };
  Config config = testing::tiny_training_config("llama", 4, world().size(), 2);
  const int64_t block_input_bytes = int64_t(config.train.batch_size) *
                                    (config.train.seq_len / world().size()) * config.model.d_model *
                                    4;
  const auto two = peaks(2), four = peaks(4);
  EXPECT_EQ(four[0], two[0]) << "activations";
  EXPECT_EQ(four[1], two[1]) << "attention";
  EXPECT_EQ(four[2] - two[2], 2 * block_input_bytes) << "checkpoints";
}

}  // namespace
}  // namespace ulysses
