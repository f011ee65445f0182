// How ZeRO cuts a flat buffer over the ranks of a world (docs/memory.md, ZeRO). The buffer is a
// sequence of units, contiguous ranges of elements (a layer, a group of layers, the
// embedding); each unit is split into `world` equal blocks, the last one padded with zeros,
// and rank r owns block r of every unit. A unit is the grain of every ZeRO collective: one
// reduce-scatter of its gradient, one all-gather of its weights. Three spaces follow:
//   flat    the buffer itself, elements [0, total)
//   padded  every unit takes world·block elements (a whole buffer that ZeRO collectives
//           read or write in place)
//   shard   this rank's blocks one after the other (what the rank keeps: master weights,
//           reduced gradients, optimizer moments)
// With world = 1 the three spaces are the same.
#pragma once

#include <cstdint>
#include <vector>

namespace ulysses {

struct ShardUnit {
  int64_t begin = 0;  // flat [begin, end)
  int64_t end = 0;
  int64_t block = 0;         // elements per rank, ceil((end - begin) / world)
  int64_t padded_begin = 0;  // where the unit starts in padded space
  int64_t shard_begin = 0;   // where every rank's block of it starts in shard space
  int64_t numel() const { return end - begin; }
};

// Flat elements [begin, end) that this rank owns, at shard_begin in its shard.
struct ShardSegment {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shard_begin = 0;
  int64_t size() const { return end - begin; }
};

class ShardLayout {
 public:
  // unit_ends: the end of every unit, strictly increasing; the last one is the total.
  // Throws std::invalid_argument otherwise.
  ShardLayout(const std::vector<int64_t>& unit_ends, int rank, int world);

  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t total() const { return units_.empty() ? 0 : units_.back().end; }
  const std::vector<ShardUnit>& units() const { return units_; }
  // The unit holding a flat element.
  int unit_of(int64_t element) const;

  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  // world·block of the largest unit: the size of one unit's padded buffer.
  int64_t max_padded_unit() const { return max_padded_unit_; }

  // What this rank owns, in flat order; neighbours that are contiguous in both flat and
  // shard space are merged (with world = 1 that is one segment over the whole buffer).
  std::vector<ShardSegment> segments() const;

 private:
  int rank_, world_;
  std::vector<ShardUnit> units_;
  int64_t padded_numel_ = 0, shard_numel_ = 0, max_padded_unit_ = 0;
};

}  // namespace ulysses
