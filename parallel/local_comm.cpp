#include "parallel/local_comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kernels/stopwatch.h"
#include "parallel/comm_checks.h"

namespace ulysses {

namespace {

// One rank: the only peer is itself, so all-to-all and gathers are copies, reductions are
// no-ops, and nothing is ever sent to another rank (all_to_all_bytes stays 0). reduce_bytes
// and gather_bytes count the buffer bytes handed in, as MpiComm does. Every collective
// completes when it is issued.
class LocalComm final : public Comm {
 public:
  LocalComm(const std::string& name, Backend* backend) : name_(name), backend_(backend) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) override {
    check_all_to_all_args(*this, send, recv);
    return copy_as_collective(recv, send, &CommStats::all_to_all_seconds);
  }

  CommHandle all_reduce_async(const Tensor& data, ReduceOp) override {
    stats_.reduce_bytes += int64_t(data.bytes());
    stats_.calls += 1;
    return completed_request();
  }

  CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp) override {
    check_reduce_scatter_args(*this, send, recv);
    stats_.reduce_bytes += int64_t(send.bytes());
    return copy_as_collective(recv, send, &CommStats::reduce_seconds);
  }

  CommHandle all_gather_async(const Tensor& send, const Tensor& recv) override {
    check_all_gather_args(*this, send, recv);
    stats_.gather_bytes += int64_t(send.bytes());
    return copy_as_collective(recv, send, &CommStats::gather_seconds);
  }

  // The only peer is this rank: what it sends is what it receives.
  CommHandle send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                             int tag) override {
    check_send_recv_args(*this, send, dest, recv, source, tag);
    if (send.numel() != recv.numel())
      throw std::invalid_argument("send_recv on one rank: send and recv differ in size");
    return copy_as_collective(recv, send, &CommStats::p2p_seconds);
  }

  void all_reduce_host(double*, int count, ReduceOp) override {
    stats_.reduce_bytes += int64_t(count) * int64_t(sizeof(double));
    stats_.calls += 1;
  }

  void broadcast_host(void*, int64_t bytes, int root) override {
    check_root(*this, root, "broadcast_host");
    stats_.gather_bytes += bytes;
    stats_.calls += 1;
  }

  void barrier() override { stats_.calls += 1; }

  // Every group of a one-rank world is that rank alone.
  std::unique_ptr<Comm> split(int, int, const std::string& name) override {
    auto comm = std::make_unique<LocalComm>(name, backend_);
    comm->set_watchdog(watchdog_);
    return comm;
  }

  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }

 private:
  // A collective of one rank: recv is send, copied now and timed into the `seconds` field.
  CommHandle copy_as_collective(const Tensor& recv, const Tensor& send,
                                double CommStats::*seconds) {
    const Stopwatch clock;
    copy(recv, send);
    stats_.*seconds += clock.seconds();
    stats_.calls += 1;
    return completed_request();
  }

  void copy(const Tensor& dst, const Tensor& src) {
    if (dst.data == src.data || src.numel() == 0) return;
    if (backend_)
      backend_->copy(dst, src);
    else
      std::memcpy(dst.data, src.data, src.bytes());
  }

  std::string name_;
  Backend* backend_;  // null: host buffers, copied with memcpy
};

}  // namespace

std::unique_ptr<Comm> make_local_comm(const std::string& name) {
  return std::make_unique<LocalComm>(name, nullptr);
}

std::unique_ptr<Comm> make_local_comm(Backend& backend, const std::string& name) {
  return std::make_unique<LocalComm>(name, &backend);
}

}  // namespace ulysses
