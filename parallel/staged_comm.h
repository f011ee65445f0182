// Device buffers over a host communicator (docs/parallelism.md): MpiComm "stages device buffers
// through the host". Slower than NCCL (each collective adds a device-to-host and a
// host-to-device copy), but it works where NCCL cannot: several ranks sharing one GPU, a
// build without NCCL, and tests.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

// Page-locked host blocks of one backend, reused from call to call: allocating page-locked
// memory costs far more than a collective on it.
class StagingPool {
 public:
  explicit StagingPool(Backend& backend) : backend_(backend) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A block of at least `bytes` that no pending operation uses, until release().
  void* acquire(size_t bytes);
  void release(void* block);
  // Bytes of host memory the pool holds.
  size_t held_bytes() const;

 private:
  struct Block {
    void* data;
    size_t bytes;
    bool in_use;
  };
  Backend& backend_;
  std::vector<Block> blocks_;
};

// A Comm for tensors in `backend`'s memory: each collective downloads its inputs into staging
// blocks, runs on host_comm (normally an MpiComm over the same ranks) and uploads the results.
// Counts the bytes host_comm sends and the seconds from issue to completion, copies included.
// Non-blocking handles must be waited on (or destroyed, which waits) before the buffers they
// use and this communicator go away; the upload of the result happens in wait().
class StagedComm final : public Comm {
 public:
  StagedComm(std::unique_ptr<Comm> host_comm, Backend& backend);
  ~StagedComm() override;
  StagedComm(const StagedComm&) = delete;
  StagedComm& operator=(const StagedComm&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

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

  // Host memory held for staging.
  size_t staging_bytes() const { return pool_.held_bytes(); }

  // All-to-alls whose blocks hold at least min_piece_bytes·2 are pipelined in up to `pieces`
  // pieces (piece j: the same slice of every rank's block): piece j+1 is copied to the host
  // while piece j travels, and piece j is copied back while the next one still travels.
  // 1 piece turns it off. Defaults: 4 pieces of at least 1 MiB.
  void set_pipeline(int pieces, int64_t min_piece_bytes);

 private:
  class Request;
  class PipelinedAllToAll;
  // A device tensor of one operation: copied to its staging block before, back after, or both.
  struct Staged {
    Tensor device;
    bool download;
    bool upload;
  };

  // Gives every staged tensor a block (downloading the inputs), runs host_op on the host views
  // (in the same order) and returns the pending operation; its wait() waits for the handle
  // host_op returned, uploads the outputs and adds the seconds from issue to completion to
  // the `seconds` field of stats_.
  template <typename HostOp>
  std::unique_ptr<Request> issue(std::vector<Staged> staged, double CommStats::*seconds,
                                 HostOp host_op);

  std::unique_ptr<Comm> host_;
  Backend& backend_;
  StagingPool pool_;
  int pipeline_pieces_ = 4;
  int64_t min_piece_bytes_ = int64_t(1) << 20;
};

}  // namespace ulysses
