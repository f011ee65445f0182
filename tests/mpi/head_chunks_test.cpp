// Head chunks (UPipe, parallel.head_chunks; docs/memory.md): attention in U stages trains as
// with U = 1 within the bounds of tests/mpi/training_bounds.h (the first step's gradients and
// parameters, every loss, the last parameters), for llama with grouped-query attention and
// gpt2, with and without layer checkpointing, on the sp groups of 2 and 4 ranks and on one
// rank per sequence.
#include <gtest/gtest.h>

#include <string>

#include "parallel/ulysses_attention.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"
#include "tests/mpi/training_bounds.h"

namespace ulysses {
namespace {

class HeadChunks : public testing::MpiTest {};

TEST_F(HeadChunks, EveryStageCountGivesTheLossesAndGradientsOfOneStage) {
  int compared = 0;
  for (const std::string family : {"llama", "gpt2"}) {
    for (const ActivationCheckpointing checkpointing :
         {ActivationCheckpointing::none, ActivationCheckpointing::layer}) {
      for (int sp : {world().size(), 1}) {
        Config config = testing::tiny_training_config(family, 2, sp, 2);
        config.model.n_heads = 8;  // head dim 4
        config.model.n_kv_heads = family == "llama" ? 2 : 8;
        config.memory.activation_checkpointing = checkpointing;
        const testing::TrainingOutcome one = testing::train_for(config, world(), 3);
        for (int chunks : valid_head_chunks(8, config.model.n_kv_heads, sp)) {
          if (chunks == 1) continue;
          config.parallel.head_chunks = chunks;
          const testing::TrainingOutcome staged = testing::train_for(config, world(), 3);
          testing::expect_same_training(
              staged, one, config, testing::tokens_per_step(config, world().size()),
              family + " " + name_of(checkpointing) + " sp " + std::to_string(sp) +
                  " head_chunks " + std::to_string(chunks));
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(compared, 8);
}

TEST_F(HeadChunks, ValidStageCountsRespectKvGroups) {
  // 24 heads, 4 kv heads (groups of 6), sp 2: 12 heads per rank; stages of 4 would split a
  // group across stages unevenly.
  EXPECT_EQ(valid_head_chunks(24, 4, 2), (std::vector<int>{1, 2, 4, 6, 12}));
  EXPECT_EQ(valid_head_chunks(8, 8, 4), (std::vector<int>{1, 2}));
  EXPECT_EQ(valid_head_chunks(32, 8, 4), (std::vector<int>{1, 2, 4, 8}));
}

TEST_F(HeadChunks, HeadsFitAUlyssesDegreeThatSplitsOrReplicatesTheKvHeads) {
  EXPECT_TRUE(heads_fit_ulysses(32, 8, 4));   // kv heads split, 2 per rank
  EXPECT_TRUE(heads_fit_ulysses(32, 8, 16));  // kv heads replicated, 2 ranks each
  EXPECT_FALSE(heads_fit_ulysses(32, 8, 3));  // 3 does not divide the q heads
  EXPECT_FALSE(heads_fit_ulysses(24, 8, 6));  // neither 8 % 6 nor 6 % 8
  EXPECT_TRUE(heads_fit_ulysses(24, 8, 1));
  EXPECT_FALSE(heads_fit_ulysses(8, 8, 0));
}

}  // namespace
}  // namespace ulysses
