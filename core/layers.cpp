#include "core/layers.h"

#include <algorithm>

#include "core/staged_attention.h"

namespace ulysses {

namespace {

using R = ParamRole;

}  // namespace

QkvTensors qkv_tensors(const LayerTensors& t, int64_t q_width, int64_t kv_width) {
  if (!t[R::q_weight].empty()) return {t[R::q_weight], t[R::k_weight], t[R::v_weight], {}, {}, {}};
  const Tensor& w = t[R::qkv_weight];
  const Tensor& b = t[R::qkv_bias];
  return {w.slice_rows(0, q_width),
          w.slice_rows(q_width, q_width + kv_width),
          w.slice_rows(q_width + kv_width, q_width + 2 * kv_width),
          b.flat_range(0, q_width),
          b.flat_range(q_width, kv_width),
          b.flat_range(q_width + kv_width, kv_width)};
}

LayerTensors layer_tensors(const ParamTable& table, const Tensor& window, int64_t window_begin,
                           int layer) {
  LayerTensors tensors;
  for (const ParamSpec& spec : table.specs())
    if (spec.layer == layer)
      tensors.by_role[size_t(spec.role)] = table.view(window, window_begin, spec);
  return tensors;
}

void linear_forward(Backend& backend, const Tensor& out, const Tensor& in, const Tensor& weight,
                    const Tensor& bias) {
  backend.gemm(in, false, weight, true, out, 1.0f, 0.0f);
  if (!bias.empty()) backend.bias_forward(out, bias);
}

void linear_backward(Backend& backend, const Tensor& din, bool accumulate_din,
                     const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight) {
  backend.gemm(dout, false, weight, false, din, 1.0f, accumulate_din ? 1.0f : 0.0f);
  backend.gemm(dout, true, in, false, dweight, 1.0f, 1.0f);
  if (!dbias.empty()) backend.bias_backward(dbias, dout);
}

Block::Block(const ModelConfig& model, const MemoryConfig& memory, bool overlap, Backend& backend,
             UlyssesAttention& attention)
    : model_config_(model),
      memory_(memory),
      overlap_(overlap),
      backend_(backend),
      attention_(attention),
      swiglu_(architecture(model.family).mlp == MlpKind::swiglu),
      rms_norm_(architecture(model.family).norm == NormKind::rms),
      rope_(architecture(model.family).positions == PositionKind::rope) {}

double Block::qkv_flops(int64_t rows) const {
  const double width =
      double(model_config_.n_heads + 2 * model_config_.n_kv_heads) * model_config_.head_dim();
  return 2.0 * double(rows) * double(model_config_.d_model) * width;
}

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
  acts.norm1 = act({rows, C}, "attention norm output");
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
  acts.mid = act({rows, C}, "residual after attention");
  acts.norm2 = act({rows, C}, "mlp norm output");
  acts.rstd2 = stat("mlp norm rstd");
  if (mlp_tiles(rows) == 1) {  // kept for the backward; tiles recompute them
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

BlockScratch Block::allocate_scratch(const BlockShape& shape) const {
  const int64_t rows = shape.batch * shape.seq_local, C = model_config_.d_model,
                F = model_config_.d_ff;
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const DType dt = backend_.compute_dtype();
  auto scratch = [&](std::initializer_list<int64_t> dims, const char* what) {
    return backend_.alloc(MemCategory::workspace, dt, dims, what);
  };
  BlockScratch s;
  s.dnorm = scratch({rows, C}, "d norm output");
  s.dattn = scratch({rows, H * d}, "d attention output");
  if (!staged()) {  // head stages project and reduce per stage instead
    s.q_or_dq = scratch({shape.batch, shape.seq_local, H, d}, "q or dq");
    s.k_or_dk = scratch({shape.batch, shape.seq_local, Hkv, d}, "k or dk");
    s.v_or_dv = scratch({shape.batch, shape.seq_local, Hkv, d}, "v or dv");
  }
  const int64_t tiles = mlp_tiles(rows), tile_rows = (rows + tiles - 1) / tiles;
  auto mlp = [&](const char* what) {
    return backend_.alloc(MemCategory::mlp, dt, {tile_rows, F}, what);
  };
  s.dff_a = mlp("d mlp a");
  s.dff_b = mlp("d mlp b");
  if (tiles > 1) {
    s.tile_a = mlp(swiglu_ ? "mlp gate (tile)" : "mlp fc (tile)");
    if (swiglu_) s.tile_b = mlp("mlp up (tile)");
    s.tile_out = mlp("mlp activation (tile)");
  }
  return s;
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
                    const Tensor& out, BlockActivations& acts, BlockScratch& scratch) const {
  forward_pass(w, shape, x, out, acts, scratch, true);
}

void Block::recompute(const LayerTensors& w, const BlockShape& shape, const Tensor& x,
                      const Tensor& out, BlockActivations& acts, BlockScratch& scratch) const {
  forward_pass(w, shape, x, out, acts, scratch,
               !mlp_recomputed_by_backward(shape.batch * shape.seq_local));
}

void Block::forward_pass(const LayerTensors& w, const BlockShape& shape, const Tensor& x,
                         const Tensor& out, BlockActivations& acts, BlockScratch& scratch,
                         bool with_mlp) const {
  const int64_t rows = shape.batch * shape.seq_local;
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const QkvTensors qkv = qkv_tensors(w, H * d, Hkv * d);
  const float theta = float(model_config_.rope_theta);

  // attention: x -> norm1 -> q, k, v -> (RoPE) -> Ulysses attention -> o_proj, + x
  Profiler& profiler = backend_.profiler();
  norm_forward(acts.norm1, acts.mean1, acts.rstd1, x, w[R::attn_norm_weight], w[R::attn_norm_bias]);
  if (staged()) {
    staged_attention_forward(backend_, attention_,
                             {qkv, shape, acts.norm1, rope_ ? theta : 0.0f, overlap_},
                             acts.attn_out, acts.attention.lse);
  } else if (overlap_) {
    // Async Ulysses: each projection's all-to-all travels while the next one computes.
    const Tensor& q = acts.q.empty() ? scratch.q_or_dq.tensor() : acts.q.tensor();
    const Tensor& k = acts.k.empty() ? scratch.k_or_dk.tensor() : acts.k.tensor();
    const Tensor& v = acts.v.empty() ? scratch.v_or_dv.tensor() : acts.v.tensor();
    attention_.check_forward(q, k, v, acts.attn_out);
    acts.attention = AttentionState();
    using Input = UlyssesAttention::Input;
    auto project = [&](const Tensor& out, int64_t heads, const Tensor& weight, const Tensor& bias,
                       bool rope) {
      Profiler::Scope projection(
          profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
          2.0 * double(rows) * double(model_config_.d_model) * double(heads * d));
      linear_forward(backend_, out.reshape({rows, heads * d}), acts.norm1, weight, bias);
      if (rope) backend_.rope(out, shape.pos_offset, theta, false);
    };
    project(q, H, qkv.wq, qkv.bq, rope_);
    HeadExchange q_exchange = attention_.start_input(q, Input::q, acts.attention);
    project(k, Hkv, qkv.wk, qkv.bk, rope_);
    HeadExchange k_exchange = attention_.start_input(k, Input::k, acts.attention);
    project(v, Hkv, qkv.wv, qkv.bv, false);
    HeadExchange v_exchange = attention_.start_input(v, Input::v, acts.attention);
    attention_.finish(q_exchange);
    attention_.finish(k_exchange);
    attention_.finish(v_exchange);
    attention_.finish_forward(acts.attn_out, acts.attention);
  } else {
    const Tensor& q = acts.q.empty() ? scratch.q_or_dq.tensor() : acts.q.tensor();
    const Tensor& k = acts.k.empty() ? scratch.k_or_dk.tensor() : acts.k.tensor();
    const Tensor& v = acts.v.empty() ? scratch.v_or_dv.tensor() : acts.v.tensor();
    {
      Profiler::Scope projection(profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
                                 qkv_flops(rows));
      linear_forward(backend_, q.reshape({rows, H * d}), acts.norm1, qkv.wq, qkv.bq);
      linear_forward(backend_, k.reshape({rows, Hkv * d}), acts.norm1, qkv.wk, qkv.bk);
      linear_forward(backend_, v.reshape({rows, Hkv * d}), acts.norm1, qkv.wv, qkv.bv);
    }
    if (rope_) {
      backend_.rope(q, shape.pos_offset, theta, false);
      backend_.rope(k, shape.pos_offset, theta, false);
    }
    attention_.forward(q, k, v, acts.attn_out, acts.attention);
  }
  backend_.copy(acts.mid, x);
  {
    Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                               2.0 * double(rows) * double(H * d) * double(model_config_.d_model));
    backend_.gemm(acts.attn_out.tensor().reshape({rows, H * d}), false, w[R::o_weight], true,
                  acts.mid, 1.0f, 1.0f);
    if (!w[R::o_bias].empty()) backend_.bias_forward(acts.mid, w[R::o_bias]);
  }

  // MLP: mid -> norm2 -> (gate, up -> swiglu | fc -> gelu) -> down, + mid
  norm_forward(acts.norm2, acts.mean2, acts.rstd2, acts.mid, w[R::mlp_norm_weight],
               w[R::mlp_norm_bias]);
  if (!with_mlp) return;
  backend_.copy(out, acts.mid);
  Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0, mlp_flops(rows));
  const int64_t tiles = mlp_tiles(rows);
  if (tiles == 1) {
    mlp_forward(w, acts.norm2, out, {acts.ff_a, acts.ff_b, acts.ff_out});
    return;
  }
  // memory.tiled_mlp: one tile of rows at a time; [rows, F] never exists.
  const int64_t tile_rows = (rows + tiles - 1) / tiles;
  for (int64_t begin = 0; begin < rows; begin += tile_rows) {
    const int64_t end = std::min(rows, begin + tile_rows);
    mlp_forward(w, acts.norm2.tensor().slice_rows(begin, end), out.slice_rows(begin, end),
                scratch_tile(scratch, end - begin));
  }
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

Block::MlpBuffers Block::scratch_tile(const BlockScratch& s, int64_t rows) const {
  auto first = [&](const Buffer& buffer) {
    return buffer.empty() ? Tensor() : buffer.tensor().slice_rows(0, rows);
  };
  return {first(s.tile_a), first(s.tile_b), first(s.tile_out)};
}

void Block::mlp_forward(const LayerTensors& w, const Tensor& in, const Tensor& out,
                        const MlpBuffers& mlp) const {
  recompute_mlp(w, in, mlp);
  backend_.gemm(mlp.out, false, w[R::down_weight], true, out, 1.0f, 1.0f);
  if (!w[R::down_bias].empty()) backend_.bias_forward(out, w[R::down_bias]);
}

// dout[r, C] is d(out) of these rows; din[r, C] (overwritten) the gradient of their MLP
// input; the weight gradients accumulate. d_a and d_b [r, F] are scratch.
void Block::mlp_backward(const LayerTensors& w, const LayerTensors& g, const Tensor& in,
                         const MlpBuffers& mlp, const Tensor& dout, const Tensor& din,
                         const Tensor& d_a, const Tensor& d_b) const {
  // The down projection's input gradient goes to d_b (SwiGLU) or d_a (GELU).
  const Tensor& d_act = swiglu_ ? d_b : d_a;
  linear_backward(backend_, d_act, false, g[R::down_weight], g[R::down_bias], dout, mlp.out,
                  w[R::down_weight]);
  if (swiglu_) {
    backend_.swiglu_backward(d_a, d_b, d_b, mlp.a, mlp.b);
    linear_backward(backend_, din, false, g[R::gate_weight], {}, d_a, in, w[R::gate_weight]);
    linear_backward(backend_, din, true, g[R::up_weight], {}, d_b, in, w[R::up_weight]);
  } else {
    backend_.gelu_backward(d_b, d_a, mlp.a);
    linear_backward(backend_, din, false, g[R::up_weight], g[R::up_bias], d_b, in, w[R::up_weight]);
  }
}

void Block::backward(const LayerTensors& w, const LayerTensors& g, const BlockShape& shape,
                     const Tensor& x, BlockActivations& acts, BlockScratch& s,
                     const Tensor& dresidual) const {
  const int64_t rows = shape.batch * shape.seq_local;
  const int64_t H = model_config_.n_heads, Hkv = model_config_.n_kv_heads,
                d = model_config_.head_dim();
  const QkvTensors qkv = qkv_tensors(w, H * d, Hkv * d);
  const QkvTensors dqkv = qkv_tensors(g, H * d, Hkv * d);
  const float theta = float(model_config_.rope_theta);

  Profiler& profiler = backend_.profiler();
  // MLP: dresidual is d(out); s.dnorm gets d(norm2 output).
  {
    const int64_t tiles = mlp_tiles(rows);
    Profiler::Scope mlp(profiler, phase::kMlp, Profiler::Kind::compute, 0,
                        (tiles > 1 ? 3.0 : 2.0) * mlp_flops(rows));
    if (tiles == 1) {
      mlp_backward(w, g, acts.norm2, {acts.ff_a, acts.ff_b, acts.ff_out}, dresidual, s.dnorm,
                   s.dff_a, s.dff_b);
    } else {
      // Each tile's intermediates are recomputed from its rows of norm2.
      const int64_t tile_rows = (rows + tiles - 1) / tiles;
      for (int64_t begin = 0; begin < rows; begin += tile_rows) {
        const int64_t end = std::min(rows, begin + tile_rows), count = end - begin;
        const Tensor in = acts.norm2.tensor().slice_rows(begin, end);
        const MlpBuffers tile = scratch_tile(s, count);
        recompute_mlp(w, in, tile);
        mlp_backward(w, g, in, tile, dresidual.slice_rows(begin, end),
                     s.dnorm.tensor().slice_rows(begin, end), s.dff_a.tensor().slice_rows(0, count),
                     s.dff_b.tensor().slice_rows(0, count));
      }
    }
  }
  // mid feeds both the residual and norm2: its gradient is dresidual + the norm's.
  norm_backward(dresidual, g[R::mlp_norm_weight], g[R::mlp_norm_bias], s.dnorm, acts.mid,
                w[R::mlp_norm_weight], acts.mean2, acts.rstd2);

  // attention
  const Tensor dattn = s.dattn.tensor().reshape({shape.batch, shape.seq_local, H, d});
  Buffer &dq = s.q_or_dq, &dk = s.k_or_dk, &dv = s.v_or_dv;
  const Tensor attn_out = acts.attn_out.tensor().reshape({rows, H * d});
  const double o_flops = 2.0 * double(rows) * double(H * d) * double(model_config_.d_model);
  if (overlap_ && !staged()) {
    // dO's all-to-all travels while the output projection's weight gradient is computed, and
    // each of dq, dk, dv is waited for only where its projection's backward needs it.
    using Input = UlyssesAttention::Input;
    AttentionGradients grads;
    HeadExchange dout_exchange;
    {
      Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                                 o_flops);
      backend_.gemm(dresidual, false, w[R::o_weight], false, s.dattn, 1.0f, 0.0f);
    }
    attention_.check_backward(dattn, acts.attention, dq, dk, dv);
    dout_exchange = attention_.start_backward(dattn, grads);
    {
      Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                                 o_flops);
      backend_.gemm(dresidual, true, attn_out, false, g[R::o_weight], 1.0f, 1.0f);
      if (!g[R::o_bias].empty()) backend_.bias_backward(g[R::o_bias], dresidual);
    }
    attention_.finish(dout_exchange);
    attention_.compute_backward(acts.attention, grads, dq, dk, dv);
    HeadExchange dq_exchange = attention_.start_gradient(Input::q, grads, dq);
    HeadExchange dk_exchange = attention_.start_gradient(Input::k, grads, dk);
    HeadExchange dv_exchange = attention_.start_gradient(Input::v, grads, dv);
    auto project_backward = [&](HeadExchange& exchange, const Tensor& dx, int64_t heads,
                                bool accumulate, const Tensor& dweight, const Tensor& dbias,
                                const Tensor& weight, bool rope) {
      attention_.finish(exchange);
      if (rope) backend_.rope(dx, shape.pos_offset, theta, true);
      Profiler::Scope projection(
          profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
          4.0 * double(rows) * double(model_config_.d_model) * double(heads * d));
      linear_backward(backend_, s.dnorm, accumulate, dweight, dbias, dx.reshape({rows, heads * d}),
                      acts.norm1, weight);
    };
    project_backward(dq_exchange, dq, H, false, dqkv.wq, dqkv.bq, qkv.wq, rope_);
    project_backward(dk_exchange, dk, Hkv, true, dqkv.wk, dqkv.bk, qkv.wk, rope_);
    project_backward(dv_exchange, dv, Hkv, true, dqkv.wv, dqkv.bv, qkv.wv, false);
  } else if (staged()) {
    {
      Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                                 2.0 * o_flops);
      linear_backward(backend_, s.dattn, false, g[R::o_weight], g[R::o_bias], dresidual, attn_out,
                      w[R::o_weight]);
    }
    staged_attention_backward(backend_, attention_,
                              {qkv, shape, acts.norm1, rope_ ? theta : 0.0f, overlap_}, dqkv,
                              acts.attn_out, acts.attention.lse, dattn, s.dnorm);
  } else {
    {
      Profiler::Scope projection(profiler, phase::kOutputProjection, Profiler::Kind::compute, 0,
                                 2.0 * o_flops);
      linear_backward(backend_, s.dattn, false, g[R::o_weight], g[R::o_bias], dresidual, attn_out,
                      w[R::o_weight]);
    }
    attention_.backward(dattn, acts.attention, dq, dk, dv);
    if (rope_) {
      backend_.rope(dq, shape.pos_offset, theta, true);
      backend_.rope(dk, shape.pos_offset, theta, true);
    }
    Profiler::Scope projection(profiler, phase::kQkvProjection, Profiler::Kind::compute, 0,
                               2.0 * qkv_flops(rows));
    linear_backward(backend_, s.dnorm, false, dqkv.wq, dqkv.bq, dq.tensor().reshape({rows, H * d}),
                    acts.norm1, qkv.wq);
    linear_backward(backend_, s.dnorm, true, dqkv.wk, dqkv.bk, dk.tensor().reshape({rows, Hkv * d}),
                    acts.norm1, qkv.wk);
    linear_backward(backend_, s.dnorm, true, dqkv.wv, dqkv.bv, dv.tensor().reshape({rows, Hkv * d}),
                    acts.norm1, qkv.wv);
  }
  norm_backward(dresidual, g[R::attn_norm_weight], g[R::attn_norm_bias], s.dnorm, x,
                w[R::attn_norm_weight], acts.mean1, acts.rstd1);
}

}  // namespace ulysses
