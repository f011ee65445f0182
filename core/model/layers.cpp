#include "core/model/layers.h"

#include <algorithm>

namespace ulysses {

namespace {

using R = ParamRole;

}  // namespace

Block::Block(const ModelConfig& model, const MemoryConfig& memory, bool overlap, Backend& backend,
             UlyssesAttention& attention)
    : model_config_(model),
      memory_(memory),
      overlap_(overlap),
      backend_(backend),
      attention_(attention),
      swiglu_(architecture(model.family).mlp == MlpKind::swiglu),
      rms_norm_(architecture(model.family).norm == NormKind::rms),
      rope_(architecture(model.family).positions == PositionKind::rope),
      checkpointing_(memory.activation_checkpointing == ActivationCheckpointing::layer) {}

double Block::mlp_flops(int64_t rows) const {
  const int matrices = swiglu_ ? 3 : 2;
  return 2.0 * matrices * double(rows) * double(model_config_.d_model) * double(model_config_.d_ff);
}

BlockActivations Block::allocate_activations(const BlockShape& shape) const {
  const int64_t rows = shape.batch * shape.seq_local, C = model_config_.d_model,
                F = model_config_.d_ff;
  const int64_t H = model_config_.n_heads, d = model_config_.head_dim();
  const DType dt = backend_.compute_dtype();
  auto act = [&](std::initializer_list<int64_t> dims, const char* what) {
    return backend_.alloc(MemCategory::activations, dt, dims, what);
  };
  auto stat = [&](const char* what) {
    return backend_.alloc(MemCategory::activations, DType::f32, {rows}, what);
  };
  BlockActivations acts;
  if (!checkpointing_) acts.norm1 = act({rows, C}, "attention norm output");
  acts.rstd1 = stat("attention norm rstd");
  acts.attn_out = backend_.alloc(MemCategory::attention, dt, {shape.batch, shape.seq_local, H, d},
                                 "attention output");
  acts.rstd2 = stat("mlp norm rstd");
  if (mlp_tiles(rows) == 1) {  // kept for the backward; tiles recompute them
    acts.mid = act({rows, C}, "residual after attention");
    acts.norm2 = act({rows, C}, "mlp norm output");
    auto mlp = [&](const char* what) {
      return backend_.alloc(MemCategory::mlp, dt, {rows, F}, what);
    };
    acts.ff_a = mlp(swiglu_ ? "mlp gate" : "mlp fc");
    if (swiglu_) acts.ff_b = mlp("mlp up");
    acts.ff_out = mlp("mlp activation");
  }
  if (!rms_norm_) {
    acts.mean1 = stat("attention norm mean");
    acts.mean2 = stat("mlp norm mean");
  }
  return acts;
}

Block::MlpTile Block::allocate_mlp_tile(int64_t tile_rows, bool with_mid) const {
  const DType dt = backend_.compute_dtype();
  auto mlp = [&](int64_t width, const char* what) {
    return backend_.alloc(MemCategory::mlp, dt, {tile_rows, width}, what);
  };
  // The rows of what untiled are the activations mid and norm2 stay in that category.
  auto act = [&](const char* what) {
    return backend_.alloc(MemCategory::activations, dt, {tile_rows, model_config_.d_model}, what);
  };
  const int64_t F = model_config_.d_ff;
  MlpTile tile;
  if (with_mid) tile.mid = act("residual after attention (tile)");
  tile.norm = act("mlp norm output (tile)");
  tile.a = mlp(F, swiglu_ ? "mlp gate (tile)" : "mlp fc (tile)");
  if (swiglu_) tile.b = mlp(F, "mlp up (tile)");
  tile.out = mlp(F, "mlp activation (tile)");
  return tile;
}

Block::MlpBuffers Block::MlpTile::first(int64_t rows) const {
  auto first_rows = [&](const Buffer& buffer) {
    return buffer.empty() ? Tensor() : buffer.tensor().slice_rows(0, rows);
  };
  return {first_rows(a), first_rows(b), first_rows(out)};
}

void Block::norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& weight, const Tensor& bias) const {
  if (rms_norm_) {
    backend_.rmsnorm_forward(out, rstd, x, weight, float(model_config_.norm_eps));
  } else {
    backend_.layernorm_forward(out, mean, rstd, x, weight, bias, float(model_config_.norm_eps));
  }
}

