// The training state that ZeRO shards over the whole dp×sp world (docs/memory.md, ZeRO): weights,
// gradients and the f32 master weights the optimizer updates, held whole or as this
// rank's shard depending on the stage, and the collectives that move between the two,
// started by the step's schedule and returned as handles (docs/profiling.md, "The step as one
// schedule"). It knows flat buffers and units only (parallel/shard_layout.h), nothing of a model.
//
//   stage  weights for compute     gradients                        master weights (f32)
//   0      whole                   whole, all-reduced               whole (= the weights)
//   1      whole                   whole, reduce-scattered per unit shard
//   2      whole                   one unit per slot, reduce-       shard
//                                  scattered as backward finishes it
//   3      gathered one unit per   as stage 2                       shard
//          slot
//
// The optimizer moments live in the same shard space (layout().shard_numel() elements).
// With a world of one rank every stage behaves as stage 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"

namespace ulysses {

// Fills out[0, count) with flat elements [begin, begin + count) of the weights.
using FlatRangeReader = std::function<void(int64_t begin, int64_t count, float* out)>;
// Takes values of flat elements [begin, begin + count).
using FlatRangeWriter = std::function<void(int64_t begin, int64_t count, const float* values)>;

class ZeroState {
 public:
  // unit_ends as for ShardLayout. slots is how many units may be in flight at once: 1, or 2
  // so that a unit's gather (stage 3) or reduction (stages 2-3) can travel while another
  // unit computes (parallel.prefetch). Buffers are charged to the tracking allocator at once:
  // params (whole weights, or the stage-3 shard and its gather slots), grads (whole gradient,
  // shard, stage-2/3 staging slots), optimizer (the master shard when the rank also holds
  // whole weights).
  ZeroState(Backend& backend, Comm& world, int stage, const std::vector<int64_t>& unit_ends,
            int slots = 1);

  int stage() const { return stage_; }
  int slots() const { return slots_; }
  const ShardLayout& layout() const { return layout_; }

  // ---- forward and backward ------------------------------------------------------------
  // Storage is passive: these hand out buffers and start collectives, and the step's
  // schedule (core/model/model.cpp) decides when each is issued and waited for.
  //
  // Stage 3: starts all-gathering the unit into a free gather slot and returns the handle;
  // nothing to wait for (null) when the weights are whole (stages 0-2) or a free slot still
  // holds the unit. Throws std::logic_error when every slot holds a unit in use.
  CommHandle start_gather(int unit);
  // The unit's weights in the compute dtype (its numel() elements, flat element unit.begin
  // first). Stage 3: its gather must have been started and waited for, and not released.
  Tensor weights(int unit) const;
  // Stage 3: the unit's slot may take another unit (its contents stay until then).
  void release(int unit);

  // The unit's f32 gradient to accumulate into (same indexing). Stages 2-3 stage one unit
  // per slot: begin_gradients takes a free slot and zeroes it (std::logic_error when none is
  // free), start_reduction reduce-scatters it into this rank's shard (added to what earlier
  // reductions of the unit in this step left there) and frees the slot when its handle has
  // been waited for. Stages 0-1 accumulate into the whole gradient: begin_gradients does
  // nothing and start_reduction returns null (reduce_gradients reduces after the last
  // micro-batch).
  void begin_gradients(int unit);
  Tensor gradients(int unit) const;
  CommHandle start_reduction(int unit);

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

  // ---- weights through the host, by the ranges this rank stores --------------------------
  // Collective. Asks read for the flat ranges whose master weights this rank stores (its
  // shard; all of them at stage 0), then publishes. Where the backend's memory is the host's,
  // read writes straight into the master weights, a unit at a time; elsewhere into two halves
  // of a host staging block of at most one unit, filling one while the other is uploaded
  // (kernels/staged_upload.h). Either way the host holds at most one unit more
  // (docs/memory.md, "Host memory per rank"). read may run OpenMP threads of its own.
  void upload_weights(const FlatRangeReader& read);
  // Hands the master weights this rank stores to write, in flat order and in pieces of at
  // most one unit. Not collective.
  void download_stored_weights(const FlatRangeWriter& write);
  // The most elements that travel through the host at once: one unit (padded).
  int64_t host_piece() const { return std::max<int64_t>(1, layout_.max_padded_unit()); }

  // ---- whole buffers on the host (collective) ------------------------------------------
  // host holds layout().total() floats in flat order; each rank keeps its part.
  void upload_weights(const float* host);
  // Fills host with the whole f32 master weights (or the reduced gradient); host may be
  // null on ranks that only take part in the collective.
  void download_weights(float* host);
  void download_gradients(float* host);

 private:
  class Pending;  // a started gather or reduction and what its wait completes
  bool sharded() const { return stage_ >= 1; }
  // The slot whose tag is `unit`, or -1.
  static int slot_of(const std::vector<int>& tags, int unit);
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
  // The f32 master weights in shard space (stage 0: the whole weights).
  const Tensor& master_weights() const;
  // Calls visit(flat begin, shard begin, count) for this rank's segments cut into pieces of
  // at most one unit.
  void for_each_stored_piece(
      const std::function<void(int64_t begin, int64_t shard_begin, int64_t count)>& visit) const;

  Backend& backend_;
  Comm& world_;
  int stage_;
  int slots_;
  ShardLayout layout_;
  DType compute_dtype_;

  Buffer whole_weights_;       // stages 0-2: compute dtype (stage 0: f32, the master), padded space
  Buffer compute_copy_;        // stage 0: whole; stage 3: shard; only when compute dtype != f32
  Buffer master_;              // stages 1-3: f32 shard
  Buffer whole_grads_;         // stages 0-1: padded space
  Buffer grad_shard_;          // stages 1-3
  std::vector<bool> reduced_;  // per unit: reduce-scattered already in this step

  // Stages 2-3: slots of one unit's gradient each (padded), the unit each stages (-1: free)
  // and whether its reduction is in flight.
  std::vector<Buffer> staging_;
  std::vector<int> staging_unit_;
  // Stage 3: slots of one unit's gathered weights each (padded), the unit each holds (-1:
  // none), and whether it is in use (gathering or not released).
  std::vector<Buffer> gathered_;
  std::vector<int> gathered_unit_;
  std::vector<bool> gathered_in_use_;
};

// What a rank stores, kept on the host: filled by download_stored_weights and read back by
// upload_weights of a state with the same layout (a model rebuilt for another sequence
// length), so the host holds this rank's share, never the whole model.
class StoredWeights {
 public:
  // Pieces are added in increasing flat order.
  void add(int64_t begin, int64_t count, const float* values);
  // Throws std::logic_error unless [begin, begin + count) lies inside one piece added.
  void read(int64_t begin, int64_t count, float* out) const;

 private:
  struct Piece {
    int64_t begin = 0, count = 0;
    size_t at = 0;  // where its values start in values_
  };
  std::vector<Piece> pieces_;
  std::vector<float> values_;
};

}  // namespace ulysses
