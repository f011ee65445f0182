// The training state that ZeRO shards over the whole dp×sp world (docs/memory.md, ZeRO): weights,
// gradients and the f32 master weights the optimizer updates, held whole or as this
// rank's shard depending on the stage, and the collectives that move between the two.
// It knows flat buffers and units only (parallel/shard_layout.h), nothing of a model.
//
//   stage  weights for compute     gradients                        master weights (f32)
//   0      whole                   whole, all-reduced               whole (= the weights)
//   1      whole                   whole, reduce-scattered per unit shard
//   2      whole                   one unit at a time, reduce-      shard
//                                  scattered as backward finishes it
//   3      gathered one unit at a  as stage 2                       shard
//          time
//
// The optimizer moments live in the same shard space (layout().shard_numel() elements).
// With a world of one rank every stage behaves as stage 0.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"

namespace ulysses {

class ZeroState {
 public:
  // unit_ends as for ShardLayout. Buffers are charged to the tracking allocator at once:
  // params (whole weights, or the stage-3 shard and its gather buffer), grads (whole
  // gradient, shard, stage-2/3 staging buffer of one unit), optimizer (the master shard when
  // the rank also holds whole weights).
  ZeroState(Backend& backend, Comm& world, int stage, const std::vector<int64_t>& unit_ends);

  int stage() const { return stage_; }
  const ShardLayout& layout() const { return layout_; }

  // ---- forward and backward ------------------------------------------------------------
  // The unit's weights in the compute dtype (its numel() elements, flat element
  // unit.begin first). Stage 3 all-gathers the unit into its one gather buffer (sized for
  // the largest unit), so a view is valid only until weights of another unit are asked
  // for: every op of the model reads the weights of one unit. The gathered unit stays
  // until another one is gathered or the weights change.
  Tensor weights(int unit);
  // The unit's f32 gradient to accumulate into (same indexing). Stages 2 and 3 hold one
  // unit at a time: asking for another reduce-scatters the one held into the shard first,
  // and a unit asked for again starts from zero (the shard adds up its parts).
  Tensor gradients(int unit);
  // End of a micro-batch's backward: stages 2 and 3 reduce-scatter the unit still held.
  void finish_backward();

  // ---- the optimizer step --------------------------------------------------------------
  // Start of a step: every gradient (and shard) to zero.
  void zero_gradients();
  // After the last micro-batch: stage 0 all-reduces the whole gradient, stage 1
  // reduce-scatters it unit by unit; stages 2 and 3 have done so during backward.
  void reduce_gradients();
  // Squared norm of the whole reduced gradient, the same on every rank.
  double gradient_norm_squared();
  // The f32 master weights and the reduced gradient, in shard space: what the optimizer
  // updates (with world 1 or stage 0 these are the whole buffers).
  const Tensor& master() const;
  const Tensor& gradient_shard() const;
  // After master() changed: makes the compute weights follow (casts, all-gathers the
  // shards for stages 1 and 2, drops stage 3's gathered units).
  void publish_weights();

  // ---- whole buffers on the host (collective) ------------------------------------------
  // host holds layout().total() floats in flat order; each rank keeps its part.
  void upload_weights(const float* host);
  // Fills host with the whole f32 master weights (or the reduced gradient); host may be
  // null on ranks that only take part in the collective.
  void download_weights(float* host);
  void download_gradients(float* host);

 private:
  bool sharded() const { return stage_ >= 1; }
  // The unit's part of a padded-space buffer.
  Tensor padded_unit(const Tensor& padded, int unit) const;
  // This rank's block of the unit in a shard-space buffer.
  Tensor shard_block(const Tensor& shard, int unit) const;
  // Sums padded_source[world·block] over the world into the unit's block of the gradient
  // shard (added when the unit was reduced before in this step).
  void reduce_unit(int unit, const Tensor& padded_source);
  // The unit's blocks of shard (any dtype) from every rank into padded_target.
  void gather_unit(int unit, const Tensor& shard, const Tensor& padded_target);
  void download_sharded(const Tensor& shard, float* host);
  void flush_staging();

  Backend& backend_;
  Comm& world_;
  int stage_;
  ShardLayout layout_;
  DType compute_dtype_;

  Buffer whole_weights_;  // stages 0-2: compute dtype (stage 0: f32, the master), padded space
  Buffer compute_copy_;   // stage 0: whole; stage 3: shard; only when compute dtype != f32
  Buffer master_;         // stages 1-3: f32 shard
  Buffer whole_grads_;    // stages 0-1: padded space
  Buffer grad_shard_;     // stages 1-3
  Buffer staging_;        // stages 2-3: one unit's gradient, padded
  int staging_unit_ = -1;
  std::vector<bool> reduced_;  // per unit: reduce-scattered already in this step

  Buffer gathered_;  // stage 3: the weights of one unit, padded
  int gathered_unit_ = -1;
};

}  // namespace ulysses
