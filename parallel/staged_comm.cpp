#include "parallel/staged_comm.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <utility>

#include "kernels/stopwatch.h"
#include "parallel/comm_checks.h"

namespace ulysses {

namespace {

// New blocks are rounded up to this, so that slightly different sizes reuse one block.
constexpr size_t kBlockGranule = size_t(1) << 20;

}  // namespace

// ---- StagingPool ---------------------------------------------------------------------------

StagingPool::~StagingPool() {
  for (Block& block : blocks_) backend_.host_staging_free(block.data);
}

void* StagingPool::acquire(size_t bytes) {
  Block* best = nullptr;
  for (Block& block : blocks_)
    if (!block.in_use && block.bytes >= bytes && (!best || block.bytes < best->bytes))
      best = &block;
  if (best) {
    best->in_use = true;
    return best->data;
  }
  // Free blocks too small for this request would only be outgrown again: give them back.
  std::erase_if(blocks_, [&](const Block& block) {
    if (block.in_use) return false;
    backend_.host_staging_free(block.data);
    return true;
  });
  const size_t rounded =
      (std::max(bytes, size_t(1)) + kBlockGranule - 1) / kBlockGranule * kBlockGranule;
  blocks_.push_back({backend_.host_staging_alloc(rounded), rounded, true});
  return blocks_.back().data;
}

void StagingPool::release(void* data) {
  for (Block& block : blocks_)
    if (block.data == data) block.in_use = false;
}

size_t StagingPool::held_bytes() const {
  size_t total = 0;
  for (const Block& block : blocks_) total += block.bytes;
  return total;
}

// ---- Request -------------------------------------------------------------------------------

class StagedComm::Request final : public CommRequest {
 public:
  Request(StagedComm& comm, std::vector<Staged> staged, std::vector<Tensor> host,
          double CommStats::*seconds, const Stopwatch& clock)
      : comm_(comm),
        staged_(std::move(staged)),
        host_(std::move(host)),
        seconds_(seconds),
        clock_(clock) {}
  ~Request() override { wait_unless_done(); }

  // After the host operation failed to start: nothing to wait for or upload.
  void abandon() {
    mark_done();
    for (const Tensor& view : host_) comm_.pool_.release(view.data);
  }

  CommHandle host_handle;  // the host operation

 private:
  void complete() override {
    std::exception_ptr failure;
    try {
      host_handle->wait();
      for (size_t i = 0; i < staged_.size(); ++i)
        if (staged_[i].upload) comm_.backend_.upload(staged_[i].device, host_[i].data);
    } catch (...) {
      failure = std::current_exception();
    }
    for (const Tensor& view : host_) comm_.pool_.release(view.data);
    comm_.stats_.*seconds_ += clock_.seconds();
    if (failure) std::rethrow_exception(failure);
  }

  StagedComm& comm_;
  std::vector<Staged> staged_;
  std::vector<Tensor> host_;  // staging views, one per staged tensor
  double CommStats::*seconds_;
  Stopwatch clock_;  // started at issue, before the downloads
};

// An all-to-all in pieces: piece j holds the same slice [offset, offset + count) of every
// rank's block, staged through host blocks of its own. All pieces are issued at once, each
// right after its copy to the host, so that piece j travels while piece j+1 is copied; wait()
// copies each piece back as soon as it has arrived, while the later ones still travel.
class StagedComm::PipelinedAllToAll final : public CommRequest {
 public:
  struct Piece {
    int64_t offset = 0, count = 0;  // elements of each rank's block
    void* send = nullptr;           // host [P, count]
    void* recv = nullptr;
    CommHandle handle;
  };

  PipelinedAllToAll(StagedComm& comm, const Tensor& recv, int64_t block)
      : comm_(comm), recv_(recv), block_(block) {}
  ~PipelinedAllToAll() override { wait_unless_done(); }

  void add(Piece piece) { pieces_.push_back(std::move(piece)); }

 private:
  void complete() override {
    std::exception_ptr failure;
    const int64_t element = int64_t(dtype_size(recv_.dtype));
    for (Piece& piece : pieces_) {
      try {
        if (!failure && piece.handle) {
          piece.handle->wait();
          for (int p = 0; p < comm_.size(); ++p)
            comm_.backend_.upload(recv_.flat_range(p * block_ + piece.offset, piece.count),
                                  static_cast<char*>(piece.recv) + p * piece.count * element);
        }
      } catch (...) {
        failure = std::current_exception();
      }
      piece.handle.reset();  // a piece left in flight by a failure waits here
      comm_.pool_.release(piece.send);
      comm_.pool_.release(piece.recv);
    }
    comm_.stats_.all_to_all_seconds += clock_.seconds();
    if (failure) std::rethrow_exception(failure);
  }

