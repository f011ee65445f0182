// AdamW over the flat parameter buffer, with the learning-rate schedule and global-norm
// clipping it is used with.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/params.h"
#include "kernels/backend.h"
#include "parallel/zero.h"

namespace ulysses {

// Linear warmup from lr/warmup_steps to lr over warmup_steps, then cosine decay to
// min_lr at the last step. step is 0-based.
double learning_rate(const TrainConfig& train, int64_t step);

// Factor that scales the gradient so that its global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already below it).
float clip_scale(double grad_norm, double max_norm);

// Holds the moments of the elements [shard.begin, shard.end) of the flat parameter
// buffer: all of it, or this rank's ZeRO shard.
class AdamW {
 public:
  AdamW(Backend& backend, const ParamTable& table, const TrainConfig& train, ShardRange shard);

  // Updates params[shard] from grad_shard (the gradients of the shard's elements, f32);
  // decay applies to the tensors the table marks. step is 1-based (bias correction).
  void update(const Tensor& params, const Tensor& grad_shard, float lr, float grad_scale,
              int64_t step);

  const ShardRange& shard() const { return shard_; }
  // [shard.size()] each.
  const Tensor& first_moment() const { return m_.tensor(); }
  const Tensor& second_moment() const { return v_.tensor(); }

 private:
  Backend& backend_;
  const ParamTable& table_;
  const TrainConfig& train_;
  ShardRange shard_;
  Buffer m_, v_;
};

}  // namespace ulysses