void Block::norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) const {
  if (rms_norm_) {
    backend_.rmsnorm_backward(dx, dweight, dout, x, weight, rstd);
  } else {
    backend_.layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd);
  }
}

void Block::forward(const LayerTensors& w, const BlockShape& shape, const Tensor& x,
                    const Tensor& out, BlockActivations& acts) const {
  forward_pass(w, shape, x, out, acts, false);
}

void Block::recompute(const LayerTensors& w, const BlockShape& shape, const Tensor& x,
                      const Tensor& out, BlockActivations& acts) const {
  forward_pass(w, shape, x, out, acts, true);
}

Tensor Block::attention_norm(const LayerTensors& w, const Tensor& x, BlockActivations& acts,
                             Buffer& made) const {
  if (acts.norm1.empty())
    made = backend_.alloc(MemCategory::activations, backend_.compute_dtype(),
                          {x.dim(0), model_config_.d_model}, "attention norm output");
  const Tensor& norm1 = acts.norm1.empty() ? made.tensor() : acts.norm1.tensor();
  norm_forward(norm1, acts.mean1, acts.rstd1, x, w[R::attn_norm_weight], w[R::attn_norm_bias]);
  return norm1;
}

void Block::attention_residual(const LayerTensors& w, const Tensor& x, const Tensor& attn_out,
                               const Tensor& mid) const {
  const int64_t rows = x.dim(0), width = w[R::o_weight].dim(1);
  Profiler::Scope projection(backend_.profiler(), phase::kOutputProjection, Profiler::Kind::compute,
                             0, 2.0 * double(rows) * double(width) * double(model_config_.d_model));
  backend_.copy(mid, x);
  backend_.gemm(attn_out.reshape({rows, width}), false, w[R::o_weight], true, mid, 1.0f, 1.0f);
  if (!w[R::o_bias].empty()) backend_.bias_forward(mid, w[R::o_bias]);
}

void Block::forward_pass(const LayerTensors& w, const BlockShape& shape, const Tensor& x,
                         const Tensor& out, BlockActivations& acts, bool recomputing) const {
  const int64_t rows = shape.batch * shape.seq_local;
  // attention: x -> norm1 -> q, k, v -> (RoPE) -> Ulysses attention -> o_proj, + x
  {
    Buffer made;  // norm1, when not kept: gone once the attention has read it
    attention_forward(w, shape, attention_norm(w, x, acts, made), acts);
  }
  const Tensor attn_out =
      acts.attn_out.tensor().reshape({rows, acts.attn_out.tensor().numel() / rows});

  // MLP: mid -> norm2 -> (gate, up -> swiglu | fc -> gelu) -> down, + mid
  Profiler& profiler = backend_.profiler();
  const int64_t tiles = mlp_tiles(rows);
  if (tiles == 1) {
    attention_residual(w, x, attn_out, acts.mid);
    norm_forward(acts.norm2, acts.mean2, acts.rstd2, acts.mid, w[R::mlp_norm_weight],
                 w[R::mlp_norm_bias]);
    backend_.copy(out, acts.mid);
    Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0, mlp_flops(rows));
    mlp_forward(w, acts.norm2, out, {acts.ff_a, acts.ff_b, acts.ff_out});
    return;
  }
  // memory.tiled_mlp: one tile of rows at a time, the residual after attention made straight
  // in out; neither [R, F] nor the whole mid and norm2 exist. Recomputing stops before: the
  // backward recomputes each tile.
  if (recomputing) return;
  const int64_t tile_rows = (rows + tiles - 1) / tiles;
  const MlpTile tile = allocate_mlp_tile(tile_rows, false);
  for (int64_t begin = 0; begin < rows; begin += tile_rows) {
    const int64_t end = std::min(rows, begin + tile_rows), count = end - begin;
    const Tensor out_rows = out.slice_rows(begin, end);
    const Tensor norm2 = tile.norm.tensor().slice_rows(0, count);
    attention_residual(w, x.slice_rows(begin, end), attn_out.slice_rows(begin, end), out_rows);
    norm_forward(norm2,
                 acts.mean2.empty() ? Tensor() : acts.mean2.tensor().flat_range(begin, count),
                 acts.rstd2.tensor().flat_range(begin, count), out_rows, w[R::mlp_norm_weight],
                 w[R::mlp_norm_bias]);
    Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0, mlp_flops(count));
    mlp_forward(w, norm2, out_rows, tile.first(count));
  }
}

