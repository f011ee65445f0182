#include "parallel/ulysses_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ulysses {

namespace {

char* bytes_at(const Tensor& tensor, int64_t byte_offset) {
  return static_cast<char*>(tensor.data) + byte_offset;
}

// Causal attention over N tokens for `heads` heads of dim d: QKᵀ and PV each 2·N²·d, halved
// by the mask; backward recomputes the scores and forms four products, 2.5× forward.
double attention_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                       bool backward) {
  const double forward =
      2.0 * double(batch) * double(heads) * double(tokens) * double(tokens) * double(head_dim);
  return backward ? 2.5 * forward : forward;
}

}  // namespace

UlyssesAttention::UlyssesAttention(Backend& backend, Comm& sp_comm, int n_heads, int n_kv_heads,
                                   int head_dim, int head_chunks, Comm* ring_comm)
    : backend_(backend),
      comm_(sp_comm),
      n_heads_(n_heads),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      head_chunks_(head_chunks) {
  const int P = comm_.size();
  const std::string numbers = "(heads " + std::to_string(n_heads) + ", kv heads " +
                              std::to_string(n_kv_heads) + ", sp " + std::to_string(P) + ")";
  if (n_heads < 1 || n_kv_heads < 1 || head_dim < 1)
    throw std::invalid_argument("Ulysses attention needs positive head counts and head_dim " +
                                numbers);
  if (n_heads % n_kv_heads != 0)
    throw std::invalid_argument("Ulysses attention: kv heads must divide heads " + numbers);
  if (n_heads % P != 0)
    throw std::invalid_argument("Ulysses attention: sp must divide the number of heads " + numbers);
  heads_per_rank_ = n_heads / P;
  if (n_kv_heads % P == 0) {
    kv_heads_per_rank_ = n_kv_heads / P;
    kv_replicated_ = false;
  } else if (P % n_kv_heads == 0) {
    kv_heads_per_rank_ = 1;
    kv_replicated_ = true;
  } else {
    throw std::invalid_argument(
        "Ulysses attention: kv heads must be divisible by sp (split) or divide sp "
        "(replicated) " +
        numbers);
  }
  const std::vector<int> valid = valid_head_chunks(n_heads, n_kv_heads, P);
  if (std::find(valid.begin(), valid.end(), head_chunks) == valid.end())
    throw std::invalid_argument("Ulysses attention: head_chunks " + std::to_string(head_chunks) +
                                " does not split the heads of each rank into whole stages " +
                                numbers);
  if (ring_comm && ring_comm->size() > 1)
    ring_ = std::make_unique<RingAttention>(backend, *ring_comm);
}

void UlyssesAttention::local_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Documents& documents) {
  if (ring_)
    ring_->forward(out, lse, q, k, v, documents);
  else
    backend_.attention_forward(out, lse, q, k, v, documents);
}

void UlyssesAttention::local_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                      const Tensor& dout, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& out, const Tensor& lse,
                                      const Documents& documents) {
  if (ring_)
    ring_->backward(dq, dk, dv, dout, q, k, v, out, lse, documents);
  else
    backend_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, documents);
}

int UlyssesAttention::stage_kv_heads() const {
  const int group = n_heads_ / n_kv_heads_;
  return std::max(1, stage_q_heads() / group);
}

int UlyssesAttention::stage_q_first(int p, int stage) const {
  return p * heads_per_rank_ + stage * stage_q_heads();
}

int UlyssesAttention::stage_kv_first(int p, int stage) const {
  return stage_q_first(p, stage) / (n_heads_ / n_kv_heads_);
}

int UlyssesAttention::first_head(int p, bool kv) const {
  if (!kv) return p * heads_per_rank_;
  if (!kv_replicated_) return p * kv_heads_per_rank_;
  // The kv head that rank p's q heads read (they all read the same one: H/P divides H/Hkv).
  return (p * heads_per_rank_) / (n_heads_ / n_kv_heads_);
}

std::vector<int> UlyssesAttention::first_heads(bool kv) const {
  std::vector<int> first;
  for (int p = 0; p < comm_.size(); ++p) first.push_back(first_head(p, kv));
  return first;
}

