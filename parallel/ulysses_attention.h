// Ulysses sequence-parallel attention (docs/parallelism.md, "The layout transforms"): each rank of
// an SP group of P ranks holds Tl = N/P tokens of a sequence with all heads; an all-to-all turns
// that into all N tokens for H/P heads, the backend's local causal attention runs on them,
// and a second all-to-all turns the output back. Backward mirrors it.
#pragma once

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"
#include "parallel/head_chunks.h"
#include "parallel/ring_attention.h"

namespace ulysses {

// What attention keeps for backward. With sp == 1 the q/k/v/out views point at the caller's
// tensors (no copies); with sp > 1 they are owned head-split buffers [B, N, H/P, d]
// (k/v: [B, N, kv heads of this rank, d]). lse[B, H/P, N] is always owned.
struct AttentionState {
  Buffer q_owned, k_owned, v_owned, out_owned, lse;
  Tensor q, k, v, out;
};

// The backward's head-layout tensors while it runs (with sp = 1, dout views the caller's).
struct AttentionGradients {
  Buffer dout_owned, dq, dk, dv;
  Tensor dout;
};

// One all-to-all between the token layout [B, Tl, Hx, d] and the head layout [B, N, h, d],
// issued and not yet finished: the schedule may place work between start and finish.
struct HeadExchange {
  enum class Unpack {
    to_heads,   // into target[B, N, h, d]
    to_tokens,  // into target[B, Tl, Hx, d]: rank p's h heads from first_heads[p] on
    none,       // recv stays packed [P, B, Tl, h·d] (block p from rank p) for the caller
  };
  Buffer send, recv;
  Tensor target;
  Unpack unpack = Unpack::to_heads;
  int64_t heads = 0;             // h: heads of each rank's block
  std::vector<int> first_heads;  // to_tokens
  bool sum_replicas = false;     // to_tokens: ranks sharing a kv head send gradients to add
  double issued_at = 0;          // profiler time of the issue
  int64_t bytes = 0;             // sent by this rank to the others
  // Last, so that it is destroyed first: a dropped exchange waits before its buffers go.
  CommHandle handle;
};

class UlyssesAttention {
 public:
  // Throws std::invalid_argument unless P divides n_heads, n_kv_heads divides n_heads, and
  // either P divides n_kv_heads (kv heads are split like q heads) or n_kv_heads divides P
  // (each rank gets the one kv head its q heads read).
  // With head_chunks U (UPipe), attention may also run in U stages (below): U must divide the
  // heads per rank, and a stage's heads must cover whole groups of query heads per kv head or
  // lie inside one (valid_head_chunks).
  // With ring_comm (parallel.ring > 1), sp_comm is this rank's Ulysses group and the attention
  // of its heads runs as ring attention over the ring's groups (parallel/ring_attention.h).
  UlyssesAttention(Backend& backend, Comm& sp_comm, int n_heads, int n_kv_heads, int head_dim,
                   int head_chunks = 1, Comm* ring_comm = nullptr);