void Block::attention_forward(const LayerTensors& w, const BlockShape& shape, const Tensor& norm1,
                              BlockActivations& acts) const {
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const QkvTensors qkv = qkv_tensors(w, H * d, Hkv * d);
  const float theta = rope_ ? float(model_config_.rope_theta) : 0.0f;
  ulysses::attention_forward(backend_, attention_, {qkv, shape, norm1, theta, overlap_},
                             acts.attn_out, acts.attention);
}

void Block::recompute_mlp(const LayerTensors& w, const Tensor& in, const MlpBuffers& mlp) const {
  if (swiglu_) {
    linear_forward(backend_, mlp.a, in, w[R::gate_weight], {});
    linear_forward(backend_, mlp.b, in, w[R::up_weight], {});
    backend_.swiglu_forward(mlp.out, mlp.a, mlp.b);
  } else {
    linear_forward(backend_, mlp.a, in, w[R::up_weight], w[R::up_bias]);
    backend_.gelu_forward(mlp.out, mlp.a);
  }
}

int64_t Block::mlp_tiles(int64_t rows) const {
  return ulysses::mlp_tiles(memory_, rows, model_config_.d_model, model_config_.d_ff,
                            swiglu_ ? 3 : 2);
}

void Block::mlp_forward(const LayerTensors& w, const Tensor& in, const Tensor& out,
                        const MlpBuffers& mlp) const {
  recompute_mlp(w, in, mlp);
  backend_.gemm(mlp.out, false, w[R::down_weight], true, out, 1.0f, 1.0f);
  if (!w[R::down_bias].empty()) backend_.bias_forward(out, w[R::down_bias]);
}

// Each gradient overwrites the value it is the gradient of, once nothing reads that value
// any more, so the MLP's backward needs no buffers of its own: the weight gradients that
// read an input come before the input gradient written over it.
void Block::mlp_backward(const LayerTensors& w, const LayerTensors& g, const Tensor& in,
                         const MlpBuffers& mlp, const Tensor& dout) const {
  backend_.gemm(dout, true, mlp.out, false, g[R::down_weight], 1.0f, 1.0f);
  if (!g[R::down_bias].empty()) backend_.bias_backward(g[R::down_bias], dout);
  backend_.gemm(dout, false, w[R::down_weight], false, mlp.out, 1.0f, 0.0f);  // d activation
  if (swiglu_) {
    backend_.swiglu_backward(mlp.a, mlp.b, mlp.out, mlp.a, mlp.b);  // d gate, d up
    backend_.gemm(mlp.a, true, in, false, g[R::gate_weight], 1.0f, 1.0f);
    backend_.gemm(mlp.b, true, in, false, g[R::up_weight], 1.0f, 1.0f);
    backend_.gemm(mlp.a, false, w[R::gate_weight], false, in, 1.0f, 0.0f);
    backend_.gemm(mlp.b, false, w[R::up_weight], false, in, 1.0f, 1.0f);
  } else {
    backend_.gelu_backward(mlp.out, mlp.out, mlp.a);  // d fc, over d activation
    backend_.gemm(mlp.out, true, in, false, g[R::up_weight], 1.0f, 1.0f);
    if (!g[R::up_bias].empty()) backend_.bias_backward(g[R::up_bias], mlp.out);
    backend_.gemm(mlp.out, false, w[R::up_weight], false, in, 1.0f, 0.0f);
  }
}

