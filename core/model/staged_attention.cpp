#include "core/model/staged_attention.h"

#include <functional>
#include <utility>

namespace ulysses {

namespace {

// Which projection, and for rank p the first of the `heads` heads of a stage.
struct StageProjection {
  const Tensor& weight;  // [heads_total·d, C]
  const Tensor& bias;    // [heads_total·d] or empty
  std::function<int(int)> first_head;
  int64_t heads;
  bool rope;
};

int64_t head_dim(const QkvTensors& w, const UlyssesAttention& attention) {
  return w.wq.dim(0) / (int64_t(attention.heads_per_rank()) * attention.ranks());
}

// send[p] = norm1 · W[rows of heads first(p).. + n]ᵀ (+ bias), RoPE applied: the block of
// destination rank p in the token layout [B, Tl, n, d].
Buffer project(Backend& backend, const UlyssesAttention& attention, const StagedAttentionInputs& in,
               const StageProjection& projection, int64_t d) {
  const int P = attention.ranks();
  const int64_t B = in.shape.batch, Tl = in.shape.seq_local, rows = B * Tl, n = projection.heads;
  Buffer send = backend.alloc(MemCategory::comm, backend.compute_dtype(), {P, B, Tl, n * d},
                              "ulysses all-to-all send (stage projection)");
  Profiler::Scope scope(backend.profiler(), phase::kQkvProjection, Profiler::Kind::compute, 0,
                        2.0 * double(P) * double(rows) * double(in.norm1.dim(1)) * double(n * d));
  for (int p = 0; p < P; ++p) {
    const int64_t first = projection.first_head(p);
    Tensor block = send.tensor().flat_range(p * rows * n * d, rows * n * d).reshape({rows, n * d});
    const Tensor bias =
        projection.bias.empty() ? Tensor() : projection.bias.flat_range(first * d, n * d);
    linear_forward(backend, block, in.norm1,
                   projection.weight.slice_rows(first * d, (first + n) * d), bias);
    if (projection.rope)
      rope_at_positions(backend, block.reshape({B, Tl, n, d}), in.shape, in.rope_theta, false);
  }
  return send;
}

// The backward of project(): grads[P, B, Tl, n·d] (block p: this rank's tokens of rank p's
// heads) into dnorm (accumulated) and the weight rows and bias slice of those heads.
void project_backward(Backend& backend, const UlyssesAttention& attention,
                      const StagedAttentionInputs& in, const StageProjection& projection,
                      const Tensor& weight_grad, const Tensor& bias_grad, const Tensor& grads,
                      const Tensor& dnorm, int64_t d) {
  const int P = attention.ranks();
  const int64_t B = in.shape.batch, Tl = in.shape.seq_local, rows = B * Tl, n = projection.heads;
  Profiler::Scope scope(backend.profiler(), phase::kQkvProjection, Profiler::Kind::compute, 0,
                        4.0 * double(P) * double(rows) * double(in.norm1.dim(1)) * double(n * d));
  for (int p = 0; p < P; ++p) {
    const int64_t first = projection.first_head(p);
    Tensor block = grads.flat_range(p * rows * n * d, rows * n * d).reshape({rows, n * d});
    if (projection.rope)
      rope_at_positions(backend, block.reshape({B, Tl, n, d}), in.shape, in.rope_theta, true);
    const Tensor dbias = bias_grad.empty() ? Tensor() : bias_grad.flat_range(first * d, n * d);
    linear_backward(backend, dnorm, true, weight_grad.slice_rows(first * d, (first + n) * d), dbias,
                    block, in.norm1, projection.weight.slice_rows(first * d, (first + n) * d));
  }
}

// q, k and v of one stage in the head layout, all N tokens.
struct StageHeads {
  Buffer q, k, v;
};

// A stage's q, k and v on their way to the head layout.
struct StageInFlight {
  StageHeads heads;
  HeadExchange q, k, v;
};

StageInFlight start_stage(Backend& backend, UlyssesAttention& attention,
                          const StagedAttentionInputs& in, int stage, int64_t d) {
  const int P = attention.ranks();
  const int64_t B = in.shape.batch, N = in.shape.seq_local * P;
  const int64_t hs = attention.stage_q_heads(), ks = attention.stage_kv_heads();
  const bool rope = in.rope_theta > 0.0f;
  const QkvTensors& w = in.weights;
  auto q_first = [&](int p) { return attention.stage_q_first(p, stage); };
  auto kv_first = [&](int p) { return attention.stage_kv_first(p, stage); };
  StageInFlight flight;
  StageHeads& heads = flight.heads;
  const DType dt = backend.compute_dtype();
  heads.q = backend.alloc(MemCategory::attention, dt, {B, N, hs, d}, "stage q (all tokens)");
  flight.q = attention.start_packed_to_heads(
      project(backend, attention, in, {w.wq, w.bq, q_first, hs, rope}, d), heads.q);
  heads.k = backend.alloc(MemCategory::attention, dt, {B, N, ks, d}, "stage k (all tokens)");
  flight.k = attention.start_packed_to_heads(
      project(backend, attention, in, {w.wk, w.bk, kv_first, ks, rope}, d), heads.k);
  heads.v = backend.alloc(MemCategory::attention, dt, {B, N, ks, d}, "stage v (all tokens)");
  flight.v = attention.start_packed_to_heads(
      project(backend, attention, in, {w.wv, w.bv, kv_first, ks, false}, d), heads.v);
  return flight;
}

StageHeads finish_stage(UlyssesAttention& attention, StageInFlight& flight) {
  attention.finish(flight.q);
  attention.finish(flight.k);
  attention.finish(flight.v);
  return std::move(flight.heads);
}

StageHeads project_and_exchange(Backend& backend, UlyssesAttention& attention,
                                const StagedAttentionInputs& in, int stage, int64_t d) {
  StageInFlight flight = start_stage(backend, attention, in, stage, d);
  return finish_stage(attention, flight);
}

// The gradient of stage s's attention output, in the layout of a stage's q projection:
// block p = dresidual · o_weight[:, the columns of rank p's stage heads]. Those columns are
// copied out of o_weight [C, H·d] first, one rank's at a time, so the GEMM reads them whole.
Buffer stage_output_gradient(Backend& backend, const UlyssesAttention& attention,
                             const StagedAttentionInputs& in, const Tensor& dresidual,
                             const Tensor& o_weight, int stage, int64_t d) {
  const int P = attention.ranks();
  const int64_t rows = in.shape.batch * in.shape.seq_local, n = attention.stage_q_heads();
  const int64_t C = o_weight.dim(0), width = o_weight.dim(1);
  const size_t element = dtype_size(o_weight.dtype);
  Buffer send = backend.alloc(MemCategory::comm, backend.compute_dtype(),
                              {P, in.shape.batch, in.shape.seq_local, n * d},
                              "ulysses all-to-all send (stage d output)");
  Buffer columns = backend.alloc(MemCategory::comm, o_weight.dtype, {C, n * d},
                                 "output projection columns (stage)");
  Profiler::Scope scope(backend.profiler(), phase::kOutputProjection, Profiler::Kind::compute, 0,
                        2.0 * double(P) * double(rows) * double(C) * double(n * d));
  for (int p = 0; p < P; ++p) {
    const int64_t first = attention.stage_q_first(p, stage);
    backend.copy_2d(columns.tensor().data, int64_t(n * d * element),
                    static_cast<const char*>(o_weight.data) + first * d * int64_t(element),
                    int64_t(width * element), int64_t(n * d * element), C);
    backend.gemm(dresidual, false, columns, false,
                 send.tensor().flat_range(p * rows * n * d, rows * n * d).reshape({rows, n * d}),
                 1.0f, 0.0f);
  }
  return send;
}

double stage_attention_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t d) {
  return 2.0 * double(batch) * double(heads) * double(tokens) * double(tokens) * double(d);
}

}  // namespace

