// Async Ulysses (parallel.overlap; docs/performance.md): the all-to-alls are started as soon as
// their inputs exist and waited for where their outputs are needed. The results are the same
// bits as without overlap (losses, gradient norms and weights after 5 steps, with and without
// head chunks and layer checkpointing), and a traced step shows the overlap: with it, all-to-alls
// are in flight while projections compute; without it, none is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

class Overlap : public testing::MpiTest {};

Config overlap_config(const std::string& family, int sp) {
  Config config = testing::tiny_training_config(family, 4, sp, 2);
  config.model.n_heads = 8;
  config.model.n_kv_heads = family == "llama" ? 2 : 8;
  return config;
}

TEST_F(Overlap, GivesTheSameBitsAsWaitingForEachAllToAll) {
  const int sp = world().size();
  for (const std::string family : {"llama", "gpt2"}) {
    for (int chunks : {1, 2}) {
      for (const ActivationCheckpointing checkpointing :
           {ActivationCheckpointing::none, ActivationCheckpointing::layer}) {
        Config config = overlap_config(family, sp);
        config.parallel.head_chunks = chunks;
        config.memory.activation_checkpointing = checkpointing;
        const testing::TrainingOutcome waiting = testing::train_for(config, world(), 5);
        config.parallel.overlap = true;
        const testing::TrainingOutcome overlapping = testing::train_for(config, world(), 5);
        const std::string where =
            family + " head_chunks " + std::to_string(chunks) + " " + name_of(checkpointing);
        EXPECT_EQ(overlapping.losses, waiting.losses) << where;
        EXPECT_EQ(overlapping.grad_norms, waiting.grad_norms) << where;
        EXPECT_TRUE(overlapping.params == waiting.params) << where << ": weights differ";
      }
    }
  }
}

// How many all-to-all flights of one traced step have a projection GEMM (or, with
// any_compute, any span that computes) inside them.
int flights_over_projections(const Config& config, Comm& world, bool any_compute = false) {
  const std::vector<TraceSpan> spans = testing::traced_step(config, world);
  int covering = 0;
  for (const TraceSpan& flight : spans) {
    if (flight.name != phase::kAllToAllInFlight) continue;
    const double end = flight.begin_us + flight.duration_us;
    for (const TraceSpan& work : spans)
      if ((work.name == phase::kQkvProjection || work.name == phase::kOutputProjection ||
           (any_compute && work.flops > 0)) &&
          work.begin_us >= flight.begin_us && work.begin_us + work.duration_us <= end) {
        ++covering;
        break;
      }
  }
  return covering;
}

TEST_F(Overlap, AllToAllsTravelWhileProjectionsCompute) {
  Config config = overlap_config("llama", world().size());
  EXPECT_EQ(flights_over_projections(config, world()), 0)
      << "without overlap every all-to-all is waited for where it is issued";
  config.parallel.overlap = true;
  // Per layer and micro-batch at least q's flight (over k's and v's projections) forward and
  // dO's (over the output projection's weight gradient) backward.
  EXPECT_GE(flights_over_projections(config, world()),
            2 * config.model.n_layers * config.train.grad_accum);
}

// Head stages already project k while q travels; with overlap the next stage's exchanges also
// fly over this stage's attention, and this stage's output over the next one's.
TEST_F(Overlap, WithHeadStagesMoreExchangesFlyOverCompute) {
  Config config = overlap_config("llama", world().size());
  config.parallel.head_chunks = 2;
  const int waiting = flights_over_projections(config, world(), true);
  config.parallel.overlap = true;
  EXPECT_GT(flights_over_projections(config, world(), true), waiting);
}

}  // namespace
}  // namespace ulysses