void UlyssesAttention::check_local(const Tensor& x, int heads, const char* what) const {
  if (x.ndim != 4 || x.dim(2) != heads || x.dim(3) != head_dim_)
    throw std::invalid_argument(std::string("Ulysses attention: ") + what + " is " +
                                x.shape_string() + ", expected [B, T, " + std::to_string(heads) +
                                ", " + std::to_string(head_dim_) + "]");
}

HeadExchange UlyssesAttention::open_exchange(DType dtype, int64_t batch, int64_t seq_local,
                                             int64_t heads, HeadExchange::Unpack unpack,
                                             const Tensor& target) {
  const int64_t P = comm_.size();
  HeadExchange exchange;
  exchange.unpack = unpack;
  exchange.heads = heads;
  exchange.target = target;
  exchange.send = backend_.alloc(MemCategory::comm, dtype, {P, batch, seq_local, heads * head_dim_},
                                 "ulysses all-to-all send");
  exchange.recv = backend_.alloc(MemCategory::comm, dtype, {P, batch, seq_local, heads * head_dim_},
                                 "ulysses all-to-all recv");
  exchange.bytes = int64_t(exchange.send.tensor().bytes()) / P * (P - 1);
  return exchange;
}

// send[p][b, t, :] = x[b, t, first_heads[p] : first_heads[p] + h, :]
void UlyssesAttention::pack_tokens(HeadExchange& exchange, const Tensor& x,
                                   const std::vector<int>& first) {
  const int64_t P = comm_.size(), B = x.dim(0), Tl = x.dim(1), heads = x.dim(2);
  const int64_t h = exchange.heads;
  const int64_t head_bytes = head_dim_ * int64_t(dtype_size(x.dtype));
  const int64_t block_bytes = B * Tl * h * head_bytes;  // one rank's share of the send buffer
  Profiler::Scope copies(backend_.profiler(), phase::kAllToAllCopies);
  for (int p = 0; p < P; ++p)
    backend_.copy_2d(bytes_at(exchange.send, p * block_bytes), h * head_bytes,
                     bytes_at(x, first[size_t(p)] * head_bytes), heads * head_bytes, h * head_bytes,
                     B * Tl);
}

// send[i][b, t, :] = full[b, i·Tl + t, :]
void UlyssesAttention::pack_heads(HeadExchange& exchange, const Tensor& full) {
  const int64_t P = comm_.size(), B = full.dim(0), N = full.dim(1), Tl = N / P;
  const int64_t h = exchange.heads;
  const int64_t head_bytes = head_dim_ * int64_t(dtype_size(full.dtype));
  const int64_t block_bytes = B * Tl * h * head_bytes;
  Profiler::Scope copies(backend_.profiler(), phase::kAllToAllCopies);
  for (int i = 0; i < P; ++i)
    backend_.copy_2d(bytes_at(exchange.send, i * block_bytes), Tl * h * head_bytes,
                     bytes_at(full, i * Tl * h * head_bytes), N * h * head_bytes,
                     Tl * h * head_bytes, B);
}

void UlyssesAttention::issue(HeadExchange& exchange) {
  exchange.issued_at = backend_.profiler().now();
  exchange.handle = comm_.all_to_all_async(exchange.send, exchange.recv);
}

// tokens → heads: x[B, Tl, Hx, d] → full[B, N, h, d], N = P·Tl, h heads per rank.
//   pack:   send[p][b, t, :] = x[b, t, first_head(p) : first_head(p) + h, :]
//   a2a:    recv[i] = rank i's send[me]
//   unpack: full[b, i·Tl + t, :] = recv[i][b, t, :]
HeadExchange UlyssesAttention::start_tokens_to_heads(const Tensor& x, bool kv, const Tensor& full) {
  HeadExchange exchange =
      open_exchange(x.dtype, x.dim(0), x.dim(1), kv ? kv_heads_per_rank_ : heads_per_rank_,
                    HeadExchange::Unpack::to_heads, full);
  pack_tokens(exchange, x, first_heads(kv));
  issue(exchange);
  return exchange;
}