void staged_attention_forward(Backend& backend, UlyssesAttention& attention,
                              const StagedAttentionInputs& in, const Tensor& out,
                              const Tensor& lse) {
  const int64_t d = head_dim(in.weights, attention);
  const int64_t B = in.shape.batch, N = in.shape.seq_local * attention.ranks();
  const int64_t hs = attention.stage_q_heads();
  const int chunks = attention.head_chunks();
  StageInFlight next = start_stage(backend, attention, in, 0, d);
  HeadExchange previous_out;  // overlap: the last stage's output on its way back
  for (int stage = 0; stage < chunks; ++stage) {
    StageHeads heads = finish_stage(attention, next);
    // With overlap the next stage is projected and sent while this one's attention runs.
    if (in.overlap && stage + 1 < chunks) next = start_stage(backend, attention, in, stage + 1, d);
    Buffer stage_out = backend.alloc(MemCategory::attention, backend.compute_dtype(), {B, N, hs, d},
                                     "stage out (all tokens)");
    {
      Profiler::Scope compute(backend.profiler(), phase::kAttentionForward, Profiler::Kind::compute,
                              0, stage_attention_flops(B, N, hs, d));
      attention.local_forward(stage_out, lse.slice_rows(stage, stage + 1).reshape({B, hs, N}),
                              heads.q, heads.k, heads.v, in.shape.documents);
    }
    heads = StageHeads();
    attention.finish(previous_out);
    HeadExchange back = attention.start_stage_to_tokens(stage_out, stage, out);
    stage_out.reset();  // packed into the exchange's send buffer
    if (in.overlap) {
      previous_out = std::move(back);
    } else {
      attention.finish(back);
      if (stage + 1 < chunks) next = start_stage(backend, attention, in, stage + 1, d);
    }
  }
  attention.finish(previous_out);
}