void Block::backward(const LayerTensors& w, const LayerTensors& g, const BlockShape& shape,
                     const Tensor& x, BlockActivations& acts, const Tensor& dresidual) const {
  const int64_t rows = shape.batch * shape.seq_local;
  Profiler& profiler = backend_.profiler();
  // MLP: dresidual is d(out); since mid feeds both the residual and norm2, d(mid) is
  // dresidual + the norm's backward of d(norm2 output).
  const int64_t tiles = mlp_tiles(rows);
  if (tiles == 1) {
    {
      Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0, 2.0 * mlp_flops(rows));
      mlp_backward(w, g, acts.norm2, {acts.ff_a, acts.ff_b, acts.ff_out}, dresidual);
    }
    norm_backward(dresidual, g[R::mlp_norm_weight], g[R::mlp_norm_bias], acts.norm2, acts.mid,
                  w[R::mlp_norm_weight], acts.mean2, acts.rstd2);
  } else {
    // Each tile's mid, norm2 and intermediates are recomputed from its rows of x and of the
    // attention output.
    const Tensor attn_out =
        acts.attn_out.tensor().reshape({rows, acts.attn_out.tensor().numel() / rows});
    const int64_t tile_rows = (rows + tiles - 1) / tiles;
    const MlpTile tile = allocate_mlp_tile(tile_rows, true);
    for (int64_t begin = 0; begin < rows; begin += tile_rows) {
      const int64_t end = std::min(rows, begin + tile_rows), count = end - begin;
      const Tensor mid = tile.mid.tensor().slice_rows(0, count);
      const Tensor norm2 = tile.norm.tensor().slice_rows(0, count);
      const Tensor mean2 =
          acts.mean2.empty() ? Tensor() : acts.mean2.tensor().flat_range(begin, count);
      const Tensor rstd2 = acts.rstd2.tensor().flat_range(begin, count);
      attention_residual(w, x.slice_rows(begin, end), attn_out.slice_rows(begin, end), mid);
      norm_forward(norm2, mean2, rstd2, mid, w[R::mlp_norm_weight], w[R::mlp_norm_bias]);
      {
        Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0,
                            3.0 * mlp_flops(count));
        const MlpBuffers buffers = tile.first(count);
        recompute_mlp(w, norm2, buffers);
        mlp_backward(w, g, norm2, buffers, dresidual.slice_rows(begin, end));
      }
      norm_backward(dresidual.slice_rows(begin, end), g[R::mlp_norm_weight], g[R::mlp_norm_bias],
                    norm2, mid, w[R::mlp_norm_weight], mean2, rstd2);
    }
  }

  // attention, then x feeds both the residual and norm1.
  Buffer made;  // norm1, when not kept
  const Tensor norm1 = attention_norm(w, x, acts, made);
  Buffer dnorm = backend_.alloc(MemCategory::workspace, backend_.compute_dtype(),
                                {rows, model_config_.d_model}, "d attention norm output");
  attention_backward(w, g, shape, norm1, acts, dresidual, dnorm);
  norm_backward(dresidual, g[R::attn_norm_weight], g[R::attn_norm_bias], dnorm, x,
                w[R::attn_norm_weight], acts.mean1, acts.rstd1);
}

void Block::attention_backward(const LayerTensors& w, const LayerTensors& g,
                               const BlockShape& shape, const Tensor& norm1, BlockActivations& acts,
                               const Tensor& dresidual, const Tensor& dnorm) const {
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const float theta = rope_ ? float(model_config_.rope_theta) : 0.0f;
  ulysses::attention_backward(
      backend_, attention_, {qkv_tensors(w, H * d, Hkv * d), shape, norm1, theta, overlap_},
      qkv_tensors(g, H * d, Hkv * d), {w[R::o_weight], g[R::o_weight], g[R::o_bias]}, acts.attn_out,
      acts.attention, dresidual, dnorm);
}

}  // namespace ulysses
