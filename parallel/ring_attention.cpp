#include "parallel/ring_attention.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/profiler.h"

namespace ulysses {

namespace {

char* bytes_at(const Tensor& tensor, int64_t byte_offset) {
  return static_cast<char*>(tensor.data) + byte_offset;
}

// Slot s of a zigzag tensor [slots, ...] as [rest...] with the given shape.
Tensor slot(const Tensor& zig, int64_t s, std::initializer_list<int64_t> dims) {
  return zig.slice_rows(s, s + 1).reshape(dims);
}

// Causal attention over `tokens` queries and keys of `heads` heads: the flops of a block of
// C × C (half of them under the diagonal).
double block_flops(int64_t batch, int64_t chunk, int64_t heads, int64_t head_dim, bool diagonal,
                   bool backward) {
  const double full = 4.0 * double(batch) * double(heads) * double(chunk) * double(chunk) *
                      double(head_dim) * (diagonal ? 0.5 : 1.0);
  return backward ? 2.5 * full : full;
}

// Whether packed documents hide every key of [key_first, key_last] from every query of
// [query_first, ...) of every sequence: the query chunk's first document starts after the key
// chunk's last key (later queries' documents start no earlier). Such a block is not computed.
bool documents_hide_block(const Documents& documents, int64_t query_first, int64_t key_last) {
  if (documents.none()) return false;
  for (const std::vector<int64_t>& starts : documents.starts)
    if (document_start(starts, query_first) <= key_last) return false;
  return true;
}

// Tags: chunk ids (< 2R) for the zigzag moves; the ring's K/V and dK/dV above them.
int kv_tag(int ring) {
  return 2 * ring;
}
int dkv_tag(int ring) {
  return 2 * ring + 1;
}

}  // namespace

RingAttention::RingAttention(Backend& backend, Comm& ring_comm)
    : backend_(backend), comm_(ring_comm) {}

int RingAttention::chunk_of_slot(int r, int s) const {
  return s == 0 ? r : 2 * comm_.size() - 1 - r;
}

int RingAttention::owner(int chunk) const {
  const int R = comm_.size();
  return chunk < R ? chunk : 2 * R - 1 - chunk;
}

int RingAttention::slot_of(int chunk) const {
  return chunk < comm_.size() ? 0 : 1;
}

void RingAttention::copy_half(const Tensor& group, TokenLayout layout, int half,
                              const Tensor& piece, bool into_group) {
  const int64_t element = int64_t(dtype_size(group.dtype));
  const int64_t C = layout.tokens / 2;
  const int64_t row_bytes = C * layout.inner * element;
  char* group_half = bytes_at(group, half * row_bytes);
  const int64_t group_pitch = layout.tokens * layout.inner * element;
  if (into_group)
    backend_.copy_2d(group_half, group_pitch, piece.data, row_bytes, row_bytes, layout.outer);
  else
    backend_.copy_2d(piece.data, row_bytes, group_half, group_pitch, row_bytes, layout.outer);
}

void RingAttention::wait(CommHandle& handle, double issued_at, int64_t bytes) {
  if (!handle) return;
  Profiler& profiler = backend_.profiler();
  {
    Profiler::Scope waiting(profiler, phase::kRingWait, Profiler::Kind::communication, bytes);
    handle->wait();
  }
  profiler.record_in_flight(phase::kRingInFlight, issued_at, profiler.now(), bytes);
  handle.reset();
}

// This rank holds chunks 2r and 2r+1 (halves 0 and 1 of the group tensor) and owns chunks r
// and 2R−1−r (slots 0 and 1): each held chunk goes to its owner, each owned one comes from
// its holder (rank c/2), tagged with the chunk.
void RingAttention::to_zigzag(const Tensor& group, TokenLayout layout, const Tensor& zig) {
  const int r = comm_.rank();
  const int64_t C = layout.tokens / 2;
  Buffer outgoing = backend_.alloc(MemCategory::comm, group.dtype,
                                   {2, layout.outer * C * layout.inner}, "ring zigzag send");
  std::vector<CommHandle> pending;
  const double issued_at = backend_.profiler().now();
  int64_t bytes = 0;
  for (int s = 0; s < 2; ++s) {
    const int chunk = chunk_of_slot(r, s);
    if (chunk / 2 != r)
      pending.push_back(
          comm_.send_recv_async(Tensor(), 0, zig.slice_rows(s, s + 1), chunk / 2, chunk));
  }
  for (int half = 0; half < 2; ++half) {
    const int chunk = 2 * r + half;
    const Tensor target = owner(chunk) == r ? zig.slice_rows(slot_of(chunk), slot_of(chunk) + 1)
                                            : outgoing.tensor().slice_rows(half, half + 1);
    {
      Profiler::Scope copies(backend_.profiler(), phase::kAllToAllCopies);
      copy_half(group, layout, half, target, false);
    }
    if (owner(chunk) != r) {
      pending.push_back(comm_.send_recv_async(target, owner(chunk), Tensor(), 0, chunk));
      bytes += int64_t(target.bytes());
    }
  }
  for (CommHandle& handle : pending) wait(handle, issued_at, bytes);
}

void RingAttention::from_zigzag(const Tensor& zig, TokenLayout layout, const Tensor& group) {
  const int r = comm_.rank();
  const int64_t C = layout.tokens / 2;
  Buffer incoming = backend_.alloc(MemCategory::comm, group.dtype,
                                   {2, layout.outer * C * layout.inner}, "ring zigzag receive");
  std::vector<CommHandle> pending;
  const double issued_at = backend_.profiler().now();
  int64_t bytes = 0;
  for (int half = 0; half < 2; ++half) {
    const int chunk = 2 * r + half;
    if (owner(chunk) != r)
      pending.push_back(comm_.send_recv_async(
          Tensor(), 0, incoming.tensor().slice_rows(half, half + 1), owner(chunk), chunk));
  }
  for (int s = 0; s < 2; ++s) {
    const int chunk = chunk_of_slot(r, s);
    const Tensor piece = zig.slice_rows(s, s + 1);
    if (chunk / 2 == r) {
      Profiler::Scope copies(backend_.profiler(), phase::kAllToAllCopies);
      copy_half(group, layout, chunk % 2, piece, true);
    } else {
      pending.push_back(comm_.send_recv_async(piece, chunk / 2, Tensor(), 0, chunk));
      bytes += int64_t(piece.bytes());
    }
  }
  for (CommHandle& handle : pending) wait(handle, issued_at, bytes);
  Profiler::Scope copies(backend_.profiler(), phase::kAllToAllCopies);
  for (int half = 0; half < 2; ++half)
    if (owner(2 * r + half) != r)
      copy_half(group, layout, half, incoming.tensor().slice_rows(half, half + 1), true);
}

// q[B, Ng, h, d], k/v[B, Ng, hk, d] → zigzag; then R steps: at step t this rank holds the
// K/V of ring rank src = r − t, sends them on to r + 1 and receives the next from r − 1 while
// it computes its two query chunks against src's two key chunks (kc < qc: the whole block,
// kc == qc: the causal diagonal, kc > qc: nothing visible). Chunk c holds true positions
// [c·C, (c+1)·C), so each block masks packed documents at those positions, and a block whose
// keys all lie before its queries' documents is skipped.
void RingAttention::forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Documents& documents) {
  const int R = comm_.size(), r = comm_.rank();
  const int64_t B = q.dim(0), Ng = q.dim(1), h = q.dim(2), d = q.dim(3), hk = k.dim(2);
  if (Ng % 2 != 0)
    throw std::invalid_argument("ring attention: " + std::to_string(Ng) +
                                " tokens per Ulysses group do not split into two equal chunks");
  const int64_t C = Ng / 2;
  const TokenLayout q_layout{B, Ng, h * d}, kv_layout{B, Ng, hk * d}, lse_layout{B * h, Ng, 1};
  Buffer zq = backend_.alloc(MemCategory::attention, q.dtype, {2, B, C, h * d}, "ring q (zigzag)");
  Buffer zout =
      backend_.alloc(MemCategory::attention, q.dtype, {2, B, C, h * d}, "ring out (zigzag)");
  Buffer zlse =
      backend_.alloc(MemCategory::attention, DType::f32, {2, B, h, C}, "ring lse (zigzag)");
  // K/V travel together: rows 0-1 the k slots, rows 2-3 the v slots.
  Buffer kv[2] = {
      backend_.alloc(MemCategory::attention, k.dtype, {4, B, C, hk * d}, "ring k/v in hand"),
      backend_.alloc(MemCategory::comm, k.dtype, {4, B, C, hk * d}, "ring k/v arriving")};
  to_zigzag(q, q_layout, zq);
  to_zigzag(k, kv_layout, kv[0].tensor().slice_rows(0, 2));
  to_zigzag(v, kv_layout, kv[0].tensor().slice_rows(2, 4));

  bool started[2] = {false, false};
  for (int t = 0; t < R; ++t) {
    const int src = (r - t + R) % R;
    const Tensor& here = kv[t % 2];
    CommHandle next;
    const double issued_at = backend_.profiler().now();
    if (t + 1 < R)
      next = comm_.send_recv_async(here, (r + 1) % R, kv[(t + 1) % 2], (r - 1 + R) % R, kv_tag(R));
    for (int qs = 0; qs < 2; ++qs) {
      const int qc = chunk_of_slot(r, qs);
      for (int ks = 0; ks < 2; ++ks) {
        const int kc = chunk_of_slot(src, ks);
        if (kc > qc || documents_hide_block(documents, qc * C, (kc + 1) * C - 1)) continue;
        Profiler::Scope compute(backend_.profiler(), phase::kAttentionForward,
                                Profiler::Kind::compute, 0,
                                block_flops(B, C, h, d, kc == qc, false));
        backend_.attention_block_forward(slot(zout, qs, {B, C, h, d}), slot(zlse, qs, {B, h, C}),
                                         slot(zq, qs, {B, C, h, d}), slot(here, ks, {B, C, hk, d}),
                                         slot(here, 2 + ks, {B, C, hk, d}), qc * C, kc * C,
                                         started[qs], documents);
        started[qs] = true;
      }
    }
    wait(next, issued_at, int64_t(here.bytes()));
  }
  from_zigzag(zout, q_layout, out);
  from_zigzag(zlse, lse_layout, lse);
}

