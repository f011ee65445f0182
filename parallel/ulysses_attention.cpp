#include "parallel/ulysses_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace ulysses {

namespace {

char* bytes_at(const Tensor& tensor, int64_t byte_offset) {
  return static_cast<char*>(tensor.data) + byte_offset;
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
  if (n_kv_heads % P != 0 && P % n_kv_heads != 0) {
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

void UlyssesAttention::check_heads(const Tensor& full, int64_t heads, const char* op) const {
  if (full.ndim != 4 || full.dim(1) % comm_.size() != 0 || full.dim(2) != heads ||
      full.dim(3) != head_dim_)
    throw std::invalid_argument(std::string("Ulysses attention: ") + op + ": " +
                                full.shape_string() + " is not [B, N, " + std::to_string(heads) +
                                ", " + std::to_string(head_dim_) + "] with N a multiple of sp " +
                                std::to_string(comm_.size()));
}

void UlyssesAttention::check_tokens(const Tensor& x, const char* op) const {
  if (x.ndim != 4 || x.dim(2) != n_heads_ || x.dim(3) != head_dim_)
    throw std::invalid_argument(std::string("Ulysses attention: ") + op + ": " + x.shape_string() +
                                " is not [B, Tl, " + std::to_string(n_heads_) + ", " +
                                std::to_string(head_dim_) + "]");
}

void UlyssesAttention::check_same_tokens(const Tensor& full, const Tensor& x,
                                         const char* op) const {
  if (full.dim(0) != x.dim(0) || full.dim(1) != x.dim(1) * comm_.size())
    throw std::invalid_argument(std::string("Ulysses attention: ") + op + ": " +
                                full.shape_string() + " does not hold the tokens of " +
                                x.shape_string() + " on each of sp " +
                                std::to_string(comm_.size()) + " ranks");
}

HeadExchange UlyssesAttention::open_exchange(DType dtype, int64_t batch, int64_t seq_local,
                                             int64_t heads, HeadExchange::Unpack unpack,
                                             const Tensor& target, Buffer send) {
  const int64_t P = comm_.size();
  HeadExchange exchange;
  exchange.unpack = unpack;
  exchange.heads = heads;
  exchange.target = target;
  exchange.send = send.empty() ? backend_.alloc(MemCategory::comm, dtype,
                                                {P, batch, seq_local, heads * head_dim_},
                                                "ulysses all-to-all send")
                               : std::move(send);
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

// tokens → heads: block p of the send buffer, this rank's tokens of rank p's heads, goes to
// rank p; full[b, i·Tl + t, :] = recv[i][b, t, :] (unpacked by finish).
HeadExchange UlyssesAttention::start_packed_to_heads(Buffer send, const Tensor& full) {
  check_heads(full, full.dim(2), "packed to heads");
  const int64_t P = comm_.size(), B = full.dim(0), Tl = full.dim(1) / P;
  if (send.tensor().numel() != full.numel() || send.tensor().dtype != full.dtype)
    throw std::invalid_argument("Ulysses attention: packed to heads: send " +
                                send.tensor().shape_string() + " does not hold " +
                                full.shape_string());
  HeadExchange exchange = open_exchange(full.dtype, B, Tl, full.dim(2),
                                        HeadExchange::Unpack::to_heads, full, std::move(send));
  issue(exchange);
  return exchange;
}

// stage → heads: pack_tokens gives block p rank p's stage heads of x, then as above.
HeadExchange UlyssesAttention::start_stage_to_heads(const Tensor& x, int stage,
                                                    const Tensor& full) {
  check_tokens(x, "stage to heads");
  check_heads(full, stage_q_heads(), "stage to heads");
  check_same_tokens(full, x, "stage to heads");
  HeadExchange exchange = open_exchange(x.dtype, x.dim(0), x.dim(1), stage_q_heads(),
                                        HeadExchange::Unpack::to_heads, full);
  std::vector<int> first;
  for (int p = 0; p < comm_.size(); ++p) first.push_back(stage_q_first(p, stage));
  pack_tokens(exchange, x, first);
  issue(exchange);
  return exchange;
}

// heads → tokens: pack_heads gives block i rank i's tokens; rank p's block lands on its
// stage heads of x (unpacked by finish).
HeadExchange UlyssesAttention::start_stage_to_tokens(const Tensor& full, int stage,
                                                     const Tensor& x) {
  check_tokens(x, "stage to tokens");
  check_heads(full, stage_q_heads(), "stage to tokens");
  check_same_tokens(full, x, "stage to tokens");
  HeadExchange exchange = open_exchange(x.dtype, x.dim(0), x.dim(1), stage_q_heads(),
                                        HeadExchange::Unpack::to_tokens, x);
  for (int p = 0; p < comm_.size(); ++p) exchange.first_heads.push_back(stage_q_first(p, stage));
  pack_heads(exchange, full);
  issue(exchange);
  return exchange;
}

HeadExchange UlyssesAttention::start_heads_to_packed(const Tensor& full, int64_t batch,
                                                     int64_t seq_local) {
  check_heads(full, full.dim(2), "heads to packed");
  if (full.dim(0) != batch || full.dim(1) != seq_local * comm_.size())
    throw std::invalid_argument("Ulysses attention: heads to packed: " + full.shape_string() +
                                " does not hold " + std::to_string(seq_local) +
                                " tokens of each of sp " + std::to_string(comm_.size()) + " ranks");
  HeadExchange exchange = open_exchange(full.dtype, batch, seq_local, full.dim(2),
                                        HeadExchange::Unpack::none, Tensor());
  pack_heads(exchange, full);
  issue(exchange);
  return exchange;
}

void UlyssesAttention::finish(HeadExchange& exchange) {
  if (!exchange.handle) return;  // never issued, or already finished
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
    const int64_t block_bytes = B * Tl * h * head_bytes;
    for (int p = 0; p < P; ++p)
      backend_.copy_2d(bytes_at(target, exchange.first_heads[size_t(p)] * head_bytes),
                       heads * head_bytes, bytes_at(blocks, p * block_bytes), h * head_bytes,
                       h * head_bytes, B * Tl);
  }
  exchange.recv.reset();
}

}  // namespace ulysses
