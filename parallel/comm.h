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
  int64_t calls = 0;
};

// A pending non-blocking operation.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};
using CommHandle = std::unique_ptr<CommRequest>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "sp", "dp"

  // send and recv have equal numel divisible by size(); block j of send goes to rank j,
  // block i of recv comes from rank i.
  virtual void all_to_all(const Tensor& send, const Tensor& recv) = 0;
  virtual CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) = 0;
  // Uneven splits: counts and displacements in elements, one per rank.
  virtual void all_to_all_v(const Tensor& send, const int64_t* send_counts,
                            const int64_t* send_displs, const Tensor& recv,
                            const int64_t* recv_counts, const int64_t* recv_displs) = 0;
  // In place.
  virtual void all_reduce(const Tensor& data, ReduceOp op) = 0;
  virtual CommHandle all_reduce_async(const Tensor& data, ReduceOp op) = 0;
  // Host doubles (loss sums, token counts, norms), summed in place.
  virtual void all_reduce_host(double* values, int count, ReduceOp op) = 0;
  // send has size()·recv.numel() elements; rank r receives the reduced block r.
  virtual void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
  virtual CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
  // recv has size()·send.numel() elements, block r from rank r.
  virtual void all_gather(const Tensor& send, const Tensor& recv) = 0;
  virtual CommHandle all_gather_async(const Tensor& send, const Tensor& recv) = 0;
  virtual void broadcast(const Tensor& data, int root) = 0;
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