// heads → tokens: full[B, N, h, d] → x[B, Tl, Hx, d], the inverse of tokens → heads:
//   pack:   send[i][b, t, :] = full[b, i·Tl + t, :]
//   a2a:    recv[p] = rank p's send[me]
//   unpack: x[b, t, first_head(p) : first_head(p) + h, :] = recv[p][b, t, :]
// With replicated kv heads, ranks p ∈ [g·r, (g+1)·r), r = P/Hkv, all return a gradient for kv
// head g: their blocks are summed into it (the sum a single rank forms over those q heads).
HeadExchange UlyssesAttention::start_heads_to_tokens(const Tensor& full, bool kv, const Tensor& x) {
  HeadExchange exchange =
      open_exchange(x.dtype, x.dim(0), x.dim(1), kv ? kv_heads_per_rank_ : heads_per_rank_,
                    HeadExchange::Unpack::to_tokens, x);
  exchange.first_heads = first_heads(kv);
  exchange.sum_replicas = kv && kv_replicated_;
  pack_heads(exchange, full);
  issue(exchange);
  return exchange;
}

HeadExchange UlyssesAttention::start_packed_to_heads(Buffer send, const Tensor& full) {
  const int64_t P = comm_.size(), B = full.dim(0), Tl = full.dim(1) / P;
  HeadExchange exchange =
      open_exchange(full.dtype, B, Tl, full.dim(2), HeadExchange::Unpack::to_heads, full);
  exchange.send = std::move(send);
  issue(exchange);
  return exchange;
}

HeadExchange UlyssesAttention::start_stage_to_heads(const Tensor& x, int stage,
                                                    const Tensor& full) {
  HeadExchange exchange = open_exchange(x.dtype, x.dim(0), x.dim(1), stage_q_heads(),
                                        HeadExchange::Unpack::to_heads, full);
  std::vector<int> first;
  for (int p = 0; p < comm_.size(); ++p) first.push_back(stage_q_first(p, stage));
  pack_tokens(exchange, x, first);
  issue(exchange);
  return exchange;
}

HeadExchange UlyssesAttention::start_stage_to_tokens(const Tensor& full, int stage,
                                                     const Tensor& x) {
  HeadExchange exchange = open_exchange(x.dtype, x.dim(0), x.dim(1), stage_q_heads(),
                                        HeadExchange::Unpack::to_tokens, x);
  for (int p = 0; p < comm_.size(); ++p) exchange.first_heads.push_back(stage_q_first(p, stage));
  pack_heads(exchange, full);
  issue(exchange);
  return exchange;
}

HeadExchange UlyssesAttention::start_heads_to_packed(const Tensor& full, int64_t batch,
                                                     int64_t seq_local) {
  HeadExchange exchange = open_exchange(full.dtype, batch, seq_local, full.dim(2),
                                        HeadExchange::Unpack::none, Tensor());
  pack_heads(exchange, full);
  issue(exchange);
  return exchange;
}

