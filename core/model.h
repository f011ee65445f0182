// The whole model: parameter and gradient buffers (one flat buffer each, laid out by the
// parameter table), the embedding, the stack of blocks and the fused LM-head loss, for
// one rank's share of a micro-batch (B sequences × seq_local tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/layers.h"
#include "core/params.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/ulysses_attention.h"

namespace ulysses {

// One rank's tokens of a micro-batch, on the host. inputs/targets are [batch, seq_local];
// targets < 0 are not scored.
struct MicroBatch {
  int64_t batch = 0;
  int64_t seq_local = 0;
  int64_t pos_offset = 0;  // global position of the first token (sp_rank · seq_local)
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

class Model {
 public:
  // Allocates parameters, gradients and the activations for micro-batches of `batch`
  // sequences of seq_local tokens; sp_comm is this rank's sequence-parallel group. The
  // flat parameter and gradient buffers are padded to `flat_blocks` equal blocks (the
  // ZeRO shards; 1 = no padding).
  Model(const Config& config, Backend& backend, Comm& sp_comm, int64_t batch, int64_t seq_local,
        int flat_blocks = 1);

  const ParamTable& table() const { return table_; }
  // fp32 master weights (what the optimizer updates and checkpoints hold), laid out by
  // the parameter table.
  Tensor params() const { return params_.tensor().flat_range(0, table_.total_numel()); }
  Tensor grads() const { return grads_.tensor().flat_range(0, table_.total_numel()); }
  // The same buffers with their zero padding to flat_blocks equal blocks.
  const Tensor& padded_params() const { return params_.tensor(); }
  const Tensor& padded_grads() const { return grads_.tensor(); }
  int64_t num_params() const { return table_.total_numel(); }

  // Deterministic in seed: every rank of every world size gets the same weights.
  void init_weights(uint64_t seed);
  // After params() changed (optimizer step, load): refreshes the copy in the backend's
  // compute dtype that forward and backward read (a no-op when that is f32).
  void refresh_compute_params();
  void zero_grads();

  // Forward, fused loss and backward; gradients accumulate (scaled by grad_scale).
  LossResult forward_backward(const MicroBatch& batch, float grad_scale);
  // Forward and loss only.
  LossResult evaluate(const MicroBatch& batch);

 private:
  void forward(const MicroBatch& batch);
  // The weights forward/backward read: params_ itself, or its low-precision copy.
  const Tensor& weights() const;
  Tensor lm_head_weight(const Tensor& flat) const;
  BlockActivations& activations(int layer);
  void final_norm_forward();
  void final_norm_backward(const Tensor& dhidden);

  const ModelConfig& model_;
  const MemoryConfig& memory_;
  Backend& backend_;
  ParamTable table_;
  BlockShape shape_;
  Buffer params_, grads_;
  Buffer compute_params_;  // only when the compute dtype is not f32
  UlyssesAttention attention_;
  Block block_;

  // memory.activation_checkpointing: layer keeps only each block's input (residuals_) and
  // recomputes the block's activations right before its backward.
  bool recompute_;
  Buffer tokens_, targets_;  // [B, T] i32
  std::vector<Buffer>
      residuals_;  // n_layers + 1 × [R, C]: input of each block, then the last output
  std::vector<BlockActivations> acts_;  // per block, or one set shared by all when recomputing
  Buffer final_norm_out_, final_mean_, final_rstd_;
  BlockScratch scratch_;
  Buffer dresidual_, dhidden_;  // [R, C]
};

}  // namespace ulysses
