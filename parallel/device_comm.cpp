#include "parallel/device_comm.h"

#include <stdexcept>

#include "parallel/staged_comm.h"

#ifdef ULYSSES_WITH_NCCL
#include "parallel/nccl_comm.h"
#endif

namespace ulysses {

bool nccl_compiled() {
#ifdef ULYSSES_WITH_NCCL
  return true;
#else
  return false;
#endif
}

DeviceCommChoice choose_device_comm(DeviceComm setting, bool nccl_available, int world_size,
                                    int ranks_on_node, int gpus_on_node, bool point_to_point) {
  if (setting == DeviceComm::mpi) return {false, "parallel.device_comm: mpi"};
  const bool shared_gpu = ranks_on_node > gpus_on_node;
  const std::string sharing = std::to_string(ranks_on_node) + " ranks on this node share " +
                              std::to_string(gpus_on_node) + " GPU(s)";
  if (setting == DeviceComm::nccl) {
    if (!nccl_available)
      throw std::invalid_argument(
          "parallel.device_comm: nccl, but this build has no NCCL (it was not found when the "
          "build was configured); use parallel.device_comm: mpi or auto");
    if (shared_gpu)
      throw std::invalid_argument("parallel.device_comm: nccl needs one GPU per rank, but " +
                                  sharing +
                                  "; start at most one rank per GPU or use "
                                  "parallel.device_comm: mpi or auto");
    return {true, "parallel.device_comm: nccl"};
  }
  if (world_size == 1) return {false, "one rank: nothing travels between ranks"};
  if (point_to_point)
    return {false,
            "parallel.ring needs point to point, which only staging has: MPI, staged "
            "through the host"};
  if (!nccl_available) return {false, "this build has no NCCL: MPI, staged through the host"};
  if (shared_gpu) return {false, sharing + ": MPI, staged through the host"};
  return {true, "one GPU per rank: NCCL"};
}

std::unique_ptr<Comm> make_device_world(Comm& world, Backend& backend,
                                        const DeviceCommChoice& choice) {
  std::unique_ptr<Comm> host = world.split(0, world.rank(), world.name());
#ifdef ULYSSES_WITH_NCCL
  if (choice.nccl) return std::make_unique<NcclComm>(std::move(host), backend);
#else
  if (choice.nccl) throw std::logic_error("make_device_world: NCCL chosen in a build without it");
#endif
  return std::make_unique<StagedComm>(std::move(host), backend);
}

}  // namespace ulysses
