// One transformer block, forward and backward next to each other, for both families.
// Shapes: R = B·T rows (tokens held by this rank), C = width, H/Hkv heads of d dims,
// F = MLP width.
#pragma once

#include <array>

#include "core/config.h"
#include "core/params.h"
#include "kernels/backend.h"
#include "parallel/ulysses_attention.h"

namespace ulysses {

// Views of one layer's tensors (parameters, or their gradients) by role, derived from
// the parameter table; roles a family does not have stay empty. window holds the flat
// elements from window_begin on (ParamTable::view).
struct LayerTensors {
  std::array<Tensor, size_t(ParamRole::count)> by_role;
  const Tensor& operator[](ParamRole role) const { return by_role[size_t(role)]; }
};
LayerTensors layer_tensors(const ParamTable& table, const Tensor& window, int64_t window_begin,
                           int layer);

// q/k/v projection weights (or their gradients) [heads·d, C] and biases: separate tensors
// in llama, row blocks of c_attn in gpt2 (biases empty in llama).
struct QkvTensors {
  Tensor wq, wk, wv, bq, bk, bv;
};
QkvTensors qkv_tensors(const LayerTensors& t, int64_t q_width, int64_t kv_width);

// Everything a block keeps from forward for its backward.
struct BlockActivations {
  Buffer norm1, mean1, rstd1;  // [R, C], [R], [R]  (mean only for layernorm)
  Buffer q, k, v;              // [B, T, H, d], [B, T, Hkv, d], after RoPE; only with sp == 1,
                               // where the attention state views them (else BlockScratch's)
  Buffer attn_out;             // [B, T, H, d]
  AttentionState attention;
  Buffer mid;                  // [R, C] residual after attention
  Buffer norm2, mean2, rstd2;  // [R, C], [R], [R]
  Buffer ff_a, ff_b, ff_out;   // llama: gate, up, silu(gate)·up; gpt2: fc, -, gelu(fc); [R, F]
                               // (none with memory.tiled_mlp: the backward recomputes them)
};

// Shapes of one rank's share of a micro-batch.
struct BlockShape {
  int64_t batch = 1;       // B
  int64_t seq_local = 1;   // T held by this rank
  int64_t pos_offset = 0;  // global position of this rank's first token
};

// Scratch reused by every block: the backward's gradients, and with sp > 1 the forward's
// local q/k/v too (attention keeps its own head-split copies, so they are dead after it).
struct BlockScratch {
  Buffer dnorm;  // [R, C]
  Buffer dattn;  // [R, H·d]
  // [B, T, H, d], [B, T, Hkv, d]: in forward the local q, k, v when the activations do not
  // keep them (sp > 1); in backward their gradients.
  Buffer q_or_dq, k_or_dk, v_or_dv;
  Buffer dff_a, dff_b;              // [R, F], or [tile, F] with memory.tiled_mlp
  Buffer tile_a, tile_b, tile_out;  // memory.tiled_mlp: one tile's ff_a, ff_b, ff_out
};

class Block {
 public:
  // overlap (parallel.overlap): each all-to-all is started as soon as its input exists and
  // waited for only where its output is needed (docs/performance.md).
  Block(const ModelConfig& model, const MemoryConfig& memory, bool overlap, Backend& backend,
        UlyssesAttention& attention);

  BlockActivations allocate_activations(const BlockShape& shape) const;
  BlockScratch allocate_scratch(const BlockShape& shape) const;

  // out[R, C] = block(x[R, C]); fills acts.
  void forward(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
               const Tensor& out, BlockActivations& acts, BlockScratch& scratch) const;
  // memory.activation_checkpointing: fills acts again for the backward. A tiled MLP is left
  // out (its backward recomputes each tile), and then nothing is written to out, which may
  // be empty (mlp_recomputed_by_backward).
  void recompute(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
                 const Tensor& out, BlockActivations& acts, BlockScratch& scratch) const;
  // Whether the backward recomputes the MLP of this many rows itself (memory.tiled_mlp).
  bool mlp_recomputed_by_backward(int64_t rows) const { return mlp_tiles(rows) > 1; }
  // dresidual holds d(out) on entry and d(x) on return; weight gradients accumulate.
  void backward(const LayerTensors& weights, const LayerTensors& grads, const BlockShape& shape,
                const Tensor& x, BlockActivations& acts, BlockScratch& scratch,
                const Tensor& dresidual) const;

 private:
  // The MLP's intermediates for some rows: a (llama gate, gpt2 fc), b (llama up), out
  // (the activation the down projection reads).
  struct MlpBuffers {
    Tensor a, b, out;
  };
  // memory.tiled_mlp as a tile count for this many rows (1: untiled).
  int64_t mlp_tiles(int64_t rows) const;
  MlpBuffers scratch_tile(const BlockScratch& scratch, int64_t rows) const;
  // The intermediates of in's rows, then out += down projection (+ bias).
  void recompute_mlp(const LayerTensors& w, const Tensor& in, const MlpBuffers& mlp) const;
  void mlp_forward(const LayerTensors& w, const Tensor& in, const Tensor& out,
                   const MlpBuffers& mlp) const;
  void mlp_backward(const LayerTensors& w, const LayerTensors& g, const Tensor& in,
                    const MlpBuffers& mlp, const Tensor& dout, const Tensor& din, const Tensor& d_a,
                    const Tensor& d_b) const;
  // forward and recompute: with_mlp false stops after the MLP's norm.
  void forward_pass(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
                    const Tensor& out, BlockActivations& acts, BlockScratch& scratch,
                    bool with_mlp) const;
  // Attention in head stages (core/staged_attention.h): parallel.head_chunks > 1.
  bool staged() const { return attention_.head_chunks() > 1; }
  // Forward FLOPs of the q/k/v projections and of the MLP over `rows` tokens (backward: 2×).
  double qkv_flops(int64_t rows) const;
  double mlp_flops(int64_t rows) const;
  void norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& weight, const Tensor& bias) const;
  void norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                     const Tensor& rstd) const;

  const ModelConfig& model_config_;
  const MemoryConfig& memory_;
  bool overlap_;
  Backend& backend_;
  UlyssesAttention& attention_;
  // The family's architecture features this block branches on (core/config.h).
  bool swiglu_;    // SwiGLU MLP (gate, up, down), else GELU (fc, proj)
  bool rms_norm_;  // RMSNorm, else LayerNorm (with a mean and a bias)
  bool rope_;      // rotary q and k, else positions are learned embeddings (core/model.cpp)
};

// out[R, O] = in[R, I] · weight[O, I]ᵀ (+ bias[O])
void linear_forward(Backend& backend, const Tensor& out, const Tensor& in, const Tensor& weight,
                    const Tensor& bias);
// din[R, I] = (or += when accumulate_din) dout · weight; dweight += doutᵀ · in;
// dbias += column sums of dout (when not empty)
void linear_backward(Backend& backend, const Tensor& din, bool accumulate_din,
                     const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight);

}  // namespace ulysses
