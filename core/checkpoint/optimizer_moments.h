// The optimizer state a checkpoint holds (docs/checkpoints.md): this rank's AdamW moments in
// the shard space of its ZeRO layout, and the segments that map that space to flat parameter
// elements. The trainer's optimizer (core/train/optimizer.h) hands them over, so the
// checkpoint knows the state it stores, not the optimizer that updates it.
#pragma once

#include <vector>

#include "kernels/tensor.h"
#include "parallel/shard_layout.h"

namespace ulysses {

struct OptimizerMoments {
  const std::vector<ShardSegment>& segments;
  const Tensor& first;   // exp_avg, [shard_numel]; padding stays zero
  const Tensor& second;  // exp_avg_sq
};

}  // namespace ulysses
