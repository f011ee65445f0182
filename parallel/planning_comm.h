// A communicator that moves nothing, for planning (docs/memory.md, "The planner"): it has
// the size and rank of a real one, checks every call's shapes as MpiComm does, and counts
// the bytes this rank would send the way MpiComm counts them, so a planned step reports the
// all-to-all volume of a real one.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace ulysses {

class PlanningComm final : public Comm {
 public:
  PlanningComm(int size, int rank, const std::string& name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  // The bytes of the largest single call (send and receive buffers together): what staging
  // through host memory holds at once (parallel/staged_comm.h).
  int64_t largest_call_bytes() const { return largest_call_bytes_; }

  CommHandle all_to_all_async(const Tensor& send, const Tensor& recv) override;
  CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override;
  CommHandle reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  CommHandle all_gather_async(const Tensor& send, const Tensor& recv) override;
  CommHandle send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                             int tag) override;
  void all_reduce_host(double* values, int count, ReduceOp op) override;
  void broadcast_host(void* data, int64_t bytes, int root) override;
  void barrier() override {}
  // A planned mesh is built whole (make_planning_mesh): nothing splits a planning comm.
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(int exit_code) override;

 private:
  void count_call(int64_t bytes);

  int size_, rank_;
  std::string name_;
  int64_t largest_call_bytes_ = 0;
};

// The dp × sp mesh of rank 0 in a world of world_size ranks, on planning comms (sp must
// divide world_size).
struct PlanningMesh {
  std::unique_ptr<PlanningComm> world;
  Mesh mesh;
};
PlanningMesh make_planning_mesh(int world_size, int sp, int ring = 1);

}  // namespace ulysses
