// Which communicator carries the backend's buffers between ranks (parallel.device_comm).
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

// parallel.device_comm: what carries the device buffers between ranks.
enum class DeviceComm { automatic, nccl, mpi };

struct DeviceCommChoice {
  bool nccl = false;   // NcclComm; otherwise a StagedComm over MPI
  std::string reason;  // why, for the log
};

// True when this build has NcclComm.
bool nccl_compiled();

// NCCL needs this build to have it and one GPU per rank of a
// node (two ranks on one GPU is an error in NCCL); auto takes it when it can and more than one
// rank runs and the job needs no point to point (parallel.ring > 1 does: NcclComm has none,
// parallel/comm.h). Throws std::invalid_argument, naming the key and the way out, when nccl
// is asked for but cannot work.
DeviceCommChoice choose_device_comm(DeviceComm setting, bool nccl_available, int world_size,
                                    int ranks_on_node, int gpus_on_node,
                                    bool point_to_point = false);

// A communicator over the ranks of world for buffers of a device backend: an NcclComm or a
// StagedComm, each over its own split of world.
std::unique_ptr<Comm> make_device_world(Comm& world, Backend& backend,
                                        const DeviceCommChoice& choice);

}  // namespace ulysses
