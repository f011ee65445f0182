#include "core/model/layers.h"

#include <algorithm>

#include "core/model/staged_attention.h"

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
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const DType dt = backend_.compute_dtype();
  auto act = [&](std::initializer_list<int64_t> dims, const char* what) {
    return backend_.alloc(MemCategory::activations, dt, dims, what);
  };
  auto att = [&](std::initializer_list<int64_t> dims, const char* what) {
    return backend_.alloc(MemCategory::attention, dt, dims, what);
  };
  auto stat = [&](const char* what) {
    return backend_.alloc(MemCategory::activations, DType::f32, {rows}, what);
  };
  BlockActivations acts;
  if (!checkpointing_) acts.norm1 = act({rows, C}, "attention norm output");
  acts.rstd1 = stat("attention norm rstd");
  if (staged()) {  // the lse of each stage, for its backward; q/k/v/out are recomputed
    acts.attention.lse =
        backend_.alloc(MemCategory::attention, DType::f32,
                       {attention_.head_chunks(), shape.batch, attention_.stage_q_heads(),
                        shape.seq_local * attention_.ranks()},
                       "attention lse (per head stage)");
  } else if (attention_.heads_per_rank() == H) {  // sp == 1: the attention state views these
    acts.q = att({shape.batch, shape.seq_local, H, d}, "q");
    acts.k = att({shape.batch, shape.seq_local, Hkv, d}, "k");
    acts.v = att({shape.batch, shape.seq_local, Hkv, d}, "v");
  }
  acts.attn_out = att({shape.batch, shape.seq_local, H, d}, "attention output");
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
  const int64_t rows = shape.batch * shape.seq_local;
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const QkvTensors qkv = qkv_tensors(w, H * d, Hkv * d);
  const float theta = float(model_config_.rope_theta);
  Profiler& profiler = backend_.profiler();
  if (staged()) {
    staged_attention_forward(backend_, attention_,
                             {qkv, shape, norm1, rope_ ? theta : 0.0f, overlap_}, acts.attn_out,
                             acts.attention.lse);
    return;
  }
  // With sp > 1 the local q, k, v are dead once sent: the attention keeps head-split copies.
  Buffer local_q, local_k, local_v;
  if (acts.q.empty()) {
    auto local = [&](int64_t heads, const char* what) {
      return backend_.alloc(MemCategory::workspace, backend_.compute_dtype(),
                            {shape.batch, shape.seq_local, heads, d}, what);
    };
    local_q = local(H, "q (this rank's tokens)");
    local_k = local(Hkv, "k (this rank's tokens)");
    local_v = local(Hkv, "v (this rank's tokens)");
  }
  const Tensor& q = acts.q.empty() ? local_q.tensor() : acts.q.tensor();
  const Tensor& k = acts.k.empty() ? local_k.tensor() : acts.k.tensor();
  const Tensor& v = acts.v.empty() ? local_v.tensor() : acts.v.tensor();
  // One schedule (docs/performance.md, "Async Ulysses"): each projection's all-to-all is
  // issued as soon as the projection is made; with parallel.overlap it travels while the
  // next projection computes and is waited for before the attention, without it at once.
  attention_.check_forward(q, k, v, acts.attn_out);
  acts.attention = AttentionState();
  using Input = UlyssesAttention::Input;
  auto project = [&](const Tensor& out, Input input, int64_t heads, const Tensor& weight,
                     const Tensor& bias, bool rope) {
    {
      Profiler::Scope projection(
          profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
          2.0 * double(rows) * double(model_config_.d_model) * double(heads * d));
      linear_forward(backend_, out.reshape({rows, heads * d}), norm1, weight, bias);
      if (rope) rope_at_positions(backend_, out, shape, theta, false);
    }
    HeadExchange exchange = attention_.start_input(out, input, acts.attention);
    if (!overlap_) attention_.finish(exchange);
    return exchange;
  };
  HeadExchange q_exchange = project(q, Input::q, H, qkv.wq, qkv.bq, rope_);
  HeadExchange k_exchange = project(k, Input::k, Hkv, qkv.wk, qkv.bk, rope_);
  HeadExchange v_exchange = project(v, Input::v, Hkv, qkv.wv, qkv.bv, false);
  attention_.finish(q_exchange);
  attention_.finish(k_exchange);
  attention_.finish(v_exchange);
  attention_.finish_forward(acts.attn_out, acts.attention, shape.documents);
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
  const int64_t rows = shape.batch * shape.seq_local;
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const QkvTensors qkv = qkv_tensors(w, H * d, Hkv * d);
  const QkvTensors dqkv = qkv_tensors(g, H * d, Hkv * d);
  const float theta = float(model_config_.rope_theta);
  Profiler& profiler = backend_.profiler();
  const Tensor attn_out = acts.attn_out.tensor().reshape({rows, H * d});
  const double o_flops = 2.0 * double(rows) * double(H * d) * double(model_config_.d_model);
  if (staged()) {
    // Each stage makes d(attention output) for its own heads (core/model/staged_attention.h).
    {
      Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                                 o_flops);
      backend_.gemm(dresidual, true, attn_out, false, g[R::o_weight], 1.0f, 1.0f);
      if (!g[R::o_bias].empty()) backend_.bias_backward(g[R::o_bias], dresidual);
    }
    staged_attention_backward(backend_, attention_,
                              {qkv, shape, norm1, rope_ ? theta : 0.0f, overlap_}, dqkv,
                              acts.attn_out, acts.attention.lse, dresidual, w[R::o_weight], dnorm);
    return;
  }
  auto scratch = [&](int64_t width, const char* what) {
    return backend_.alloc(MemCategory::workspace, backend_.compute_dtype(), {rows, width}, what);
  };
  Buffer dattn_buffer = scratch(H * d, "d attention output");
  const Tensor dattn = dattn_buffer.tensor().reshape({shape.batch, shape.seq_local, H, d});
  Buffer dq = scratch(H * d, "dq (this rank's tokens)");
  Buffer dk = scratch(Hkv * d, "dk (this rank's tokens)");
  Buffer dv = scratch(Hkv * d, "dv (this rank's tokens)");
  const Tensor dq_heads = dq.tensor().reshape({shape.batch, shape.seq_local, H, d});
  const Tensor dk_heads = dk.tensor().reshape({shape.batch, shape.seq_local, Hkv, d});
  const Tensor dv_heads = dv.tensor().reshape({shape.batch, shape.seq_local, Hkv, d});
  // One schedule, as the forward's: dO's all-to-all is issued once dO is made and, with
  // parallel.overlap, travels while the output projection's weight gradient is computed;
  // each of dq, dk, dv is waited for where its projection's backward needs it. Without
  // overlap every exchange is waited for as soon as it is issued.
  using Input = UlyssesAttention::Input;
  auto issued = [&](HeadExchange exchange) {
    if (!overlap_) attention_.finish(exchange);
    return exchange;
  };
  {
    Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                               o_flops);
    backend_.gemm(dresidual, false, w[R::o_weight], false, dattn_buffer, 1.0f, 0.0f);
  }
  attention_.check_backward(dattn, acts.attention, dq_heads, dk_heads, dv_heads);
  AttentionGradients grads;
  HeadExchange dout_exchange = issued(attention_.start_backward(dattn, grads));
  {
    Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                               o_flops);
    backend_.gemm(dresidual, true, attn_out, false, g[R::o_weight], 1.0f, 1.0f);
    if (!g[R::o_bias].empty()) backend_.bias_backward(g[R::o_bias], dresidual);
  }
  attention_.finish(dout_exchange);
  attention_.compute_backward(acts.attention, grads, dq_heads, dk_heads, dv_heads, shape.documents);
  HeadExchange dq_exchange = issued(attention_.start_gradient(Input::q, grads, dq_heads));
  HeadExchange dk_exchange = issued(attention_.start_gradient(Input::k, grads, dk_heads));
  HeadExchange dv_exchange = issued(attention_.start_gradient(Input::v, grads, dv_heads));
  auto project_backward = [&](HeadExchange& exchange, const Tensor& dx, int64_t heads,
                              bool accumulate, const Tensor& dweight, const Tensor& dbias,
                              const Tensor& weight, bool rope) {
    attention_.finish(exchange);
    if (rope) rope_at_positions(backend_, dx, shape, theta, true);
    Profiler::Scope projection(
        profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
        4.0 * double(rows) * double(model_config_.d_model) * double(heads * d));
    linear_backward(backend_, dnorm, accumulate, dweight, dbias, dx.reshape({rows, heads * d}),
                    norm1, weight);
  };
  project_backward(dq_exchange, dq_heads, H, false, dqkv.wq, dqkv.bq, qkv.wq, rope_);
  project_backward(dk_exchange, dk_heads, Hkv, true, dqkv.wk, dqkv.bk, qkv.wk, rope_);
  project_backward(dv_exchange, dv_heads, Hkv, true, dqkv.wv, dqkv.bv, qkv.wv, false);
}

}  // namespace ulysses
