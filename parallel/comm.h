// Communicators (docs/parallelism.md). Buffers are Tensors of the backend in use: MpiComm moves
// host memory (the cpu backend's), NcclComm device memory, and StagedComm device memory
// through pinned host copies over an MpiComm. Every call counts the bytes
// this rank sends and the seconds it waits, per communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/tensor.h"

namespace ulysses {

class Watchdog;

enum class ReduceOp { sum, max };

// Bytes this rank sent and seconds spent (issue to completion), by kind of collective.
struct CommStats {
  int64_t all_to_all_bytes = 0;
  double all_to_all_seconds = 0.0;
  int64_t reduce_bytes = 0;  // all-reduce, reduce-scatter
  double reduce_seconds = 0.0;
  int64_t gather_bytes = 0;  // all-gather, broadcast
  double gather_seconds = 0.0;
  int64_t p2p_bytes = 0;  // point to point (ring attention)
  double p2p_seconds = 0.0;
  int64_t calls = 0;

  // Field by field: the counters of several communicators together, and what happened
  // between two readings of one (after - before).
  CommStats& operator+=(const CommStats& other);
  CommStats operator-(const CommStats& before) const;
};

// A pending non-blocking operation. A collective cannot be abandoned, so every implementation's
// destructor calls wait_unless_done(): a handle dropped without wait() waits.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Completes the operation; later calls return at once.
  void wait() {
    if (done_) return;
    done_ = true;
    complete();
  }

 protected:
  // Destructors cannot throw: a failure seen here is dropped (the collective is over either way).
  void wait_unless_done() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }
  // For an operation that failed to start: there is nothing to wait for.
  void mark_done() { done_ = true; }

 private:
  virtual void complete() = 0;
  bool done_ = false;
};
using CommHandle = std::unique_ptr<CommRequest>;

// The handle of an operation that finished when it was issued (one-rank and planning comms).
CommHandle completed_request();

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "sp", "dp"

  // Each collective is issued non-blocking (the *_async virtuals); its blocking form waits at
  // once. Both count the same bytes and seconds.
  //
  // send and recv have equal numel divisible by size(); block j of send goes to rank j,
  // block i of recv comes from rank i.
  virtual CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) = 0;
  void all_to_all(const Tensor& send, const Tensor& recv) { all_to_all_async(send, recv)->wait(); }
  // In place.
  virtual CommHandle all_reduce_async(const Tensor& data, ReduceOp op) = 0;
  void all_reduce(const Tensor& data, ReduceOp op) { all_reduce_async(data, op)->wait(); }
  // send has size()·recv.numel() elements; rank r receives the reduced block r.
  virtual CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
  void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
    reduce_scatter_async(send, recv, op)->wait();
  }
  // recv has size()·send.numel() elements, block r from rank r.
  virtual CommHandle all_gather_async(const Tensor& send, const Tensor& recv) = 0;
  void all_gather(const Tensor& send, const Tensor& recv) { all_gather_async(send, recv)->wait(); }

  // Point to point (ring attention, docs/parallelism.md "Ulysses × ring"): sends `send` to
  // rank dest and receives `recv` from rank source, both with tag `tag`; either tensor may be
  // empty (nothing goes that way). Messages between two ranks with one tag arrive in the order
  // they were issued. StagedComm stages them through host_comm; NcclComm has none (its
  // operations run in issue order on one stream, where the zigzag's crossing pairs would
  // wait on each other): this default throws.
  virtual CommHandle send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                                     int tag);

  // Host values (loss sums, token counts, norms, the job's agreed settings), blocking.
  // Doubles summed (or maxed) in place.
  virtual void all_reduce_host(double* values, int count, ReduceOp op) = 0;
  virtual void broadcast_host(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Ranks with equal color form a new communicator, ordered by key.
  virtual std::unique_ptr<Comm> split(int color, int key, const std::string& name) = 0;

  // Ends the whole job at once (every rank of every communicator) with this exit code.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats(); }

  // The watchdog that this communicator's waits answer to (parallel/watchdog.h);
  // communicators split from this one share it. Null: waits have no limit.
  void set_watchdog(std::shared_ptr<Watchdog> watchdog) { watchdog_ = std::move(watchdog); }
  const std::shared_ptr<Watchdog>& watchdog() const { return watchdog_; }

 protected:
  CommStats stats_;
  std::shared_ptr<Watchdog> watchdog_;
};

// A communicator of one rank without MPI (single-process runs and unit tests).
std::unique_ptr<Comm> make_local_comm(const std::string& name = "world");

}  // namespace ulysses
