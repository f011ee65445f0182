#include "core/train/nonfinite.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ulysses {

std::string first_nonfinite_gradient(ZeroState& state, const std::vector<ShardSegment>& segments,
                                     const ParamTable& table, Backend& backend, Comm& world) {
  const Tensor& shard = state.gradient_shard();
  std::vector<float> host(static_cast<size_t>(shard.numel()));
  backend.download(host.data(), shard);
  int64_t first_element = std::numeric_limits<int64_t>::max();
  for (const ShardSegment& segment : segments) {
    for (int64_t i = 0; i < segment.size(); ++i) {
      if (!std::isfinite(host[size_t(segment.shard_begin + i)])) {
        first_element = std::min(first_element, segment.begin + i);
        break;
      }
    }
  }
  // The smallest over ranks, as the max of the negation (flat indices are exact in a
  // double up to 2^53, far beyond any model).
  double negated = first_element == std::numeric_limits<int64_t>::max()
                       ? -std::numeric_limits<double>::infinity()
                       : -double(first_element);
  world.all_reduce_host(&negated, 1, ReduceOp::max);
  const double first = -negated;
  if (std::isinf(first)) return "";
  for (const ParamSpec& spec : table.specs())
    if (int64_t(first) >= spec.offset && int64_t(first) < spec.offset + spec.numel)
      return spec.name;
  return "";
}

}  // namespace ulysses
