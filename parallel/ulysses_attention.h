// Ulysses sequence-parallel attention (docs/parallelism.md, DeepSpeed-Ulysses): each rank of an SP
// group of P ranks holds Tl = N/P tokens of a sequence with all heads; an all-to-all turns
// that into all N tokens for H/P heads, the backend's local causal attention runs on them,
// and a second all-to-all turns the output back. Backward mirrors it.
#pragma once

#include "kernels/backend.h"
#include "kernels/profiler.h"
#include "parallel/comm.h"

namespace ulysses {

// What attention keeps for backward. With sp == 1 the q/k/v/out views point at the caller's
// tensors (no copies); with sp > 1 they are owned head-split buffers [B, N, H/P, d]
// (k/v: [B, N, kv heads of this rank, d]). lse[B, H/P, N] is always owned.
struct AttentionState {
  Buffer q_owned, k_owned, v_owned, out_owned, lse;
  Tensor q, k, v, out;
};

// One all-to-all between the token layout [B, Tl, Hx, d] and the head layout [B, N, h, d],
// issued and not yet finished: the schedule may place work between start and finish.
struct HeadExchange {
  Buffer send, recv;
  Tensor target;         // what finish() fills
  bool kv = false;       // kv heads (k, v and their gradients) rather than q heads
  bool to_heads = true;  // tokens → heads, or back
  double issued_at = 0;  // profiler time of the issue
  int64_t bytes = 0;     // sent by this rank to the others
  // Last, so that it is destroyed first: a dropped exchange waits before its buffers go.
  CommHandle handle;
};

class UlyssesAttention {
 public:
  // Throws std::invalid_argument unless P divides n_heads, n_kv_heads divides n_heads, and
  // either P divides n_kv_heads (kv heads are split like q heads) or n_kv_heads divides P
  // (each rank gets the one kv head its q heads read).
  UlyssesAttention(Backend& backend, Comm& sp_comm, int n_heads, int n_kv_heads, int head_dim);

  // q[B, Tl, H, d], k/v[B, Tl, Hkv, d]: this rank's Tl = N/P tokens, all heads.
  // out[B, Tl, H, d] (caller-allocated). Fills state.
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               AttentionState& state);
  // dout[B, Tl, H, d] -> dq[B, Tl, H, d], dk/dv[B, Tl, Hkv, d] (overwritten).
  void backward(const Tensor& dout, const AttentionState& state, const Tensor& dq, const Tensor& dk,
                const Tensor& dv);

  // The two halves of each all-to-all. start_*: packs x (or full) into a send buffer and
  // issues the exchange; finish: waits for it and unpacks into the target (with replicated
  // kv heads, heads → tokens sums the replicas' gradients).
  //   tokens → heads: x[B, Tl, Hx, d] → full[B, N, h, d], h = heads_per_rank() (kv:
  //   kv_heads_per_rank()) heads → tokens: full[B, N, h, d] → x[B, Tl, Hx, d]
  HeadExchange start_tokens_to_heads(const Tensor& x, bool kv, const Tensor& full);
  HeadExchange start_heads_to_tokens(const Tensor& full, bool kv, const Tensor& x);
  void finish(HeadExchange& exchange);

  int heads_per_rank() const { return heads_per_rank_; }
  // kv heads each rank holds during attention: Hkv/P when split, 1 when replicated.
  int kv_heads_per_rank() const { return kv_heads_per_rank_; }
  bool kv_replicated() const { return kv_replicated_; }

 private:
  // A new exchange with its send and receive buffers [P, B, Tl, h·d] (B, Tl and the dtype
  // from local, the token-layout tensor), for the caller to pack; issue() starts it.
  HeadExchange open_exchange(const Tensor& local, bool kv, bool to_heads, const Tensor& target);
  void issue(HeadExchange& exchange);
  // Both halves at once, where nothing is placed between them.
  void exchange_now(HeadExchange pending) { finish(pending); }
  // First head of x's head axis that rank p works on.
  int first_head(int p, bool kv) const;
  void check_local(const Tensor& x, int heads, const char* what) const;

  Backend& backend_;
  Comm& comm_;
  int n_heads_, n_kv_heads_, head_dim_;
  int heads_per_rank_, kv_heads_per_rank_;
  bool kv_replicated_;
};

}  // namespace ulysses
