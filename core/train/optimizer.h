// AdamW over the flat parameter buffer, with the learning-rate schedule and global-norm
// clipping it is used with.
#pragma once

#include <cstdint>
#include <vector>

#include "core/checkpoint/optimizer_moments.h"
#include "core/config/config.h"
#include "core/model/params.h"
#include "kernels/backend.h"
#include "parallel/shard_layout.h"

namespace ulysses {

// Linear warmup from lr/warmup_steps to lr over warmup_steps, then train.schedule: cosine or
// linear decay to min_lr at the last step, or lr constant. step is 0-based.
double learning_rate(const TrainConfig& train, int64_t step);

// Factor that scales the gradient so that its global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already below it).
float clip_scale(double grad_norm, double max_norm);

// Holds the moments of this rank's part of the flat parameter buffer, in the shard space of
// a ZeRO layout (parallel/shard_layout.h): all of it for a world of one rank.
class AdamW {
 public:
  AdamW(Backend& backend, const ParamTable& table, const TrainConfig& train,
        const ShardLayout& layout);

  // Updates master from gradient (both f32 in the layout's shard space); decay applies to
  // the tensors the table marks. step is 1-based (bias correction).
  void update(const Tensor& master, const Tensor& gradient, float lr, float grad_scale,
              int64_t step);

  const std::vector<ShardSegment>& segments() const { return segments_; }
  // What a checkpoint stores and loads: [layout.shard_numel()] each; padding stays zero.
  OptimizerMoments moments() const { return {segments_, m_.tensor(), v_.tensor()}; }

 private:
  Backend& backend_;
  ParamTable table_;  // a copy: a curriculum rebuilds the model (core/config/seq_len_schedule.h)
  const TrainConfig& train_;
  std::vector<ShardSegment> segments_;
  Buffer m_, v_;
};

}  // namespace ulysses
