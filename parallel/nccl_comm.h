// NCCL communicators on device buffers (docs/parallelism.md). Built only with the CUDA backend
// (ULYSSES_WITH_NCCL is then defined for every target that links ulysses_parallel); this
// header has no CUDA or NCCL types.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

// A Comm over NCCL for tensors in the device memory of a CUDA backend (f32, bf16 or i32).
// Collectives run on the communicator's own stream, ordered after the work already queued on
// the backend's stream (an event). Between a *_async call and its wait() the collective
// overlaps whatever compute is queued or issued meanwhile. wait() then makes the backend's
// stream wait for the result (another event) and also blocks the host until the collective
// has finished: the host polls under the watchdog, so that a peer that is gone ends the job
// and NCCL's errors surface at the call, and the seconds counted are issue to completion. So
// the host queues no compute past a wait() until the collective is done: issue early, wait
// late. Host values (all_reduce_host, broadcast_host), barrier and abort go through the host
// communicator of the same ranks (an MpiComm). Non-blocking handles must be waited on (or
// destroyed, which waits) before the buffers they use and this communicator go away.
class NcclComm final : public Comm {
 public:
  struct Native;  // the ncclComm_t and streams; defined where <nccl.h> is included

  // Collective over host_comm's ranks: rank 0 makes the ncclUniqueId and host_comm
  // broadcasts it. backend must be the cuda backend whose buffers this communicator moves.
  NcclComm(std::unique_ptr<Comm> host_comm, Backend& backend);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) override;
  CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override;
  CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  CommHandle all_gather_async(const Tensor& send, const Tensor& recv) override;
  void all_reduce_host(double* values, int count, ReduceOp op) override;
  void broadcast_host(void* data, int64_t bytes, int root) override;
  void barrier() override;

  // ncclCommSplit together with the host communicator's split.
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(int exit_code) override;

 private:
  class Request;
  NcclComm(std::unique_ptr<Comm> host_comm, std::unique_ptr<Native> native);

  // Orders the communicator's stream after the compute stream, runs enqueue (which puts NCCL
  // calls on the communicator's stream) and returns the handle of their completion; its wait
  // adds the seconds from issue to completion to *seconds.
  template <typename Enqueue>
  std::unique_ptr<Request> issue(const char* operation, int64_t bytes, double* seconds,
                                 Enqueue enqueue);

  std::unique_ptr<Comm> host_;
  std::unique_ptr<Native> native_;
};

}  // namespace ulysses