void staged_attention_backward(Backend& backend, UlyssesAttention& attention,
                               const StagedAttentionInputs& in, const QkvTensors& grads,
                               const Tensor& out, const Tensor& lse, const Tensor& dresidual,
                               const Tensor& o_weight, const Tensor& dnorm) {
  const int64_t d = head_dim(in.weights, attention);
  const int P = attention.ranks();
  const int64_t B = in.shape.batch, Tl = in.shape.seq_local, N = Tl * P;
  const int64_t hs = attention.stage_q_heads(), ks = attention.stage_kv_heads();
  const bool rope = in.rope_theta > 0.0f;
  const QkvTensors& w = in.weights;
  const DType dt = backend.compute_dtype();
  backend.fill_zero(dnorm);
  for (int stage = 0; stage < attention.head_chunks(); ++stage) {
    auto q_first = [&](int p) { return attention.stage_q_first(p, stage); };
    auto kv_first = [&](int p) { return attention.stage_kv_first(p, stage); };
    // The stage's forward tensors, recomputed rather than kept.
    StageHeads heads = project_and_exchange(backend, attention, in, stage, d);
    Buffer stage_out =
        backend.alloc(MemCategory::attention, dt, {B, N, hs, d}, "stage out (all tokens)");
    HeadExchange o = attention.start_stage_to_heads(out, stage, stage_out);
    Buffer stage_dout =
        backend.alloc(MemCategory::attention, dt, {B, N, hs, d}, "stage dout (all tokens)");
    HeadExchange g = attention.start_packed_to_heads(
        stage_output_gradient(backend, attention, in, dresidual, o_weight, stage, d), stage_dout);
    attention.finish(o);
    attention.finish(g);
    Buffer dq = backend.alloc(MemCategory::attention, dt, {B, N, hs, d}, "stage dq (all tokens)");
    Buffer dk = backend.alloc(MemCategory::attention, dt, {B, N, ks, d}, "stage dk (all tokens)");
    Buffer dv = backend.alloc(MemCategory::attention, dt, {B, N, ks, d}, "stage dv (all tokens)");
    {
      Profiler::Scope compute(backend.profiler(), phase::kAttentionBackward,
                              Profiler::Kind::compute, 0, 2.5 * stage_attention_flops(B, N, hs, d));
      attention.local_backward(dq, dk, dv, stage_dout, heads.q, heads.k, heads.v, stage_out,
                               lse.slice_rows(stage, stage + 1).reshape({B, hs, N}),
                               in.shape.documents);
    }
    heads = StageHeads();
    stage_out.reset();
    stage_dout.reset();
    // Back to this rank's tokens, left in the projections' layout: one block per rank.
    HeadExchange dq_back = attention.start_heads_to_packed(dq, B, Tl);
    HeadExchange dk_back = attention.start_heads_to_packed(dk, B, Tl);
    HeadExchange dv_back = attention.start_heads_to_packed(dv, B, Tl);
    dq.reset();
    dk.reset();
    dv.reset();
    attention.finish(dq_back);
    project_backward(backend, attention, in, {w.wq, w.bq, q_first, hs, rope}, grads.wq, grads.bq,
                     dq_back.recv, dnorm, d);
    dq_back.recv.reset();
    attention.finish(dk_back);
    project_backward(backend, attention, in, {w.wk, w.bk, kv_first, ks, rope}, grads.wk, grads.bk,
                     dk_back.recv, dnorm, d);
    dk_back.recv.reset();
    attention.finish(dv_back);
    project_backward(backend, attention, in, {w.wv, w.bv, kv_first, ks, false}, grads.wv, grads.bv,
                     dv_back.recv, dnorm, d);
  }
}

}  // namespace ulysses
