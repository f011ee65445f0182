// The memory the machine has, and a run's memory plan checked against it before the model is
// built (docs/memory.md, "Memory the machine has"). The whole run is in tests/bad_inputs
// (plan_above_machine_memory and the cases after it).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/jobs/start_checks.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/host_memory.h"

namespace ulysses {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

TEST(HostMemory, MemAvailableIsReadFromMeminfoInBytes) {
  const std::string meminfo =
      "MemTotal:       24683772 kB\nMemFree:        20000000 kB\n"
      "MemAvailable:   24130900 kB\nBuffers:           12345 kB\n";
  EXPECT_EQ(meminfo_available_bytes(meminfo), int64_t(24130900) * 1024);
  EXPECT_EQ(meminfo_available_bytes("MemTotal: 1 kB\nMemFree: 1 kB\n"), -1);  // kernels < 3.14
  EXPECT_EQ(meminfo_available_bytes("MemAvailable: 12 MB\n"), -1);
  EXPECT_EQ(meminfo_available_bytes(""), -1);
}

TEST(HostMemory, CgroupRoomIsItsLimitLessItsWorkingSet) {
  EXPECT_EQ(cgroup_room_bytes("8589934592\n", "2147483648\n", ""), 6 * kGiB);  // v2 or v1
  EXPECT_EQ(cgroup_room_bytes("1073741824\n", "2147483648\n", ""), 0);         // over: no room
  EXPECT_EQ(cgroup_room_bytes("max\n", "2147483648\n", ""), -1);               // v2, no limit
  EXPECT_EQ(cgroup_room_bytes("9223372036854771712\n", "1\n", ""), -1);        // v1, no limit
  EXPECT_EQ(cgroup_room_bytes("", "", ""), -1);                                // no such group
  EXPECT_EQ(cgroup_room_bytes("8589934592\n", "", ""), -1);
  // Inactive page cache counts in the usage but is given back first: 6 GiB used of which
  // 3 GiB inactive cache leaves 5 GiB of 8 (v2's key, then v1's among its others).
  const std::string v2_stat =
      "anon 2147483648\nfile 4294967296\nactive_file 1073741824\n"
      "inactive_file 3221225472\nslab 1\n";
  EXPECT_EQ(cgroup_room_bytes("8589934592\n", "6442450944\n", v2_stat), 5 * kGiB);
  // v1 lists the group's own count and its subtree's; the usage is the subtree's, in any order.
  const std::string v1_stat = "cache 4294967296\ntotal_inactive_file 3221225472\ninactive_file 1\n";
  EXPECT_EQ(cgroup_room_bytes("8589934592\n", "6442450944\n", v1_stat), 5 * kGiB);
}

TEST(HostMemory, ThisMachineHasSomeAndNoMoreThanItsTotal) {
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) GTEST_SKIP() << "no /proc/meminfo: not Linux";
  std::ostringstream text;
  text << meminfo.rdbuf();
  std::istringstream fields(text.str());
  std::string key;
  int64_t total_kib = 0;
  fields >> key >> total_kib;
  ASSERT_EQ(key, "MemTotal:");
  const int64_t available = host_available_bytes();
  EXPECT_GT(available, 0);
  EXPECT_LE(available, total_kib * 1024);

  const Backend::AvailableMemory cpu = CpuBackend().available_memory();
  EXPECT_GT(cpu.bytes, 0);
  EXPECT_LE(cpu.bytes, total_kib * 1024);
  EXPECT_TRUE(cpu.shared_by_node) << "host memory is every rank's of the node";
}

Config two_stage_config() {
  Config config;
  config.train.batch_size = 4;
  config.parallel.sp = 2;
  return config;
}

const std::string kPlan = "ulysses-train plan --config c.yaml";

TEST(MachineFit, StagesWithinTheRanksMemoryPass) {
  const RankMemory memory{10 * kGiB, "host memory", 1};
  EXPECT_EQ(machine_fit_problem({{{4096, 0, 4}, 3 * kGiB}, {{8192, 100, 4}, 10 * kGiB}}, memory,
                                two_stage_config(), 2, kPlan),
            "");
  // Unknown memory (the planning and emulated backends): nothing to check against.
  EXPECT_EQ(machine_fit_problem({{{8192, 0, 4}, 1000 * kGiB}}, RankMemory{}, two_stage_config(), 2,
                                kPlan),
            "");
}

TEST(MachineFit, AStageAboveItIsNamedWithBothSizesAndThePlanCommand) {
  const RankMemory memory{10 * kGiB, "host memory", 4};
  const std::string problem =
      machine_fit_problem({{{4096, 0, 4}, 3 * kGiB}, {{65536, 100, 1}, 12 * kGiB}}, memory,
                          two_stage_config(), 8, kPlan);
  for (const std::string part :
       {"the memory plan needs 12.00 GiB per rank at the step peak of 65536 tokens x batch 1",
        "(the train.seq_len_schedule stage 65536x1@100)", "more than the 10.00 GiB",
        "host memory, split among the 4 ranks that share it",
        // The stage's batch differs from train.batch_size, so the command sets it.
        "`ulysses-train plan --config c.yaml --set train.batch_size=1 --seq 65536 --sp 2 "
        "--world 8 --device-gib 10.00`",
        "memory.limit_gib"})
    EXPECT_NE(problem.find(part), std::string::npos) << part << "\nnot in: " << problem;
}

TEST(MachineFit, OneStageOneRankSaysNoScheduleAndNoSharing) {
  const RankMemory memory{kGiB / 2, "the GPU's free memory", 1};
  const std::string problem =
      machine_fit_problem({{{4096, 0, 4}, kGiB}}, memory, two_stage_config(), 1, kPlan);
  EXPECT_NE(problem.find("1.00 GiB per rank at the step peak of 4096 tokens x batch 4, more "
                         "than the 512.00 MiB this rank can have (the GPU's free memory)"),
            std::string::npos)
      << problem;
  EXPECT_NE(problem.find("--seq 4096 --sp 2 --world 1 --device-gib 0.50`"), std::string::npos)
      << problem;
  EXPECT_EQ(problem.find("train.seq_len_schedule"), std::string::npos) << problem;
  EXPECT_EQ(problem.find("--set train.batch_size"), std::string::npos) << problem;
}

}  // namespace
}  // namespace ulysses
