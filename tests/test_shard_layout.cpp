// How ZeRO cuts the flat parameter buffer (parallel/shard_layout.h, core/model/params.h): blocks,
// padding, the three spaces, the owned segments, and units derived from the table.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/config/config.h"
#include "core/model/params.h"
#include "parallel/shard_layout.h"

namespace ulysses {
namespace {

TEST(ShardLayout, SplitsEveryUnitIntoPaddedBlocks) {
  // Units of 10, 4 and 1 elements over 4 ranks: blocks of 3, 1 and 1.
  ShardLayout layout({10, 14, 15}, 2, 4);
  ASSERT_EQ(layout.units().size(), 3u);
  EXPECT_EQ(layout.units()[0].block, 3);
  EXPECT_EQ(layout.units()[1].block, 1);
  EXPECT_EQ(layout.units()[2].block, 1);
  EXPECT_EQ(layout.units()[1].padded_begin, 12);
  EXPECT_EQ(layout.units()[2].padded_begin, 16);
  EXPECT_EQ(layout.units()[2].shard_begin, 4);
  EXPECT_EQ(layout.padded_numel(), 20);
  EXPECT_EQ(layout.shard_numel(), 5);
  EXPECT_EQ(layout.max_padded_unit(), 12);
  EXPECT_EQ(layout.unit_of(0), 0);
  EXPECT_EQ(layout.unit_of(9), 0);
  EXPECT_EQ(layout.unit_of(10), 1);
  EXPECT_EQ(layout.unit_of(14), 2);
  EXPECT_THROW(layout.unit_of(15), std::out_of_range);
  EXPECT_THROW(layout.unit_of(-1), std::out_of_range);
}

TEST(ShardLayout, SegmentsCoverTheBufferOnceOverTheRanks) {
  const std::vector<int64_t> ends = {10, 14, 15, 40};
  std::vector<int> owner(40, -1);
  for (int rank = 0; rank < 4; ++rank) {
    ShardLayout layout(ends, rank, 4);
    int64_t shard_used = 0;
    for (const ShardSegment& segment : layout.segments()) {
      EXPECT_LE(segment.shard_begin + segment.size(), layout.shard_numel());
      shard_used += segment.size();
      for (int64_t e = segment.begin; e < segment.end; ++e) {
        EXPECT_EQ(owner[size_t(e)], -1) << "element " << e << " owned twice";
        owner[size_t(e)] = rank;
        // Element e sits in its unit's block of this rank.
        const ShardUnit& unit = layout.units()[size_t(layout.unit_of(e))];
        EXPECT_EQ((e - unit.begin) / unit.block, rank) << "element " << e;
      }
    }
    EXPECT_LE(shard_used, layout.shard_numel());
  }
  for (int e = 0; e < 40; ++e) EXPECT_NE(owner[size_t(e)], -1) << "element " << e << " unowned";
  // Rank 3 owns none of the 1-element unit: segments are never empty.
  ShardLayout last({10, 14, 15, 40}, 3, 4);
  for (const ShardSegment& segment : last.segments()) EXPECT_GT(segment.size(), 0);
}

TEST(ShardLayout, OneRankIsOneSegmentOverEverything) {
  ShardLayout layout({10, 14, 15}, 0, 1);
  EXPECT_EQ(layout.padded_numel(), 15);
  EXPECT_EQ(layout.shard_numel(), 15);
  ASSERT_EQ(layout.segments().size(), 1u);
  EXPECT_EQ(layout.segments()[0].begin, 0);
  EXPECT_EQ(layout.segments()[0].end, 15);
}

TEST(ShardLayout, RejectsBadUnitsAndRanks) {
  EXPECT_THROW(ShardLayout({10, 10}, 0, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout({0}, 0, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout({10}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout({10}, 0, 0), std::invalid_argument);
}

ModelConfig four_layer_llama() {
  return parse_config("model: {family: llama, n_layers: 4, d_model: 32, n_heads: 4, d_ff: 48}\n",
                      {}, "c.yaml")
      .model;
}

TEST(ShardUnits, WholeLayersAreMergedUpToTheBucket) {
  ParamTable table(four_layer_llama());
  const auto [first_begin, first_end] = table.layer_range(0);
  const int64_t layer = first_end - first_begin;
  const int64_t total = table.total_numel();
  const int64_t last_end = table.layer_range(3).second;

  // One element per bucket: globals before, every layer, globals after.
  std::vector<int64_t> one_per_layer = shard_unit_ends(table, 1);
  std::vector<int64_t> expected = {first_begin};
  for (int i = 0; i < 4; ++i) expected.push_back(table.layer_range(i).second);
  expected.push_back(total);
  EXPECT_EQ(one_per_layer, expected);

  // Two layers fit: pairs of layers.
  EXPECT_EQ(shard_unit_ends(table, 2 * layer),
            (std::vector<int64_t>{first_begin, table.layer_range(1).second, last_end, total}));
  // Everything fits: the layers form one unit, the globals stay apart.
  EXPECT_EQ(shard_unit_ends(table, total), (std::vector<int64_t>{first_begin, last_end, total}));
}

}  // namespace
}  // namespace ulysses
