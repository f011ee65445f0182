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
#include "parallel/zero_state.h"

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
  // Allocates the training state, sharded over `world` as parallel.zero_stage says (units
  // of at most parallel.bucket_mb), and the activations for micro-batches of `batch`
  // sequences of seq_local tokens; sp_comm is this rank's sequence-parallel group.
  Model(const Config& config, Backend& backend, Comm& sp_comm, Comm& world, int64_t batch,
        int64_t seq_local);

  const ParamTable& table() const { return table_; }
  int64_t num_params() const { return table_.total_numel(); }
  // Weights, gradients and master weights, whole or sharded (parallel/zero_state.h).
  ZeroState& state() { return state_; }
  const ZeroState& state() const { return state_; }

  // Collective. Deterministic in seed: every rank of every world size gets the same weights.
  void init_weights(uint64_t seed);
  // Collective; host holds num_params() f32 values laid out by the table.
  void load_weights(const float* host);
  // Collective; host may be null on ranks that do not need the values.
  void download_weights(float* host);
  // The reduced gradient of the last step (stage 0 before reduction: this rank's).
  void download_gradients(float* host);
  void zero_grads();

  // Forward, fused loss and backward; gradients accumulate (scaled by grad_scale).
  LossResult forward_backward(const MicroBatch& batch, float grad_scale);
  // Forward and loss only.
  LossResult evaluate(const MicroBatch& batch);

 private:
  void forward(const MicroBatch& batch);
  // Views of the weights (or gradients) that forward/backward use, through the ZeRO state:
  // a tensor outside the blocks (empty when the family has none), or one layer's tensors.
  // Under ZeRO-3 a weight view is valid until the weights of another unit are asked for,
  // so every backend call takes the weights of one unit (the tensors before the first
  // layer form one unit, those after the last another).
  struct UnitWindow {
    Tensor tensor;  // the unit's elements
    int64_t begin;  // flat index of its first element
  };
  UnitWindow unit_window(int64_t element, bool gradients);
  Tensor outside_blocks(ParamRole role, bool gradients);
  Tensor weight(ParamRole role) { return outside_blocks(role, false); }
  Tensor gradient(ParamRole role) { return outside_blocks(role, true); }
  LayerTensors layer_view(int index, bool gradients);
  // lm_head, or the token embedding it is tied to (gpt2).
  ParamRole lm_head_role() const;
  BlockActivations& activations(int layer);
  // FLOPs of the fused LM head over this rank's tokens (backward: the two weight and input
  // gradients on top).
  double lm_head_flops(bool backward) const;
  void final_norm_forward();
  void final_norm_backward(const Tensor& dhidden);

  const ModelConfig& model_;
  const MemoryConfig& memory_;
  Backend& backend_;
  ParamTable table_;
  BlockShape shape_;
  ZeroState state_;
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
