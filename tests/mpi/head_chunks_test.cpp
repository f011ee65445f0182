// Head chunks (UPipe, parallel.head_chunks; docs/memory.md): attention in U stages gives the
// losses and every gradient tensor of U = 1 to 1e-6 (of each tensor's largest value; the
// gradients of the first step, taken on the same weights, so that AdamW does not amplify the
// round-off of a different summation order into the comparison), for
// llama with grouped-query attention and gpt2, with and without layer checkpointing, on the
// sp groups of 2 and 4 ranks and on one rank per sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "parallel/ulysses_attention.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

class HeadChunks : public testing::MpiTest {};

// Per tensor: max |a - b| / max |b|.
std::map<std::string, double> per_tensor_difference(const testing::TrainingOutcome& value,
                                                    const testing::TrainingOutcome& reference) {
  std::map<std::string, double> relative;
  for (const auto& [name, tensor] : testing::gradient_differences(value, reference))
    relative[name] = tensor.max_reference > 0 ? tensor.max_difference / tensor.max_reference
                                              : tensor.max_difference;
  return relative;
}

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
        const testing::TrainingOutcome one = testing::train_for(config, world(), 1);
        const testing::TrainingOutcome one_longer = testing::train_for(config, world(), 3);
        for (int chunks : valid_head_chunks(8, config.model.n_kv_heads, sp)) {
          if (chunks == 1) continue;
          config.parallel.head_chunks = chunks;
          const testing::TrainingOutcome staged = testing::train_for(config, world(), 1);
          const testing::TrainingOutcome staged_longer = testing::train_for(config, world(), 3);
          const std::string where = family + " " + name_of(checkpointing) + " sp " +
                                    std::to_string(sp) + " head_chunks " + std::to_string(chunks);
          for (size_t i = 0; i < one_longer.losses.size(); ++i)
            EXPECT_NEAR(staged_longer.losses[i], one_longer.losses[i],
                        1e-6 * std::abs(one_longer.losses[i]))
                << where << " step " << i + 1;
          for (const auto& [tensor, difference] : per_tensor_difference(staged, one))
            EXPECT_LE(difference, 1e-6) << where << ": " << tensor;
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

}  // namespace
}  // namespace ulysses
