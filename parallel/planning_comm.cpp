#include "parallel/planning_comm.h"

#include <algorithm>
#include <stdexcept>

#include "parallel/comm_checks.h"

namespace ulysses {

PlanningComm::PlanningComm(int size, int rank, const std::string& name)
    : size_(size), rank_(rank), name_(name) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("planning communicator '" + name + "': rank " +
                                std::to_string(rank) + " of " + std::to_string(size));
}

void PlanningComm::count_call(int64_t bytes) {
  largest_call_bytes_ = std::max(largest_call_bytes_, bytes);
  stats_.calls += 1;
}

CommHandle PlanningComm::all_to_all_async(const Tensor& send, const Tensor& recv) {
  check_all_to_all_args(*this, send, recv);
  stats_.all_to_all_bytes += int64_t(send.bytes()) / size_ * (size_ - 1);
  count_call(int64_t(send.bytes() + recv.bytes()));
  return completed_request();
}

CommHandle PlanningComm::all_reduce_async(const Tensor& data, ReduceOp) {
  stats_.reduce_bytes += int64_t(data.bytes());
  count_call(int64_t(data.bytes()));
  return completed_request();
}

CommHandle PlanningComm::reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp) {
  check_reduce_scatter_args(*this, send, recv);
  stats_.reduce_bytes += int64_t(send.bytes());
  count_call(int64_t(send.bytes() + recv.bytes()));
  return completed_request();
}

CommHandle PlanningComm::all_gather_async(const Tensor& send, const Tensor& recv) {
  check_all_gather_args(*this, send, recv);
  stats_.gather_bytes += int64_t(send.bytes());
  count_call(int64_t(send.bytes() + recv.bytes()));
  return completed_request();
}

CommHandle PlanningComm::send_recv_async(const Tensor& send, int dest, const Tensor& recv,
                                         int source, int tag) {
  check_send_recv_args(*this, send, dest, recv, source, tag);
  stats_.p2p_bytes += int64_t(send.bytes());
  count_call(int64_t(send.bytes() + recv.bytes()));
  return completed_request();
}

void PlanningComm::all_reduce_host(double*, int count, ReduceOp) {
  stats_.reduce_bytes += int64_t(count) * int64_t(sizeof(double));
  stats_.calls += 1;
}

void PlanningComm::broadcast_host(void*, int64_t bytes, int root) {
  check_root(*this, root, "broadcast_host");
  stats_.gather_bytes += bytes;
  stats_.calls += 1;
}

std::unique_ptr<Comm> PlanningComm::split(int, int, const std::string& name) {
  throw std::logic_error("planning communicator '" + name_ + "' cannot split into '" + name +
                         "': build the planned mesh with make_planning_mesh");
}

void PlanningComm::abort(int exit_code) {
  throw std::logic_error("planning communicator '" + name_ + "' asked to abort with status " +
                         std::to_string(exit_code));
}

PlanningMesh make_planning_mesh(int world_size, int sp, int ring) {
  if (sp < 1 || world_size % sp != 0)
    throw std::invalid_argument("parallel.sp " + std::to_string(sp) + " does not divide world " +
                                std::to_string(world_size));
  PlanningMesh planned;
  planned.world = std::make_unique<PlanningComm>(world_size, 0, "world");
  planned.mesh.world = planned.world.get();
  planned.mesh.sp = std::make_unique<PlanningComm>(sp, 0, "sp");
  planned.mesh.dp = std::make_unique<PlanningComm>(world_size / sp, 0, "dp");
  planned.mesh.sp_size = sp;
  planned.mesh.dp_size = world_size / sp;
  if (ring > 1) {
    if (sp % ring != 0)
      throw std::invalid_argument("parallel.ring " + std::to_string(ring) + " does not divide sp " +
                                  std::to_string(sp));
    planned.mesh.ring_size = ring;
    planned.mesh.ulysses = std::make_unique<PlanningComm>(sp / ring, 0, "ulysses");
    planned.mesh.ring = std::make_unique<PlanningComm>(ring, 0, "ring");
  }
  return planned;
}

}  // namespace ulysses
