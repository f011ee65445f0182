// The whole model: parameter and gradient buffers (one flat buffer each, laid out by the
// parameter table), the embedding, the stack of blocks and the fused LM-head loss, for
// one rank's share of a micro-batch (B sequences × seq_local tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/model/layers.h"
#include "core/model/params.h"
#include "core/model/unit_pipeline.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/ulysses_attention.h"
#include "parallel/zero_state.h"

namespace ulysses {

// One rank's tokens of a micro-batch, on the host. inputs/targets are [batch, seq_local];
// targets < 0 are not scored. Both are empty in a planned step (Trainer::plan_step).
struct MicroBatch {
  int64_t batch = 0;
  int64_t seq_local = 0;
  int64_t pos_offset = 0;  // global position of the first token (sp_rank · seq_local)
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  // Packed documents: the starts of each whole sequence (every rank holds them all), or none
  // (kernels/documents.h; docs/parallelism.md, "Packed documents").
  Documents documents;
};

class Model {
 public:
  // Allocates the training state, sharded over `world` as parallel.zero_stage says (units
  // of at most parallel.bucket_mb), and the activations for micro-batches of `batch`
  // sequences of seq_local tokens; sp_comm is this rank's sequence-parallel group.
  // With ring comms (parallel.ring > 1) attention's all-to-alls run over ring.ulysses and its
  // ring attention over ring.ring; sp_comm still places this rank's tokens.
  Model(const Config& config, Backend& backend, Comm& sp_comm, Comm& world, int64_t batch,
        int64_t seq_local, RingComms ring = {});

  const ParamTable& table() const { return table_; }
  int64_t num_params() const { return table_.total_numel(); }
  // Rows per tile of the fused LM head + loss: memory.loss_tile_tokens, or the backend's
  // choice for auto (kernels/op_scratch.h).
  int64_t loss_tile_tokens() const { return loss_tile_tokens_; }
  // Weights, gradients and master weights, whole or sharded (parallel/zero_state.h).
  ZeroState& state() { return state_; }
  const ZeroState& state() const { return state_; }

  // Collective. Deterministic in seed: every rank of every world size gets the same weights
  // (core/model/param_init.h), and each makes only the ranges it stores.
  void init_weights(uint64_t seed);
  // Collective: read is asked only for the ranges this rank stores, one unit at a time.
  void load_weights(const FlatRangeReader& read);
  // Collective; host holds num_params() f32 values laid out by the table.
  void load_weights(const float* host);
  // Collective; host may be null on ranks that do not need the values.
  void download_weights(float* host);
  // The reduced gradient of the last step (stage 0 before reduction: this rank's).
  void download_gradients(float* host);
  void zero_grads();

  // The step's schedule for one micro-batch: forward, fused loss and backward, with every
  // weight gather and gradient reduction placed where it is issued and waited for;
  // gradients accumulate (scaled by grad_scale).
  LossResult forward_backward(const MicroBatch& batch, float grad_scale);
  // Forward and loss only.
  LossResult evaluate(const MicroBatch& batch);
  // Forward only, then the logits of some rows of the micro-batch (row b · seq_local + t),
  // for sampling (core/train/sampler.h): rows.size() × vocab_size floats, one row after another.
  std::vector<float> logits(const MicroBatch& batch, const std::vector<int64_t>& rows);

 private:
  // The units in the order a pass uses them: embedding, layers, final norm, LM head, and
  // with backward the final norm, the layers in reverse and the embedding again.
  std::vector<int> unit_plan(bool backward) const;
  // The forward of a micro-batch through the final norm, taking each unit from weights.
  void forward(const MicroBatch& batch, WeightPipeline& weights);
  // Views of the weights (or gradients) that forward/backward use: a tensor outside the
  // blocks (empty when the family has none), or one layer's tensors. They read the ZeRO
  // state passively: the unit must have been taken from the pipelines (under ZeRO-3 its
  // gather waited for; under stages 2-3 its gradient staged).
  int unit_of(ParamRole role) const;
  int layer_unit(int layer) const;
  Tensor outside_blocks(ParamRole role, bool gradients) const;
  Tensor weight(ParamRole role) const { return outside_blocks(role, false); }
  Tensor gradient(ParamRole role) const { return outside_blocks(role, true); }
  LayerTensors layer_view(int index, bool gradients) const;
  // lm_head, or the token embedding it is tied to (gpt2).
  ParamRole lm_head_role() const;
  BlockActivations& activations(int layer);
  // The device buffer holding layer `layer`'s input (layer n_layers: the last block's output).
  Buffer& block_input(int layer);
  // FLOPs of the fused LM head over the rows of this rank's tokens that count in the loss
  // (the only ones it computes; backward: the two weight and input gradients on top).
  double lm_head_flops(bool backward) const;
  // The embedding of tokens_ into out[B, T, C] and its backward: learned positions restart
  // at each document (one call per piece of a document) when the micro-batch has documents.
  void embed(const Tensor& out);
  void embed_backward(const Tensor& dout);
  void final_norm_forward();
  void final_norm_backward(const Tensor& dhidden, const Tensor& dresidual);

  const ModelConfig& model_config_;
  const MemoryConfig& memory_;
  Backend& backend_;
  int64_t loss_tile_tokens_;
  int64_t counted_rows_ = 0;  // the micro-batch's targets that count (>= 0), for the FLOPs
  ParamTable table_;
  BlockShape shape_;
  ZeroState state_;
  bool prefetch_;  // parallel.prefetch: gathers and reductions travel while other units compute
  UlyssesAttention attention_;
  Block block_;

  // memory.activation_checkpointing: layer keeps only each block's input (residuals_) and
  // recomputes the block's activations right before its backward.
  bool recompute_;
  // memory.offload_checkpoints on a backend whose host memory is apart (cuda): each layer
  // input is copied out to host_inputs_ as the forward makes it and back one layer ahead in
  // the backward, so only two stay on the device (residuals_ then holds two buffers, used in
  // turn) and the recomputed block's unused output goes to recompute_out_ (docs/memory.md;
  // none with a tiled MLP, whose recompute stops before the MLP).
  bool offload_moves_;
  Buffer tokens_, targets_;  // [B, T] i32
  std::vector<Buffer>
      residuals_;  // n_layers + 1 × [R, C]: input of each block, then the last output
  std::vector<Buffer> host_inputs_;  // offload_moves_: n_layers × [R, C], checkpoints_host
  Buffer recompute_out_;
  std::vector<int64_t> offloaded_;  // the transfer that copies out each layer's input
  int64_t last_transfer_ = 0;
  std::vector<BlockActivations> acts_;  // per block, or one set shared by all when recomputing
  Buffer final_norm_out_;  // [R, C], from the final norm's forward until the loss has read it
  Buffer final_mean_, final_rstd_;
};

}  // namespace ulysses