  // The attention of the heads this rank holds, over the tokens of its group: the backend's
  // causal attention, or ring attention. The contracts of Backend::attention_forward/backward;
  // documents hold the starts of whole sequences, in the sequence's own positions (under the
  // ring, those of all the ring's groups together).
  void local_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Documents& documents = {});
  void local_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                      const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const Documents& documents = {});

  // The schedule of attention over all heads (core/model/layers.cpp runs it; docs/design.md,
  // "One attention schedule"), in steps so that the caller places its work while the
  // all-to-alls travel (parallel.overlap) or waits for each at once. Shapes: q[B, Tl, H, d],
  // k/v[B, Tl, Hkv, d], this rank's Tl = N/P tokens with all heads; out[B, Tl, H, d].
  // Forward: check_forward; state reset; start_input for q, k and v, each finished before
  // finish_forward, which runs the attention of all N tokens and brings out back (state
  // keeps what the backward needs). documents: the starts of the whole sequences (every rank
  // holds them all), given to the attention over all N tokens as they are.
  // Backward: check_backward; start_backward of dout[B, Tl, H, d], finished; compute_backward;
  // start_gradient for dq[B, Tl, H, d], dk and dv[B, Tl, Hkv, d] (overwritten), each finished
  // before its target is read. With sp = 1 the exchanges are empty and finish does nothing.
  enum class Input { q, k, v };
  void check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) const;
  HeadExchange start_input(const Tensor& x, Input which, AttentionState& state);
  void finish_forward(const Tensor& out, AttentionState& state, const Documents& documents = {});
  void check_backward(const Tensor& dout, const AttentionState& state, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv) const;
  HeadExchange start_backward(const Tensor& dout, AttentionGradients& grads);
  void compute_backward(const AttentionState& state, AttentionGradients& grads, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv, const Documents& documents = {});
  HeadExchange start_gradient(Input which, AttentionGradients& grads, const Tensor& target);
  // Waits for an exchange and unpacks it into its target (with replicated kv heads, heads →
  // tokens sums the replicas' gradients).
  void finish(HeadExchange& exchange);

  // ---- head stages (UPipe, parallel.head_chunks = U) ----------------------------------
  // Stage s covers, for every rank p, the q heads [stage_q_first(p, s), + stage_q_heads())
  // and the kv heads they read, [stage_kv_first(p, s), + stage_kv_heads()); rank p runs
  // attention on them for all N tokens. A stage's q/k/v projections are computed straight
  // into a send buffer [P, B, Tl, n·d] whose block p holds rank p's heads.
  int head_chunks() const { return head_chunks_; }
  int stage_q_heads() const { return heads_per_rank_ / head_chunks_; }
  int stage_kv_heads() const;
  int stage_q_first(int p, int stage) const;
  int stage_kv_first(int p, int stage) const;
  // tokens → heads of a send buffer packed by the caller: full[B, N, n, d].
  HeadExchange start_packed_to_heads(Buffer send, const Tensor& full);
  // tokens → heads of stage s's q heads of x[B, Tl, H, d] (out or dout): full[B, N, n, d].
  HeadExchange start_stage_to_heads(const Tensor& x, int stage, const Tensor& full);
  // heads → tokens into stage s's q heads of x[B, Tl, H, d].
  HeadExchange start_stage_to_tokens(const Tensor& full, int stage, const Tensor& x);
  // heads → tokens left packed: finish() leaves recv [P, B, Tl, n·d] whose block p holds
  // this rank's tokens of rank p's heads (the layout the stage's projections used).
  HeadExchange start_heads_to_packed(const Tensor& full, int64_t batch, int64_t seq_local);

  int ranks() const { return comm_.size(); }
  int heads_per_rank() const { return heads_per_rank_; }
  // kv heads each rank holds during attention: Hkv/P when split, 1 when replicated.
  int kv_heads_per_rank() const { return kv_heads_per_rank_; }
  bool kv_replicated() const { return kv_replicated_; }

 private:
  // The two all-to-alls of the whole heads, issued:
  //   tokens → heads: x[B, Tl, Hx, d] → full[B, N, h, d], h = heads_per_rank() (kv:
  //   kv_heads_per_rank())
  //   heads → tokens: full[B, N, h, d] → x[B, Tl, Hx, d]
  HeadExchange start_tokens_to_heads(const Tensor& x, bool kv, const Tensor& full);
  HeadExchange start_heads_to_tokens(const Tensor& full, bool kv, const Tensor& x);
  // A new exchange with its send and receive buffers [P, batch, seq_local, heads·d].
  HeadExchange open_exchange(DType dtype, int64_t batch, int64_t seq_local, int64_t heads,
                             HeadExchange::Unpack unpack, const Tensor& target);
  // Packs rank p's `heads` heads of x[B, Tl, Hx, d], from first_heads[p] on, into block p.
  void pack_tokens(HeadExchange& exchange, const Tensor& x, const std::vector<int>& first_heads);
  // Packs full[B, N, h, d] by token slice: block i gets rank i's tokens.
  void pack_heads(HeadExchange& exchange, const Tensor& full);
  void issue(HeadExchange& exchange);
  // Both halves at once, where nothing is placed between them.
  void exchange_now(HeadExchange pending) { finish(pending); }
  // First head of x's head axis that rank p works on, for every p.
  std::vector<int> first_heads(bool kv) const;
  int first_head(int p, bool kv) const;
  void check_local(const Tensor& x, int heads, const char* what) const;

  Backend& backend_;
  Comm& comm_;
  int n_heads_, n_kv_heads_, head_dim_;
  int heads_per_rank_, kv_heads_per_rank_;
  bool kv_replicated_;
  int head_chunks_;
  std::unique_ptr<RingAttention> ring_;  // parallel.ring > 1
};

}  // namespace ulysses
