// Options together, as users combine them: seeded draws of the options that change how a step
// is computed (sp, ring, ZeRO stage, bucket size, head chunks, overlap, layer checkpointing,
// tiled MLP, loss tile) over model and data shapes (llama with 1, 2 or 4 kv heads, gpt2, packed
// documents, lengths the sp group pads, a length curriculum that rebuilds the model after step
// 2, gradient accumulation, a clip that bites), each trained for 3 AdamW steps against one rank
// on the same global batch, within the bounds of tests/mpi/training_bounds.h. Each option has
// tests of its own; these find what two of them break together (docs/design.md, "Correctness
// evidence"), and a set the config rules accept must train. Caught so far: ring attention
// skipping a block whose last key starts its queries' document (packed documents at a padded
// length; ring_test.cpp has that case now), and a curriculum stage too short for its packed
// synthetic documents that the config check let through (tests/test_config.cpp has it now).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "parallel/comm.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"
#include "tests/mpi/training_bounds.h"

namespace ulysses {
namespace {

using testing::MpiTest;

// How many option sets each world size trains, and the seed of the draws; the draws are the
// same on every machine (std::mt19937 is specified bit for bit; choose() avoids the library's
// distributions). ULYSSES_OPTION_SETS=N and ULYSSES_OPTION_SETS_SEED=S draw others, to search
// wider than CI does: mpirun -np 4 build/tests/mpi/option_sets_test with both set.
int option_sets() {
  const char* count = std::getenv("ULYSSES_OPTION_SETS");
  return count ? std::stoi(count) : 16;
}
uint32_t option_sets_seed() {
  const char* seed = std::getenv("ULYSSES_OPTION_SETS_SEED");
  return seed ? uint32_t(std::stoul(seed)) : 20261207u;
}

std::string choose(std::mt19937& draw, const std::vector<std::string>& values) {
  return values[draw() % values.size()];
}

struct OptionSet {
  std::vector<std::string> shape;    // model and data: the same for the one-rank reference
  std::vector<std::string> options;  // how the step is computed and split over the world
  std::string text() const {
    std::string joined;
    for (const auto* part : {&shape, &options})
      for (const std::string& item : *part) joined += " --set " + item;
    return joined;
  }
};

OptionSet draw_option_set(std::mt19937& draw, int world_size) {
  OptionSet set;
  const std::string family = choose(draw, {"llama", "gpt2"});
  const std::string kv_heads = family == "gpt2" ? "4" : choose(draw, {"1", "2", "4"});
  const std::string seq_len = choose(draw, {"64", "62", "60"});
  set.shape = {"model.family=" + family,
               "model.n_kv_heads=" + kv_heads,
               "train.seq_len=" + seq_len,
               "train.seq_len_schedule=" + choose(draw, {"", "32@0, " + seq_len + "@2"}),
               "train.grad_accum=" + choose(draw, {"1", "2"}),
               "train.grad_clip=" + choose(draw, {"1", "0.05"}),
               "data.documents=" + choose(draw, {"none", "eos"}),
               "data.documents_per_sequence=" + choose(draw, {"2", "3"})};
  std::vector<std::string> sps;
  for (int sp = 1; sp <= world_size; ++sp)
    if (world_size % sp == 0) sps.push_back(std::to_string(sp));
  set.options = {"parallel.sp=" + choose(draw, sps),
                 "parallel.ring=" + choose(draw, {"1", "2"}),
                 "parallel.zero_stage=" + choose(draw, {"0", "1", "2", "3"}),
                 "parallel.bucket_mb=" + choose(draw, {"25", "0.001"}),
                 "parallel.head_chunks=" + choose(draw, {"1", "2"}),
                 "parallel.overlap=" + choose(draw, {"false", "true"}),
                 "memory.activation_checkpointing=" + choose(draw, {"none", "layer"}),
                 "memory.tiled_mlp=" + choose(draw, {"false", "auto", "2"}),
                 "memory.loss_tile_tokens=" + choose(draw, {"0", "7"})};
  return set;
}

Config config_of(const std::vector<std::string>& overrides, int batch_size) {
  std::vector<std::string> all = overrides;
  all.push_back("train.batch_size=" + std::to_string(batch_size));
  return parse_config(testing::tiny_training_config_yaml(), all, "option-sets.yaml");
}

class OptionSets : public MpiTest {};

TEST_F(OptionSets, SeededDrawsTrainAsOneRankDoes) {
  const int world_size = world().size();
  const int sets = option_sets();
  std::mt19937 draw(option_sets_seed() + uint32_t(world_size));
  auto local = make_local_comm();
  int trained = 0, refused = 0;
  while (trained < sets) {
    const OptionSet set = draw_option_set(draw, world_size);
    std::vector<std::string> all = set.shape;
    all.insert(all.end(), set.options.begin(), set.options.end());
    const int batch_per_rank = 2;
    Config distributed;
    try {
      distributed = config_of(all, batch_per_rank);
      validate_for_world(distributed, world_size);
    } catch (const ConfigError&) {
      ++refused;  // a combination the rules refuse, with a message (tests/test_config.cpp)
      ASSERT_LT(refused, 100 * sets) << "the draws find too few valid option sets";
      continue;
    }
    const int dp = world_size / distributed.parallel.sp;
    const Config single = config_of(set.shape, batch_per_rank * dp);
    const testing::TrainingOutcome reference = testing::train_for(single, *local, 3);
    const testing::TrainingOutcome outcome = testing::train_for(distributed, world(), 3);
    testing::expect_same_training(outcome, reference, distributed,
                                  testing::tokens_per_step(distributed, world_size),
                                  "option set" + set.text());
    ++trained;
  }
}

}  // namespace
}  // namespace ulysses
