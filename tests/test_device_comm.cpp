// parallel.device_comm: which communicator carries device buffers, for every combination of
// setting, NCCL in the build, world size and GPUs per node.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "parallel/device_comm.h"

namespace ulysses {
namespace {

std::string refusal(DeviceComm setting, bool nccl, int world, int ranks, int gpus) {
  try {
    choose_device_comm(setting, nccl, world, ranks, gpus);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(DeviceComm, AutoTakesNcclWhenEveryRankHasItsOwnGpu) {
  DeviceCommChoice choice = choose_device_comm(DeviceComm::automatic, true, 8, 8, 8);
  EXPECT_TRUE(choice.nccl);
  EXPECT_EQ(choice.reason, "one GPU per rank: NCCL");
  EXPECT_TRUE(
      choose_device_comm(DeviceComm::automatic, true, 16, 4, 8).nccl);  // fewer ranks than GPUs
}

TEST(DeviceComm, AutoStagesThroughTheHostOtherwise) {
  DeviceCommChoice shared = choose_device_comm(DeviceComm::automatic, true, 2, 2, 1);
  EXPECT_FALSE(shared.nccl);
  EXPECT_EQ(shared.reason, "2 ranks on this node share 1 GPU(s): MPI, staged through the host");
  DeviceCommChoice no_nccl = choose_device_comm(DeviceComm::automatic, false, 4, 4, 4);
  EXPECT_FALSE(no_nccl.nccl);
  EXPECT_NE(no_nccl.reason.find("no NCCL"), std::string::npos) << no_nccl.reason;
  EXPECT_FALSE(choose_device_comm(DeviceComm::automatic, true, 1, 1, 1).nccl);
}

// Ring attention needs point to point, which only staging has (parallel/comm.h).
TEST(DeviceComm, AutoStagesForTheRing) {
  const DeviceCommChoice ring = choose_device_comm(DeviceComm::automatic, true, 8, 8, 8, true);
  EXPECT_FALSE(ring.nccl);
  EXPECT_EQ(ring.reason,
            "parallel.ring needs point to point, which only staging has: MPI, staged through the "
            "host");
}

TEST(DeviceComm, MpiIsAlwaysStaged) {
  EXPECT_FALSE(choose_device_comm(DeviceComm::mpi, true, 8, 8, 8).nccl);
  EXPECT_FALSE(choose_device_comm(DeviceComm::mpi, false, 2, 2, 1).nccl);
}

TEST(DeviceComm, NcclIsRefusedWhereItCannotWork) {
  EXPECT_TRUE(choose_device_comm(DeviceComm::nccl, true, 4, 4, 4).nccl);
  const std::string shared = refusal(DeviceComm::nccl, true, 2, 2, 1);
  EXPECT_NE(shared.find("parallel.device_comm: nccl needs one GPU per rank, but 2 ranks on this "
                        "node share 1 GPU(s)"),
            std::string::npos)
      << shared;
  EXPECT_NE(shared.find("parallel.device_comm: mpi"), std::string::npos) << shared;
  const std::string missing = refusal(DeviceComm::nccl, false, 4, 4, 4);
  EXPECT_NE(missing.find("this build has no NCCL"), std::string::npos) << missing;
}

}  // namespace
}  // namespace ulysses
