#include "core/train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace ulysses {

double learning_rate(const TrainConfig& train, int64_t step) {
  if (step < train.warmup_steps) return train.lr * double(step + 1) / double(train.warmup_steps);
  int64_t decay_steps = int64_t(train.steps) - train.warmup_steps;
  if (train.schedule == LrSchedule::constant || decay_steps <= 1) return train.lr;
  double progress = double(step - train.warmup_steps) / double(decay_steps - 1);
  if (progress > 1.0) progress = 1.0;
  const double remaining = train.schedule == LrSchedule::linear
                               ? 1.0 - progress
                               : 0.5 * (1.0 + std::cos(M_PI * progress));
  return train.min_lr + (train.lr - train.min_lr) * remaining;
}

float clip_scale(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || grad_norm <= max_norm) return 1.0f;
  return float(max_norm / (grad_norm + 1e-6));
}

AdamW::AdamW(Backend& backend, const ParamTable& table, const TrainConfig& train,
             const ShardLayout& layout)
    : backend_(backend),
      table_(table),
      train_(train),
      segments_(layout.segments()),
      m_(backend.alloc_zeroed(MemCategory::optimizer, DType::f32, {layout.shard_numel()},
                              "adam m")),
      v_(backend.alloc_zeroed(MemCategory::optimizer, DType::f32, {layout.shard_numel()},
                              "adam v")) {}

void AdamW::update(const Tensor& master, const Tensor& gradient, float lr, float grad_scale,
                   int64_t step) {
  AdamWStep hyper;
  hyper.lr = lr;
  hyper.beta1 = float(train_.beta1);
  hyper.beta2 = float(train_.beta2);
  hyper.eps = float(train_.eps);
  hyper.step = step;
  hyper.grad_scale = grad_scale;
  for (const ShardSegment& segment : segments_) {
    for (const ParamSpec& spec : table_.specs()) {
      // The part of this tensor inside the segment, and where it sits in the shard.
      const int64_t begin = std::max(spec.offset, segment.begin);
      const int64_t end = std::min(spec.offset + spec.numel, segment.end);
      if (begin >= end) continue;
      hyper.weight_decay = spec.weight_decay ? float(train_.weight_decay) : 0.0f;
      auto in_shard = [&](const Tensor& shard) {
        return shard.flat_range(segment.shard_begin + (begin - segment.begin), end - begin);
      };
      backend_.adamw(in_shard(master), in_shard(gradient), in_shard(m_), in_shard(v_), hyper);
    }
  }
}

}  // namespace ulysses
