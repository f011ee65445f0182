#include "core/model/attention_schedule.h"

#include <functional>
#include <utility>
#include <vector>

namespace ulysses {

namespace {

// The sizes every step of the schedule reads.
struct Stages {
  Backend& backend;
  UlyssesAttention& attention;
  const AttentionInputs& in;
  int ranks;                  // P
  int count;                  // U
  int64_t batch, seq_local;   // B, Tl
  int64_t tokens;             // N = P·Tl
  int64_t rows;               // R = B·Tl
  int64_t head_dim;           // d
  int64_t q_heads, kv_heads;  // of one stage on one rank

  Buffer alloc(MemCategory category, std::initializer_list<int64_t> dims, const char* what) const {
    return backend.alloc(category, backend.compute_dtype(), dims, what);
  }
  // With one rank and one stage the attention writes the block's output in place.
  bool in_place() const { return ranks == 1 && count == 1; }
  // Stage s's lse [B, h/U, N].
  Tensor lse(const KeptAttention& kept, int stage) const {
    return kept.lse.tensor().slice_rows(stage, stage + 1).reshape({batch, q_heads, tokens});
  }
};

Stages stages_of(Backend& backend, UlyssesAttention& attention, const AttentionInputs& in) {
  const int P = attention.ranks();
  const int64_t d = in.weights.wq.dim(0) / (int64_t(attention.heads_per_rank()) * P);
  return {backend,
          attention,
          in,
          P,
          attention.head_chunks(),
          in.shape.batch,
          in.shape.seq_local,
          in.shape.seq_local * P,
          in.shape.batch * in.shape.seq_local,
          d,
          attention.stage_q_heads(),
          attention.stage_kv_heads()};
}

// One of a stage's projections: q, k or v, whose heads for rank p start at first_head(p).
struct StageProjection {
  const Tensor& weight;  // [heads_total·d, C]
  const Tensor& bias;    // [heads_total·d] or empty
  std::function<int(int)> first_head;
  int64_t heads;
  bool rope;
  const char* what;  // the head-layout buffer's name
};

enum class Qkv { q, k, v };

// Stage `stage`'s projection of q, k or v, from the weights or (weights = grads) their
// gradients.
StageProjection stage_projection(const Stages& s, const QkvTensors& weights, Qkv which, int stage) {
  const bool is_q = which == Qkv::q;
  std::function<int(int)> first = [&s, stage, is_q](int p) {
    return is_q ? s.attention.stage_q_first(p, stage) : s.attention.stage_kv_first(p, stage);
  };
  const bool rope = which != Qkv::v && s.in.rope_theta > 0.0f;
  if (is_q) return {weights.wq, weights.bq, first, s.q_heads, rope, "q (all tokens, stage heads)"};
  if (which == Qkv::k)
    return {weights.wk, weights.bk, first, s.kv_heads, rope, "k (all tokens, stage kv heads)"};
  return {weights.wv, weights.bv, first, s.kv_heads, rope, "v (all tokens, stage kv heads)"};
}

// Block p of packed[P, B, Tl, n·d] as [R, n·d].
Tensor block_of(const Stages& s, const Tensor& packed, int p, int64_t heads) {
  const int64_t width = heads * s.head_dim;
  return packed.flat_range(p * s.rows * width, s.rows * width).reshape({s.rows, width});
}

// packed block p = norm1 · W[rows of rank p's heads]ᵀ (+ bias), RoPE applied: this rank's
// tokens of the heads rank p attends to, in the token layout [B, Tl, n, d].
void project(const Stages& s, const StageProjection& projection, const Tensor& packed) {
  const int64_t n = projection.heads, d = s.head_dim;
  Profiler::Scope scope(
      s.backend.profiler(), phase::kQkvProjection, Profiler::Kind::compute, 0,
      2.0 * double(s.ranks) * double(s.rows) * double(s.in.norm1.dim(1)) * double(n * d));
  for (int p = 0; p < s.ranks; ++p) {
    const int64_t first = projection.first_head(p);
    const Tensor block = block_of(s, packed, p, n);
    const Tensor bias =
        projection.bias.empty() ? Tensor() : projection.bias.flat_range(first * d, n * d);
    linear_forward(s.backend, block, s.in.norm1,
                   projection.weight.slice_rows(first * d, (first + n) * d), bias);
    if (projection.rope)
      rope_at_positions(s.backend, block.reshape({s.batch, s.seq_local, n, d}), s.in.shape,
                        s.in.rope_theta, false);
  }
}

// The backward of project(): packed gradients (block p: this rank's tokens of rank p's heads)
// into dnorm (overwritten by the first write of the backward, then accumulated) and the
// weight rows and bias slices of those heads. Ranks that read one replicated kv head each
// return a part of its gradient: their blocks are summed first. Blocks whose heads follow one
// another (every rank's, with one stage) are brought into one token-layout buffer and go
// through one GEMM over their weight rows, so that dnorm sums over all their heads at once,
// as a single rank does; with more stages each block has its own.
void project_backward(const Stages& s, const StageProjection& projection, const Tensor& weight_grad,
                      const Tensor& bias_grad, const Tensor& packed, const Tensor& dnorm,
                      bool& dnorm_written) {
  const int64_t n = projection.heads, d = s.head_dim, width = n * d;
  const size_t element = dtype_size(packed.dtype);
  // Runs of blocks whose heads follow one another, each head's block once.
  std::vector<std::vector<int>> runs;
  int64_t heads_total = 0;
  for (int p = 0; p < s.ranks; ++p) {
    const int first = projection.first_head(p);
    const int last = runs.empty() ? -1 : runs.back().back();
    if (last >= 0 && first == projection.first_head(last)) {  // a replica of block last's head
      s.backend.axpy(block_of(s, packed, last, n), block_of(s, packed, p, n), 1.0f);
      continue;
    }
    heads_total += n;
    if (last >= 0 && first == projection.first_head(last) + n)
      runs.back().push_back(p);
    else
      runs.push_back({p});
  }
  Profiler::Scope scope(s.backend.profiler(), phase::kQkvProjection, Profiler::Kind::compute, 0,
                        4.0 * double(s.rows) * double(s.in.norm1.dim(1)) * double(heads_total * d));
  for (const std::vector<int>& run : runs) {
    const int64_t first = projection.first_head(run.front());
    const int64_t run_width = int64_t(run.size()) * width;
    Buffer gathered;  // the run's blocks side by side: [R, run heads · d]
    Tensor gradient = block_of(s, packed, run.front(), n);
    if (run.size() > 1) {
      gathered = s.alloc(MemCategory::workspace, {s.rows, run_width},
                         "projection gradients (this rank's tokens)");
      for (size_t j = 0; j < run.size(); ++j)
        s.backend.copy_2d(static_cast<char*>(gathered.tensor().data) + j * width * element,
                          int64_t(run_width * element), block_of(s, packed, run[j], n).data,
                          int64_t(width * element), int64_t(width * element), s.rows);
      gradient = gathered.tensor();
    }
    const int64_t heads = run_width / d;
    if (projection.rope)
      rope_at_positions(s.backend, gradient.reshape({s.batch, s.seq_local, heads, d}), s.in.shape,
                        s.in.rope_theta, true);
    const Tensor dbias = bias_grad.empty() ? Tensor() : bias_grad.flat_range(first * d, run_width);
    linear_backward(s.backend, dnorm, dnorm_written,
                    weight_grad.slice_rows(first * d, first * d + run_width), dbias, gradient,
                    s.in.norm1, projection.weight.slice_rows(first * d, first * d + run_width));
    dnorm_written = true;
  }
}

// A tensor on its way into the head layout [B, N, n, d]; with one rank, already there.
struct Incoming {
  Buffer heads;
  HeadExchange exchange;
};

// Issues the all-to-all of a packed send buffer (with one rank, the send buffer is the head
// layout itself); without overlap it is waited for at once.
Incoming to_heads(const Stages& s, Buffer send, int64_t heads, const char* what) {
  if (s.ranks == 1) return {std::move(send), HeadExchange()};
  Incoming incoming;
  incoming.heads = s.alloc(MemCategory::attention, {s.batch, s.tokens, heads, s.head_dim}, what);
  incoming.exchange = s.attention.start_packed_to_heads(std::move(send), incoming.heads);
  if (!s.in.overlap) s.attention.finish(incoming.exchange);
  return incoming;
}

// The buffer a stage's tensor is packed into by destination rank: the all-to-all's send
// buffer, or with one rank the head-layout tensor itself.
Buffer packed_buffer(const Stages& s, int64_t heads, const char* what) {
  if (s.ranks == 1)
    return s.alloc(MemCategory::attention, {s.batch, s.tokens, heads, s.head_dim}, what);
  return s.alloc(MemCategory::comm, {s.ranks, s.batch, s.seq_local, heads * s.head_dim},
                 "ulysses all-to-all send (packed by destination)");
}

Incoming project_to_heads(const Stages& s, const StageProjection& projection) {
  Buffer packed = packed_buffer(s, projection.heads, projection.what);
  project(s, projection, packed);
  return to_heads(s, std::move(packed), projection.heads, projection.what);
}

// A stage's q, k and v on their way to the head layout.
struct StageInFlight {
  Incoming q, k, v;
};

StageInFlight start_stage(const Stages& s, int stage) {
  const QkvTensors& w = s.in.weights;
  StageInFlight flight;
  flight.q = project_to_heads(s, stage_projection(s, w, Qkv::q, stage));
  flight.k = project_to_heads(s, stage_projection(s, w, Qkv::k, stage));
  flight.v = project_to_heads(s, stage_projection(s, w, Qkv::v, stage));
  return flight;
}

StageHeads finish_stage(const Stages& s, StageInFlight& flight) {
  for (Incoming* incoming : {&flight.q, &flight.k, &flight.v})
    s.attention.finish(incoming->exchange);
  return {std::move(flight.q.heads), std::move(flight.k.heads), std::move(flight.v.heads), {}};
}

// The gradient of stage s's attention output, packed like its q projection: block p =
// dresidual · o_weight[:, the columns of rank p's stage heads]. Columns that are not the whole
// weight are copied out first, one rank's at a time, so that the GEMM reads them whole.
Incoming output_gradient(const Stages& s, const Tensor& o_weight, const Tensor& dresidual,
                         int stage) {
  const int64_t n = s.q_heads, d = s.head_dim;
  const int64_t C = o_weight.dim(0), width = o_weight.dim(1);
  const size_t element = dtype_size(o_weight.dtype);
  Buffer packed = packed_buffer(s, n, "d out (all tokens, heads of this stage)");
  Buffer columns;
  if (n * d != width)
    columns = s.backend.alloc(MemCategory::comm, o_weight.dtype, {C, n * d},
                              "output projection columns (stage)");
  {
    Profiler::Scope scope(s.backend.profiler(), phase::kOutputProjection, Profiler::Kind::compute,
                          0, 2.0 * double(s.ranks) * double(s.rows) * double(C) * double(n * d));
    for (int p = 0; p < s.ranks; ++p) {
      const int64_t first = s.attention.stage_q_first(p, stage);
      if (!columns.empty())
        s.backend.copy_2d(columns.tensor().data, int64_t(n * d * element),
                          static_cast<const char*>(o_weight.data) + first * d * int64_t(element),
                          int64_t(width * element), int64_t(n * d * element), C);
      s.backend.gemm(dresidual, false, columns.empty() ? o_weight : columns.tensor(), false,
                     block_of(s, packed, p, n), 1.0f, 0.0f);
    }
  }
  return to_heads(s, std::move(packed), n, "d out (all tokens, heads of this stage)");
}

// A stage's gradient on its way back to this rank's tokens, packed by destination (block p:
// this rank's tokens of rank p's heads); with one rank the head layout is that already.
struct Outgoing {
  Buffer heads;
  HeadExchange exchange;
  Tensor packed() const { return heads.empty() ? exchange.recv.tensor() : heads.tensor(); }
};

Outgoing to_tokens(const Stages& s, Buffer heads) {
  if (s.ranks == 1) return {std::move(heads), HeadExchange()};
  Outgoing outgoing;
  outgoing.exchange = s.attention.start_heads_to_packed(heads, s.batch, s.seq_local);
  if (!s.in.overlap) s.attention.finish(outgoing.exchange);
  return outgoing;  // heads is freed: packed into the exchange's send buffer
}

double attention_flops(const Stages& s) {
  return 2.0 * double(s.batch) * double(s.q_heads) * double(s.tokens) * double(s.tokens) *
         double(s.head_dim);
}

}  // namespace

void attention_forward(Backend& backend, UlyssesAttention& attention, const AttentionInputs& in,
                       const Tensor& out, KeptAttention& kept) {
  const Stages s = stages_of(backend, attention, in);
  kept = KeptAttention();
  kept.lse = backend.alloc(MemCategory::attention, DType::f32,
                           {s.count, s.batch, s.q_heads, s.tokens}, "attention lse (every stage)");
  StageInFlight next = start_stage(s, 0);
  HeadExchange previous_out;  // overlap: the last stage's output on its way back
  for (int stage = 0; stage < s.count; ++stage) {
    StageHeads heads = finish_stage(s, next);
    if (in.overlap && stage + 1 < s.count) next = start_stage(s, stage + 1);
    if (!s.in_place())
      heads.out = s.alloc(MemCategory::attention, {s.batch, s.tokens, s.q_heads, s.head_dim},
                          "out (all tokens, heads of this stage)");
    {
      Profiler::Scope compute(backend.profiler(), phase::kAttentionForward, Profiler::Kind::compute,
                              0, attention_flops(s));
      attention.local_forward(s.in_place() ? out : heads.out.tensor(), s.lse(kept, stage), heads.q,
                              heads.k, heads.v, in.shape.documents);
    }
    attention.finish(previous_out);
    if (!s.in_place()) {
      HeadExchange back = attention.start_stage_to_tokens(heads.out, stage, out);
      if (in.overlap)
        previous_out = std::move(back);
      else
        attention.finish(back);
    }
    if (s.count == 1) kept.heads = std::move(heads);
    heads = StageHeads();  // more stages: the backward recomputes them
    if (!in.overlap && stage + 1 < s.count) next = start_stage(s, stage + 1);
  }
  attention.finish(previous_out);
}

void attention_backward(Backend& backend, UlyssesAttention& attention, const AttentionInputs& in,
                        const QkvTensors& grads, const OutputProjection& output, const Tensor& out,
                        KeptAttention& kept, const Tensor& dresidual, const Tensor& dnorm) {
  const Stages s = stages_of(backend, attention, in);
  const QkvTensors& w = in.weights;
  bool dnorm_written = false;
  for (int stage = 0; stage < s.count; ++stage) {
    // The stage's forward tensors: kept with one stage, else made again.
    StageHeads heads;
    StageInFlight flight;
    HeadExchange out_exchange;
    if (s.count == 1) {
      heads = std::move(kept.heads);
    } else {
      flight = start_stage(s, stage);
      heads.out = s.alloc(MemCategory::attention, {s.batch, s.tokens, s.q_heads, s.head_dim},
                          "out (all tokens, heads of this stage)");
      out_exchange = attention.start_stage_to_heads(out, stage, heads.out);
      if (!in.overlap) attention.finish(out_exchange);
    }
    Incoming dout = output_gradient(s, output.weight, dresidual, stage);
    if (stage == 0) {  // the output projection's weight gradient, while d(out) travels
      const int64_t width = output.weight.dim(1);
      Profiler::Scope projection(
          backend.profiler(), phase::kOutputProjection, Profiler::Kind::compute, 0,
          2.0 * double(s.rows) * double(width) * double(output.weight.dim(0)));
      backend.gemm(dresidual, true, out.reshape({s.rows, width}), false, output.weight_grad, 1.0f,
                   1.0f);
      if (!output.bias_grad.empty()) backend.bias_backward(output.bias_grad, dresidual);
    }
    if (s.count > 1) {
      StageHeads made = finish_stage(s, flight);
      heads.q = std::move(made.q);
      heads.k = std::move(made.k);
      heads.v = std::move(made.v);
    }
    attention.finish(out_exchange);
    attention.finish(dout.exchange);
    Buffer dq = s.alloc(MemCategory::attention, {s.batch, s.tokens, s.q_heads, s.head_dim},
                        "dq (all tokens, heads of this stage)");
    Buffer dk = s.alloc(MemCategory::attention, {s.batch, s.tokens, s.kv_heads, s.head_dim},
                        "dk (all tokens, kv heads of this stage)");
    Buffer dv = s.alloc(MemCategory::attention, {s.batch, s.tokens, s.kv_heads, s.head_dim},
                        "dv (all tokens, kv heads of this stage)");
    {
      Profiler::Scope compute(backend.profiler(), phase::kAttentionBackward,
                              Profiler::Kind::compute, 0, 2.5 * attention_flops(s));
      attention.local_backward(dq, dk, dv, dout.heads, heads.q, heads.k, heads.v,
                               s.in_place() ? out : heads.out.tensor(), s.lse(kept, stage),
                               in.shape.documents);
    }
    heads = StageHeads();
    dout = Incoming();
    // Back to this rank's tokens, left packed by destination for the projections' backward.
    Outgoing back[] = {to_tokens(s, std::move(dq)), to_tokens(s, std::move(dk)),
                       to_tokens(s, std::move(dv))};
    for (const Qkv which : {Qkv::q, Qkv::k, Qkv::v}) {
      Outgoing& gradient = back[int(which)];
      attention.finish(gradient.exchange);
      const StageProjection weight_grads = stage_projection(s, grads, which, stage);
      project_backward(s, stage_projection(s, w, which, stage), weight_grads.weight,
                       weight_grads.bias, gradient.packed(), dnorm, dnorm_written);
      gradient = Outgoing();
    }
  }
  kept = KeptAttention();
}

}  // namespace ulysses
