// Ring attention inside a Ulysses group (docs/parallelism.md, "Ulysses × ring"). With
// parallel.ring = R, the R Ulysses groups of an SP group each hold, after Ulysses'
// all-to-all, Ng = N/R contiguous tokens (chunks 2g and 2g+1 of 2R equal chunks) for their
// heads. Causal attention over all N tokens then runs around the ring of R ranks that hold the
// same heads:
//   1. zigzag: chunks move so that ring rank r owns chunks r and 2R−1−r, which gives every
//      rank the same causal work (the data loader, the layers and the loss keep the tokens in
//      their true order: only attention sees the zigzag);
//   2. K/V blocks travel the ring (non-blocking send/receive to the next rank while the block
//      in hand is computed); each block's partial output merges into the running one by
//      log-sum-exp in f32 (Backend::attention_block_forward);
//   3. backward: K/V travel again and the dK/dV of each block travel with them, each rank
//      adding its queries' share, until they reach their owner.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

class RingAttention {
 public:
  RingAttention(Backend& backend, Comm& ring_comm);

  // The contract of Backend::attention_forward over this group's tokens, with keys of the
  // whole sequence: q[B, Ng, h, d], k/v[B, Ng, hk, d], out[B, Ng, h, d], lse[B, h, Ng], the
  // group's tokens starting at position ring_rank · Ng. Ng must be even. documents: the
  // starts of the whole sequences of R·Ng tokens (kernels/documents.h), in those true
  // positions; each block masks by them at its chunks' true positions.
  void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
               const Tensor& v, const Documents& documents = {});
  // dq, dk, dv[B, Ng, ...] overwritten, as Backend::attention_backward.
  void backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& lse, const Documents& documents = {});

  int ranks() const { return comm_.size(); }

 private:
  // A token-major tensor seen as [outer, Ng, inner]: q/k/v/out are [B, Ng, h·d], lse is
  // [B·h, Ng, 1]. Its zigzag form is [2, outer, C, inner] (C = Ng/2): slot 0 holds chunk
  // ring_rank, slot 1 chunk 2R−1−ring_rank.
  struct TokenLayout {
    int64_t outer, tokens, inner;
  };
  // The chunk in slot s of ring rank r, and where chunk c lives in each layout.
  int chunk_of_slot(int r, int slot) const;
  int owner(int chunk) const;  // zigzag
  int slot_of(int chunk) const;
  // group layout → zigzag slots, and back: chunks that change rank move point to point.
  void to_zigzag(const Tensor& group, TokenLayout layout, const Tensor& zig);
  void from_zigzag(const Tensor& zig, TokenLayout layout, const Tensor& group);
  // Copies chunk half `half` of the group tensor to or from a contiguous [outer, C, inner].
  void copy_half(const Tensor& group, TokenLayout layout, int half, const Tensor& piece,
                 bool into_group);
  // Waits for a ring transfer, timed as the ring's p2p wait and its in-flight span.
  void wait(CommHandle& handle, double issued_at, int64_t bytes);

  Backend& backend_;
  Comm& comm_;
};

}  // namespace ulysses