// As forward, with the K/V of every block followed around the ring by its dK/dV (rows 0-1 dk,
// rows 2-3 dv), to which each rank adds its queries' share; after R steps each block's
// gradient has passed every rank and arrives back at its owner.
void RingAttention::backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const Documents& documents) {
  const int R = comm_.size(), r = comm_.rank();
  const int64_t B = q.dim(0), Ng = q.dim(1), h = q.dim(2), d = q.dim(3), hk = k.dim(2);
  const int64_t C = Ng / 2;
  const TokenLayout q_layout{B, Ng, h * d}, kv_layout{B, Ng, hk * d}, lse_layout{B * h, Ng, 1};
  auto query_sized = [&](const char* what) {
    return backend_.alloc(MemCategory::attention, q.dtype, {2, B, C, h * d}, what);
  };
  Buffer zq = query_sized("ring q (zigzag)"), zout = query_sized("ring out (zigzag)");
  Buffer zdout = query_sized("ring dout (zigzag)");
  Buffer zdq =
      backend_.alloc_zeroed(MemCategory::attention, q.dtype, {2, B, C, h * d}, "ring dq (zigzag)");
  Buffer zlse =
      backend_.alloc(MemCategory::attention, DType::f32, {2, B, h, C}, "ring lse (zigzag)");
  Buffer kv[2] = {
      backend_.alloc(MemCategory::attention, k.dtype, {4, B, C, hk * d}, "ring k/v in hand"),
      backend_.alloc(MemCategory::comm, k.dtype, {4, B, C, hk * d}, "ring k/v arriving")};
  Buffer dkv[2] = {
      backend_.alloc_zeroed(MemCategory::attention, k.dtype, {4, B, C, hk * d},
                            "ring dk/dv in hand"),
      backend_.alloc(MemCategory::comm, k.dtype, {4, B, C, hk * d}, "ring dk/dv arriving")};
  to_zigzag(q, q_layout, zq);
  to_zigzag(out, q_layout, zout);
  to_zigzag(dout, q_layout, zdout);
  to_zigzag(lse, lse_layout, zlse);
  to_zigzag(k, kv_layout, kv[0].tensor().slice_rows(0, 2));
  to_zigzag(v, kv_layout, kv[0].tensor().slice_rows(2, 4));

  CommHandle gradients;  // dK/dV of the previous step, travelling to the next rank
  double gradients_issued = 0;
  for (int t = 0; t < R; ++t) {
    const int src = (r - t + R) % R;
    const Tensor& here = kv[t % 2];
    const Tensor& grads = dkv[t % 2];
    CommHandle next;
    const double issued_at = backend_.profiler().now();
    if (t + 1 < R)
      next = comm_.send_recv_async(here, (r + 1) % R, kv[(t + 1) % 2], (r - 1 + R) % R, kv_tag(R));
    wait(gradients, gradients_issued, int64_t(grads.bytes()));
    for (int qs = 0; qs < 2; ++qs) {
      const int qc = chunk_of_slot(r, qs);
      for (int ks = 0; ks < 2; ++ks) {
        const int kc = chunk_of_slot(src, ks);
        if (kc > qc || documents_hide_block(documents, qc * C, (kc + 1) * C - 1)) continue;
        Profiler::Scope compute(backend_.profiler(), phase::kAttentionBackward,
                                Profiler::Kind::compute, 0,
                                block_flops(B, C, h, d, kc == qc, true));
        backend_.attention_block_backward(
            slot(zdq, qs, {B, C, h, d}), slot(grads, ks, {B, C, hk, d}),
            slot(grads, 2 + ks, {B, C, hk, d}), slot(zdout, qs, {B, C, h, d}),
            slot(zq, qs, {B, C, h, d}), slot(here, ks, {B, C, hk, d}),
            slot(here, 2 + ks, {B, C, hk, d}), slot(zout, qs, {B, C, h, d}),
            slot(zlse, qs, {B, h, C}), qc * C, kc * C, documents);
      }
    }
    gradients_issued = backend_.profiler().now();
    gradients =
        comm_.send_recv_async(grads, (r + 1) % R, dkv[(t + 1) % 2], (r - 1 + R) % R, dkv_tag(R));
    wait(next, issued_at, int64_t(here.bytes()));
  }
  const Tensor& own = dkv[R % 2];  // this rank's blocks, back from their last visit
  wait(gradients, gradients_issued, int64_t(own.bytes()));
  from_zigzag(zdq, q_layout, dq);
  from_zigzag(own.slice_rows(0, 2), kv_layout, dk);
  from_zigzag(own.slice_rows(2, 4), kv_layout, dv);
}

}  // namespace ulysses
