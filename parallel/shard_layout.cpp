#include "parallel/shard_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ulysses {

ShardLayout::ShardLayout(const std::vector<int64_t>& unit_ends, int rank, int world)
    : rank_(rank), world_(world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " of a world of " +
                                std::to_string(world));
  int64_t begin = 0;
  for (int64_t end : unit_ends) {
    if (end <= begin)
      throw std::invalid_argument("ShardLayout: unit ends must increase, got " +
                                  std::to_string(end) + " after " + std::to_string(begin));
    ShardUnit unit;
    unit.begin = begin;
    unit.end = end;
    unit.block = (end - begin + world - 1) / world;
    unit.padded_begin = padded_numel_;
    unit.shard_begin = shard_numel_;
    units_.push_back(unit);
    padded_numel_ += unit.block * world;
    shard_numel_ += unit.block;
    max_padded_unit_ = std::max(max_padded_unit_, unit.block * world);
    begin = end;
  }
}

int ShardLayout::unit_of(int64_t element) const {
  auto after = std::upper_bound(units_.begin(), units_.end(), element,
                                [](int64_t e, const ShardUnit& unit) { return e < unit.end; });
  if (element < 0 || after == units_.end())
    throw std::out_of_range("ShardLayout: element " + std::to_string(element) +
                            " is outside the buffer of " + std::to_string(total()));
  return int(after - units_.begin());
}

std::vector<ShardSegment> ShardLayout::segments() const {
  std::vector<ShardSegment> owned;
  for (const ShardUnit& unit : units_) {
    ShardSegment segment;
    segment.begin = std::min(unit.begin + int64_t(rank_) * unit.block, unit.end);
    segment.end = std::min(segment.begin + unit.block, unit.end);
    segment.shard_begin = unit.shard_begin;
    if (segment.size() == 0) continue;
    if (!owned.empty() && owned.back().end == segment.begin &&
        owned.back().shard_begin + owned.back().size() == segment.shard_begin) {
      owned.back().end = segment.end;
    } else {
      owned.push_back(segment);
    }
  }
  return owned;
}

}  // namespace ulysses