  StagedComm& comm_;
  Tensor recv_;
  int64_t block_;
  Stopwatch clock_;
  std::vector<Piece> pieces_;
};

// ---- StagedComm ----------------------------------------------------------------------------

void StagedComm::set_pipeline(int pieces, int64_t min_piece_bytes) {
  if (pieces < 1 || min_piece_bytes < 1)
    throw std::invalid_argument("StagedComm: pipeline of " + std::to_string(pieces) +
                                " pieces of at least " + std::to_string(min_piece_bytes) +
                                " bytes");
  pipeline_pieces_ = pieces;
  min_piece_bytes_ = min_piece_bytes;
}

StagedComm::StagedComm(std::unique_ptr<Comm> host_comm, Backend& backend)
    : host_(std::move(host_comm)), backend_(backend), pool_(backend) {
  set_watchdog(host_->watchdog());  // its waits are the host communicator's
}

StagedComm::~StagedComm() = default;

template <typename HostOp>
std::unique_ptr<StagedComm::Request> StagedComm::issue(std::vector<Staged> staged,
                                                       double CommStats::*seconds, HostOp host_op) {
  const Stopwatch clock;
  std::vector<Tensor> host;
  try {
    for (const Staged& entry : staged) {
      Tensor view = entry.device;
      view.data = pool_.acquire(entry.device.bytes());
      host.push_back(view);
      if (entry.download) backend_.download(view.data, entry.device);
    }
  } catch (...) {
    for (const Tensor& view : host) pool_.release(view.data);
    throw;
  }
  auto request = std::make_unique<Request>(*this, std::move(staged), host, seconds, clock);
  const CommStats before = host_->stats();
  try {
    request->host_handle = host_op(host);
  } catch (...) {
    request->abandon();
    throw;
  }
  // The bytes and calls of the host operation; its seconds are counted by wait(), copies included.
  CommStats sent = host_->stats() - before;
  sent.all_to_all_seconds = sent.reduce_seconds = sent.gather_seconds = sent.p2p_seconds = 0.0;
  stats_ += sent;
  return request;
}

CommHandle StagedComm::all_to_all_async(const Tensor& send, const Tensor& recv) {
  check_all_to_all_args(*this, send, recv);
  const int P = size();
  const int64_t block = send.numel() / P, element = int64_t(dtype_size(send.dtype));
  const int64_t pieces = std::min<int64_t>(pipeline_pieces_, block * element / min_piece_bytes_);
  if (pieces >= 2) {
    const int64_t piece_elements = (block + pieces - 1) / pieces;
    auto request = std::make_unique<PipelinedAllToAll>(*this, recv, block);
    const CommStats before = host_->stats();
    for (int64_t offset = 0; offset < block; offset += piece_elements) {
      PipelinedAllToAll::Piece piece;
      piece.offset = offset;
      piece.count = std::min(piece_elements, block - offset);
      const size_t bytes = size_t(P * piece.count * element);
      piece.send = pool_.acquire(bytes);
      piece.recv = pool_.acquire(bytes);
      for (int p = 0; p < P; ++p)
        backend_.download(static_cast<char*>(piece.send) + p * piece.count * element,
                          send.flat_range(p * block + offset, piece.count));
      const Tensor host_send(piece.send, send.dtype, {int64_t(P), piece.count});
      const Tensor host_recv(piece.recv, send.dtype, {int64_t(P), piece.count});
      piece.handle = host_->all_to_all_async(host_send, host_recv);
      request->add(std::move(piece));
    }
    // One exchange as callers count it, however many pieces it travelled in.
    stats_.all_to_all_bytes += host_->stats().all_to_all_bytes - before.all_to_all_bytes;
    stats_.calls += 1;
    return request;
  }
  return issue(
      {{send, true, false}, {recv, false, true}}, &CommStats::all_to_all_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_to_all_async(host[0], host[1]); });
}

CommHandle StagedComm::all_reduce_async(const Tensor& data, ReduceOp op) {
  return issue(
      {{data, true, true}}, &CommStats::reduce_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_reduce_async(host[0], op); });
}

// Host values go straight through host_comm; what it counts is counted here too.
void StagedComm::all_reduce_host(double* values, int count, ReduceOp op) {
  const CommStats before = host_->stats();
  host_->all_reduce_host(values, count, op);
  stats_ += host_->stats() - before;
}

CommHandle StagedComm::reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_reduce_scatter_args(*this, send, recv);
  return issue({{send, true, false}, {recv, false, true}}, &CommStats::reduce_seconds,
               [&](const std::vector<Tensor>& host) {
                 return host_->reduce_scatter_async(host[0], host[1], op);
               });
}

CommHandle StagedComm::all_gather_async(const Tensor& send, const Tensor& recv) {
  check_all_gather_args(*this, send, recv);
  return issue(
      {{send, true, false}, {recv, false, true}}, &CommStats::gather_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_gather_async(host[0], host[1]); });
}

// Either side may be empty (ring attention's zigzag moves send or receive only): only the
// tensors that travel are staged.
CommHandle StagedComm::send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                                       int tag) {
  check_send_recv_args(*this, send, dest, recv, source, tag);
  const bool sending = send.numel() > 0, receiving = recv.numel() > 0;
  std::vector<Staged> staged;
  if (sending) staged.push_back({send, true, false});
  if (receiving) staged.push_back({recv, false, true});
  return issue(std::move(staged), &CommStats::p2p_seconds, [&](const std::vector<Tensor>& host) {
    return host_->send_recv_async(sending ? host[0] : Tensor(), dest,
                                  receiving ? host.back() : Tensor(), source, tag);
  });
}

void StagedComm::broadcast_host(void* data, int64_t bytes, int root) {
  const CommStats before = host_->stats();
  host_->broadcast_host(data, bytes, root);
  stats_ += host_->stats() - before;
}

void StagedComm::barrier() {
  const CommStats before = host_->stats();
  host_->barrier();
  stats_ += host_->stats() - before;
}

std::unique_ptr<Comm> StagedComm::split(int color, int key, const std::string& name) {
  return std::make_unique<StagedComm>(host_->split(color, key, name), backend_);
}

void StagedComm::abort(int exit_code) {
  host_->abort(exit_code);
  std::abort();  // not reached: the host communicator's abort ends the process
}

}  // namespace ulysses
