// One transformer block, forward and backward next to each other, for both families.
// Shapes: R = B·T rows (tokens held by this rank), C = width, H/Hkv heads of d dims,
// F = MLP width.
#pragma once

#include "core/config/config.h"
#include "core/model/attention_schedule.h"
#include "core/model/layer_parts.h"
#include "core/model/params.h"
#include "kernels/backend.h"
#include "parallel/ulysses_attention.h"

namespace ulysses {

// Everything a block keeps from forward for its backward (docs/memory.md, "Activation
// memory for long sequences").
struct BlockActivations {
  Buffer norm1, mean1, rstd1;  // [R, C], [R], [R]  (mean only for layernorm; norm1 not kept
                               // with layer checkpointing: the backward makes it again)
  Buffer attn_out;             // [B, T, H, d]
  KeptAttention attention;     // core/model/attention_schedule.h
  Buffer mid;                  // [R, C] residual after attention   (none with memory.tiled_mlp:
  Buffer norm2, mean2, rstd2;  // [R, C], [R], [R]                    the backward recomputes
  Buffer ff_a, ff_b, ff_out;   // llama: gate, up, silu(gate)·up;     mid, norm2 and the
                               // gpt2: fc, -, gelu(fc); [R, F]       intermediates per tile)
};

class Block {
 public:
  // overlap (parallel.overlap): each all-to-all is started as soon as its input exists and
  // waited for only where its output is needed (docs/performance.md).
  Block(const ModelConfig& model, const MemoryConfig& memory, bool overlap, Backend& backend,
        UlyssesAttention& attention);

  BlockActivations allocate_activations(const BlockShape& shape) const;

  // out[R, C] = block(x[R, C]); fills acts. Working buffers live only as long as the part of
  // the block that uses them.
  void forward(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
               const Tensor& out, BlockActivations& acts) const;
  // memory.activation_checkpointing: fills acts again for the backward. A tiled MLP is left
  // out (its backward recomputes each tile), and then nothing is written to out, which may
  // be empty (mlp_recomputed_by_backward).
  void recompute(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
                 const Tensor& out, BlockActivations& acts) const;
  // Whether the backward recomputes the MLP of this many rows itself (memory.tiled_mlp).
  bool mlp_recomputed_by_backward(int64_t rows) const { return mlp_tiles(rows) > 1; }
  // dresidual holds d(out) on entry and d(x) on return; weight gradients accumulate. acts
  // is spent: the backward overwrites the MLP's intermediates with their gradients.
  void backward(const LayerTensors& weights, const LayerTensors& grads, const BlockShape& shape,
                const Tensor& x, BlockActivations& acts, const Tensor& dresidual) const;

 private:
  // The MLP's intermediates for some rows: a (llama gate, gpt2 fc), b (llama up), out
  // (the activation the down projection reads).
  struct MlpBuffers {
    Tensor a, b, out;
  };
  // memory.tiled_mlp: one tile's buffers, reused by every tile. mid and norm [tile, C] are
  // the tile's rows of the residual after attention and of the MLP norm's output.
  struct MlpTile {
    Buffer mid, norm, a, b, out;
    MlpBuffers first(int64_t rows) const;
  };
  // memory.tiled_mlp as a tile count for this many rows (1: untiled).
  int64_t mlp_tiles(int64_t rows) const;
  MlpTile allocate_mlp_tile(int64_t tile_rows, bool with_mid) const;
  // recompute_mlp: the intermediates of in's rows; mlp_forward: those, then out += their
  // down projection (+ bias).
  void recompute_mlp(const LayerTensors& w, const Tensor& in, const MlpBuffers& mlp) const;
  void mlp_forward(const LayerTensors& w, const Tensor& in, const Tensor& out,
                   const MlpBuffers& mlp) const;
  // dout[r, C] is d(out) of in's rows. The intermediates are overwritten by their gradients
  // and in by d(in); the weight gradients accumulate.
  void mlp_backward(const LayerTensors& w, const LayerTensors& g, const Tensor& in,
                    const MlpBuffers& mlp, const Tensor& dout) const;
  // mid[r, C] = x + attention output · o_weightᵀ (+ bias), for some rows.
  void attention_residual(const LayerTensors& w, const Tensor& x, const Tensor& attn_out,
                          const Tensor& mid) const;
  // acts.norm1 when kept, else norm(x) in `made`, which the caller frees when done with it.
  Tensor attention_norm(const LayerTensors& w, const Tensor& x, BlockActivations& acts,
                        Buffer& made) const;
  // The attention of norm1 into acts.attn_out (and acts.attention).
  void attention_forward(const LayerTensors& w, const BlockShape& shape, const Tensor& norm1,
                         BlockActivations& acts) const;
  // d(attention output) from dresidual (= d(mid)) through the attention into dnorm (d of
  // norm1, overwritten); the o, q, k and v weight gradients accumulate.
  void attention_backward(const LayerTensors& w, const LayerTensors& g, const BlockShape& shape,
                          const Tensor& norm1, BlockActivations& acts, const Tensor& dresidual,
                          const Tensor& dnorm) const;
  // forward and recompute: recomputing stops after the attention when the MLP is tiled.
  void forward_pass(const LayerTensors& weights, const BlockShape& shape, const Tensor& x,
                    const Tensor& out, BlockActivations& acts, bool recomputing) const;
  // Forward FLOPs of the MLP over `rows` tokens (backward: 2×).
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
  // The family's architecture features this block branches on (core/config/config.h).
  bool swiglu_;    // SwiGLU MLP (gate, up, down), else GELU (fc, proj)
  bool rms_norm_;  // RMSNorm, else LayerNorm (with a mean and a bias)
  bool rope_;      // rotary q and k, else positions are learned embeddings (core/model/model.cpp)
  // memory.activation_checkpointing: norm1 is made for each use instead of kept.
  bool checkpointing_;
};

}  // namespace ulysses
