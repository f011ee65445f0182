#include "parallel/staged_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <utility>

#include "parallel/comm_checks.h"

namespace ulysses {

namespace {

using Clock = std::chrono::steady_clock;

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
          double CommStats::*seconds, Clock::time_point start)
      : comm_(comm),
        staged_(std::move(staged)),
        host_(std::move(host)),
        seconds_(seconds),
        start_(start) {}

  // A collective cannot be abandoned, so a handle dropped without wait() waits.
  ~Request() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }

  void wait() override {
    if (done_) return;
    done_ = true;
    std::exception_ptr failure;
    try {
      if (host_handle) host_handle->wait();
      for (size_t i = 0; i < staged_.size(); ++i)
        if (staged_[i].upload) comm_.backend_.upload(staged_[i].device, host_[i].data);
    } catch (...) {
      failure = std::current_exception();
    }
    for (const Tensor& view : host_) comm_.pool_.release(view.data);
    comm_.stats_.*seconds_ += std::chrono::duration<double>(Clock::now() - start_).count();
    if (failure) std::rethrow_exception(failure);
  }

  // After the host operation failed to start: nothing to wait for or upload.
  void abandon() {
    done_ = true;
    for (const Tensor& view : host_) comm_.pool_.release(view.data);
  }

  CommHandle host_handle;  // the host operation, when it is non-blocking

 private:
  StagedComm& comm_;
  std::vector<Staged> staged_;
  std::vector<Tensor> host_;  // staging views, one per staged tensor
  double CommStats::*seconds_;
  Clock::time_point start_;
  bool done_ = false;
};

// ---- StagedComm ----------------------------------------------------------------------------

StagedComm::StagedComm(std::unique_ptr<Comm> host_comm, Backend& backend)
    : host_(std::move(host_comm)), backend_(backend), pool_(backend) {
  set_watchdog(host_->watchdog());  // its waits are the host communicator's
}

StagedComm::~StagedComm() = default;

template <typename HostOp>
std::unique_ptr<StagedComm::Request> StagedComm::issue(std::vector<Staged> staged,
                                                       double CommStats::*seconds, HostOp host_op) {
  const auto start = Clock::now();
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
  auto request = std::make_unique<Request>(*this, std::move(staged), host, seconds, start);
  const CommStats before = host_->stats();
  try {
    request->host_handle = host_op(host);
  } catch (...) {
    request->abandon();
    throw;
  }
  const CommStats& after = host_->stats();
  stats_.all_to_all_bytes += after.all_to_all_bytes - before.all_to_all_bytes;
  stats_.reduce_bytes += after.reduce_bytes - before.reduce_bytes;
  stats_.gather_bytes += after.gather_bytes - before.gather_bytes;
  stats_.calls += after.calls - before.calls;
  return request;
}

void StagedComm::all_to_all(const Tensor& send, const Tensor& recv) {
  all_to_all_async(send, recv)->wait();
}

CommHandle StagedComm::all_to_all_async(const Tensor& send, const Tensor& recv) {
  check_all_to_all_args(*this, send, recv);
  return issue(
      {{send, true, false}, {recv, false, true}}, &CommStats::all_to_all_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_to_all_async(host[0], host[1]); });
}

void StagedComm::all_to_all_v(const Tensor& send, const int64_t* send_counts,
                              const int64_t* send_displs, const Tensor& recv,
                              const int64_t* recv_counts, const int64_t* recv_displs) {
  check_all_to_all_v_args(*this, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  // recv is uploaded whole, so its gaps must hold what they held before.
  issue({{send, true, false}, {recv, true, true}}, &CommStats::all_to_all_seconds,
        [&](const std::vector<Tensor>& host) {
          host_->all_to_all_v(host[0], send_counts, send_displs, host[1], recv_counts, recv_displs);
          return CommHandle();
        })
      ->wait();
}

void StagedComm::all_reduce(const Tensor& data, ReduceOp op) {
  all_reduce_async(data, op)->wait();
}

CommHandle StagedComm::all_reduce_async(const Tensor& data, ReduceOp op) {
  return issue(
      {{data, true, true}}, &CommStats::reduce_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_reduce_async(host[0], op); });
}

void StagedComm::all_reduce_host(double* values, int count, ReduceOp op) {
  const CommStats before = host_->stats();
  host_->all_reduce_host(values, count, op);
  stats_.reduce_bytes += host_->stats().reduce_bytes - before.reduce_bytes;
  stats_.reduce_seconds += host_->stats().reduce_seconds - before.reduce_seconds;
  stats_.calls += 1;
}

void StagedComm::reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  reduce_scatter_async(send, recv, op)->wait();
}

CommHandle StagedComm::reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_reduce_scatter_args(*this, send, recv);
  return issue({{send, true, false}, {recv, false, true}}, &CommStats::reduce_seconds,
               [&](const std::vector<Tensor>& host) {
                 return host_->reduce_scatter_async(host[0], host[1], op);
               });
}

void StagedComm::all_gather(const Tensor& send, const Tensor& recv) {
  all_gather_async(send, recv)->wait();
}

CommHandle StagedComm::all_gather_async(const Tensor& send, const Tensor& recv) {
  check_all_gather_args(*this, send, recv);
  return issue(
      {{send, true, false}, {recv, false, true}}, &CommStats::gather_seconds,
      [&](const std::vector<Tensor>& host) { return host_->all_gather_async(host[0], host[1]); });
}

void StagedComm::broadcast(const Tensor& data, int root) {
  check_root(*this, root, "broadcast");
  const bool is_root = rank() == root;
  issue({{data, is_root, !is_root}}, &CommStats::gather_seconds,
        [&](const std::vector<Tensor>& host) {
          host_->broadcast(host[0], root);
          return CommHandle();
        })
      ->wait();
}

void StagedComm::broadcast_host(void* data, int64_t bytes, int root) {
  const CommStats before = host_->stats();
  host_->broadcast_host(data, bytes, root);
  stats_.gather_bytes += host_->stats().gather_bytes - before.gather_bytes;
  stats_.gather_seconds += host_->stats().gather_seconds - before.gather_seconds;
  stats_.calls += 1;
}

void StagedComm::barrier() {
  host_->barrier();
  stats_.calls += 1;
}

std::unique_ptr<Comm> StagedComm::split(int color, int key, const std::string& name) {
  return std::make_unique<StagedComm>(host_->split(color, key, name), backend_);
}

void StagedComm::abort(int exit_code) {
  host_->abort(exit_code);
  std::abort();  // not reached: the host communicator's abort ends the process
}

}  // namespace ulysses
