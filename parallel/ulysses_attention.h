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
  // Attention runs in head_chunks = U stages (below; U > 1 is UPipe): U must divide the heads
  // per rank, and a stage's heads must cover whole groups of query heads per kv head or lie
  // inside one (valid_head_chunks).
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

  // ---- the stages of the one schedule (core/model/attention_schedule.h) -------------------
  // Attention runs in U = parallel.head_chunks stages (U = 1: one stage of all the rank's
  // heads). Stage s covers, for every rank p, the q heads [stage_q_first(p, s),
  // + stage_q_heads()) and the kv heads they read, [stage_kv_first(p, s), + stage_kv_heads());
  // rank p runs attention on them for all N tokens. A stage's q/k/v projections are computed
  // straight into a send buffer [P, B, Tl, n·d] whose block p holds rank p's heads. Each
  // start_* issues one all-to-all and returns it unfinished; finish waits for it (the schedule
  // places work in between, or finishes at once).
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
  // Waits for an exchange and unpacks it into its target.
  void finish(HeadExchange& exchange);

  int ranks() const { return comm_.size(); }
  int heads_per_rank() const { return heads_per_rank_; }

 private:
  // A new exchange with its send and receive buffers [P, batch, seq_local, heads·d]; the send
  // buffer is the caller's when given (packed already).
  HeadExchange open_exchange(DType dtype, int64_t batch, int64_t seq_local, int64_t heads,
                             HeadExchange::Unpack unpack, const Tensor& target,
                             Buffer send = Buffer());
  // Packs rank p's `heads` heads of x[B, Tl, Hx, d], from first_heads[p] on, into block p.
  void pack_tokens(HeadExchange& exchange, const Tensor& x, const std::vector<int>& first_heads);
  // Packs full[B, N, h, d] by token slice: block i gets rank i's tokens.
  void pack_heads(HeadExchange& exchange, const Tensor& full);
  void issue(HeadExchange& exchange);
  // A tensor in the head layout of a stage: [B, N, n, d] with N a multiple of P.
  void check_heads(const Tensor& full, int64_t heads, const char* op) const;
  // A tensor in the token layout of all heads: [B, Tl, H, d].
  void check_tokens(const Tensor& x, const char* op) const;
  // full[B, N, n, d] holds the tokens of x[B, Tl, H, d] on every rank: N = P·Tl.
  void check_same_tokens(const Tensor& full, const Tensor& x, const char* op) const;

  Backend& backend_;
  Comm& comm_;
  int n_heads_, n_kv_heads_, head_dim_;
  int heads_per_rank_;
  int head_chunks_;
  std::unique_ptr<RingAttention> ring_;  // parallel.ring > 1
};

}  // namespace ulysses