void UlyssesAttention::finish(HeadExchange& exchange) {
  if (!exchange.handle) return;  // nothing to exchange (sp = 1) or already finished
  Profiler& profiler = backend_.profiler();
  {
    Profiler::Scope wait(profiler, phase::kAllToAllWait, Profiler::Kind::communication,
                         exchange.bytes);
    exchange.handle->wait();
  }
  profiler.record_in_flight(phase::kAllToAllInFlight, exchange.issued_at, profiler.now(),
                            exchange.bytes);
  exchange.handle.reset();
  exchange.send.reset();
  if (exchange.unpack == HeadExchange::Unpack::none) return;

  Profiler::Scope copies(profiler, phase::kAllToAllCopies);
  const Tensor& blocks = exchange.recv.tensor();  // [P, B, Tl, h·d]
  const Tensor& target = exchange.target;
  const int64_t P = comm_.size(), h = exchange.heads;
  const int64_t head_bytes = head_dim_ * int64_t(dtype_size(blocks.dtype));
  if (exchange.unpack == HeadExchange::Unpack::to_heads) {
    const int64_t B = target.dim(0), N = target.dim(1), Tl = N / P;
    const int64_t block_bytes = B * Tl * h * head_bytes;
    for (int i = 0; i < P; ++i)
      backend_.copy_2d(bytes_at(target, i * Tl * h * head_bytes), N * h * head_bytes,
                       bytes_at(blocks, i * block_bytes), Tl * h * head_bytes, Tl * h * head_bytes,
                       B);
  } else {
    const int64_t B = target.dim(0), Tl = target.dim(1), heads = target.dim(2);
    const int ranks_per_head = exchange.sum_replicas ? int(P / n_kv_heads_) : 1;
    for (int p = 0; p < P; p += ranks_per_head) {
      Tensor block = blocks.slice_rows(p, p + 1);
      for (int j = 1; j < ranks_per_head; ++j)
        backend_.axpy(block, blocks.slice_rows(p + j, p + j + 1), 1.0f);
      backend_.copy_2d(bytes_at(target, exchange.first_heads[size_t(p)] * head_bytes),
                       heads * head_bytes, block.data, h * head_bytes, h * head_bytes, B * Tl);
    }
  }
  exchange.recv.reset();
}

void UlyssesAttention::check_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out) const {
  check_local(q, n_heads_, "q");
  check_local(k, n_kv_heads_, "k");
  check_local(v, n_kv_heads_, "v");
  check_local(out, n_heads_, "out");
  const int64_t B = q.dim(0), Tl = q.dim(1);
  for (const Tensor* x : {&k, &v, &out})
    if (x->dim(0) != B || x->dim(1) != Tl || x->dtype != q.dtype)
      throw std::invalid_argument("Ulysses attention: q " + q.shape_string() + ", k " +
                                  k.shape_string() + ", v " + v.shape_string() + " and out " +
                                  out.shape_string() + " disagree on B, T or dtype");
}

HeadExchange UlyssesAttention::start_input(const Tensor& x, Input which, AttentionState& state) {
  const bool kv = which != Input::q;
  check_local(x, kv ? n_kv_heads_ : n_heads_,
              which == Input::q   ? "q"
              : which == Input::k ? "k"
                                  : "v");
  Tensor& view = which == Input::q ? state.q : which == Input::k ? state.k : state.v;
  if (comm_.size() == 1) {  // attention reads the caller's tensor in place
    view = x;
    return HeadExchange();
  }
  const int64_t B = x.dim(0), N = x.dim(1) * comm_.size();
  const int64_t heads = kv ? kv_heads_per_rank_ : heads_per_rank_;
  Buffer& owned = which == Input::q   ? state.q_owned
                  : which == Input::k ? state.k_owned
                                      : state.v_owned;
  owned = backend_.alloc(MemCategory::attention, x.dtype, {B, N, heads, head_dim_},
                         which == Input::q   ? "ulysses q (all tokens, heads of this rank)"
                         : which == Input::k ? "ulysses k (all tokens, kv heads of this rank)"
                                             : "ulysses v (all tokens, kv heads of this rank)");
  view = owned;
  return start_tokens_to_heads(x, kv, owned);
}

void UlyssesAttention::finish_forward(const Tensor& out, AttentionState& state,
                                      const Documents& documents) {
  const int64_t B = out.dim(0), Tl = out.dim(1);
  if (comm_.size() == 1) {
    state.lse =
        backend_.alloc(MemCategory::attention, DType::f32, {B, n_heads_, Tl}, "attention lse");
    {
      Profiler::Scope compute(backend_.profiler(), phase::kAttentionForward,
                              Profiler::Kind::compute, 0,
                              attention_flops(B, Tl, n_heads_, head_dim_, false));
      local_forward(out, state.lse, state.q, state.k, state.v, documents);
    }
    state.out = out;
    return;
  }
  const int64_t N = Tl * comm_.size(), h = heads_per_rank_;
  state.out_owned = backend_.alloc(MemCategory::attention, out.dtype, {B, N, h, head_dim_},
                                   "ulysses out (all tokens, heads of this rank)");
  state.lse = backend_.alloc(MemCategory::attention, DType::f32, {B, h, N}, "attention lse");
  {
    Profiler::Scope compute(backend_.profiler(), phase::kAttentionForward, Profiler::Kind::compute,
                            0, attention_flops(B, N, h, head_dim_, false));
    local_forward(state.out_owned, state.lse, state.q, state.k, state.v, documents);
  }
  exchange_now(start_heads_to_tokens(state.out_owned, false, out));
  state.out = state.out_owned;
}

