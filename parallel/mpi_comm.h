// MPI communicators on host buffers (docs/parallelism.md). Only parallel/*.cpp include <mpi.h>;
// everything else sees the Comm interface, MpiSession and ranks_on_this_node.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace ulysses {

class ProgressThread;

// MPI for the life of the process: MPI_Init_thread in the constructor (multiple where
// granted, for a progress thread; otherwise funneled: only the main thread calls MPI and
// OpenMP threads never do), MPI_Finalize in the destructor. One per
// process, created first in main and destroyed last.
class MpiSession {
 public:
  MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // A communicator named "world" over every rank of the job (its own duplicate of
  // MPI_COMM_WORLD, so its messages never mix with anyone else's).
  std::unique_ptr<Comm> world();
};

// A Comm over an MPI communicator. Tensors are host memory of dtype f32, bf16 or i32 (device
// buffers go through a StagedComm). bf16 reductions compute in float and round to bf16.
// MPI counts are int: transfers with more elements than max_count_per_call() per block are
// split into several calls, so element counts above INT_MAX work.
// Non-blocking handles must be waited on (or destroyed, which waits) before the buffers
// they use and this communicator go away. Every operation is issued non-blocking and its
// wait polls under the watchdog (parallel/watchdog.h), blocking calls included.
class MpiComm final : public Comm {
 public:
  struct Native;  // holds the MPI_Comm; defined where <mpi.h> is included
  MpiComm(std::unique_ptr<Native> native, const std::string& name);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) override;
  CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override;
  CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  CommHandle all_gather_async(const Tensor& send, const Tensor& recv) override;
  CommHandle send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                             int tag) override;
  void all_reduce_host(double* values, int count, ReduceOp op) override;
  void broadcast_host(void* data, int64_t bytes, int root) override;
  void barrier() override;

  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(int exit_code) override;

  // Ranks of this communicator that share this rank's node (shared memory domain).
  int ranks_on_this_node() const;

  // Starts a progress thread (parallel/progress_thread.h) that this communicator and those
  // split from it afterwards keep busy while their operations are in flight.
  void start_progress_thread();
  const ProgressThread* progress_thread() const { return progress_.get(); }

  // At most INT_MAX (the default). Tests lower it to exercise the splitting; communicators
  // made by split() inherit it.
  void set_max_count_per_call(int64_t count);
  int64_t max_count_per_call() const { return max_count_; }

 private:
  class Request;  // the MPI_Requests of one operation

  // Issue the collective non-blocking, appending its MPI requests to request.
  void issue_all_to_all(const Tensor& send, const Tensor& recv, Request& request);
  void issue_all_reduce(const Tensor& data, ReduceOp op, Request& request);
  void issue_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op, Request& request);
  void issue_all_gather(const Tensor& send, const Tensor& recv, Request& request);

  std::unique_ptr<Native> native_;
  std::shared_ptr<ProgressThread> progress_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  int64_t max_count_;
};

// Ranks on this node, so each can use cores ÷ ranks threads. 1 for a communicator that is
// not an MpiComm (a local comm is one process).
int ranks_on_this_node(Comm& world);

}  // namespace ulysses