void UlyssesAttention::check_backward(const Tensor& dout, const AttentionState& state,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv) const {
  if (state.q.empty() || state.lse.empty())
    throw std::logic_error("Ulysses attention: backward without a forward state");
  check_local(dout, n_heads_, "dout");
  check_local(dq, n_heads_, "dq");
  check_local(dk, n_kv_heads_, "dk");
  check_local(dv, n_kv_heads_, "dv");
  const int64_t B = dout.dim(0), Tl = dout.dim(1);
  for (const Tensor* x : {&dq, &dk, &dv})
    if (x->dim(0) != B || x->dim(1) != Tl)
      throw std::invalid_argument("Ulysses attention: dout " + dout.shape_string() + ", dq " +
                                  dq.shape_string() + ", dk " + dk.shape_string() + " and dv " +
                                  dv.shape_string() + " disagree on B or T");
}

HeadExchange UlyssesAttention::start_backward(const Tensor& dout, AttentionGradients& grads) {
  grads = AttentionGradients();
  if (comm_.size() == 1) {
    grads.dout = dout;
    return HeadExchange();
  }
  const int64_t B = dout.dim(0), N = dout.dim(1) * comm_.size();
  grads.dout_owned =
      backend_.alloc(MemCategory::attention, dout.dtype, {B, N, heads_per_rank_, head_dim_},
                     "ulysses dout (all tokens, heads of this rank)");
  grads.dout = grads.dout_owned;
  return start_tokens_to_heads(dout, false, grads.dout_owned);
}

void UlyssesAttention::compute_backward(const AttentionState& state, AttentionGradients& grads,
                                        const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                        const Documents& documents) {
  const int64_t B = dq.dim(0), Tl = dq.dim(1);
  if (comm_.size() == 1) {
    Profiler::Scope compute(backend_.profiler(), phase::kAttentionBackward, Profiler::Kind::compute,
                            0, attention_flops(B, Tl, n_heads_, head_dim_, true));
    local_backward(dq, dk, dv, grads.dout, state.q, state.k, state.v, state.out, state.lse,
                   documents);
    return;
  }
  const int64_t N = Tl * comm_.size(), h = heads_per_rank_, hk = kv_heads_per_rank_;
  grads.dq = backend_.alloc(MemCategory::attention, dq.dtype, {B, N, h, head_dim_},
                            "ulysses dq (all tokens, heads of this rank)");
  grads.dk = backend_.alloc(MemCategory::attention, dk.dtype, {B, N, hk, head_dim_},
                            "ulysses dk (all tokens, kv heads of this rank)");
  grads.dv = backend_.alloc(MemCategory::attention, dv.dtype, {B, N, hk, head_dim_},
                            "ulysses dv (all tokens, kv heads of this rank)");
  {
    Profiler::Scope compute(backend_.profiler(), phase::kAttentionBackward, Profiler::Kind::compute,
                            0, attention_flops(B, N, h, head_dim_, true));
    local_backward(grads.dq, grads.dk, grads.dv, grads.dout, state.q, state.k, state.v, state.out,
                   state.lse, documents);
  }
  grads.dout_owned.reset();
}

HeadExchange UlyssesAttention::start_gradient(Input which, AttentionGradients& grads,
                                              const Tensor& target) {
  if (comm_.size() == 1) return HeadExchange();
  Buffer& full = which == Input::q ? grads.dq : which == Input::k ? grads.dk : grads.dv;
  HeadExchange exchange = start_heads_to_tokens(full, which != Input::q, target);
  full.reset();  // packed into the send buffer
  return exchange;
}

}  // namespace ulysses
