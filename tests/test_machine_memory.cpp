// The memory the machine has, and a run's memory plan (and eval's, and sample's) checked
// against it before the model is built (docs/memory.md, "Memory the machine has"). The whole
// runs are in tests/bad_inputs (plan_above_machine_memory and the cases after it).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/jobs/memory_fit.h"
#include "core/model/model.h"
#include "core/plan/memory_plan.h"
#include "core/plan/plan_search.h"
#include "core/train/sampler.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/host_memory.h"
#include "parallel/exit_code.h"
#include "parallel/local_comm.h"

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

// A planned stage as plan_stages makes it: what the rank needs from its device peak and its
// host part.
StagePlan planned(SeqLenStage stage, int64_t device_peak, int64_t host_peak = 0,
                  Device device = Device::cpu) {
  return {stage, device_peak, rank_need(device, device_peak, host_peak), host_peak};
}

TEST(MachineFit, StagesWithinTheRanksMemoryPass) {
  const RankMemory memory{10 * kGiB, "host memory", 1};
  EXPECT_EQ(
      machine_fit_problem({planned({4096, 0, 4}, 3 * kGiB), planned({8192, 100, 4}, 10 * kGiB)},
                          memory, two_stage_config(), 2, kPlan),
      "");
  // Unknown memory (the planning and emulated backends): nothing to check against.
  EXPECT_EQ(machine_fit_problem({planned({8192, 0, 4}, 1000 * kGiB)}, RankMemory{},
                                two_stage_config(), 2, kPlan),
            "");
}

TEST(MachineFit, AStageAboveItIsNamedWithBothSizesAndThePlanCommand) {
  const RankMemory memory{10 * kGiB, "host memory", 4};
  const std::string problem =
      machine_fit_problem({planned({4096, 0, 4}, 3 * kGiB), planned({65536, 100, 1}, 12 * kGiB)},
                          memory, two_stage_config(), 8, kPlan);
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
      machine_fit_problem({planned({4096, 0, 4}, kGiB)}, memory, two_stage_config(), 1, kPlan);
  EXPECT_NE(problem.find("1.00 GiB per rank at the step peak of 4096 tokens x batch 4, more "
                         "than the 512.00 MiB this rank can have (the GPU's free memory)"),
            std::string::npos)
      << problem;
  EXPECT_NE(problem.find("--seq 4096 --sp 2 --world 1 --device-gib 0.50`"), std::string::npos)
      << problem;
  EXPECT_EQ(problem.find("train.seq_len_schedule"), std::string::npos) << problem;
  EXPECT_EQ(problem.find("--set train.batch_size"), std::string::npos) << problem;
}

// `ulysses-train eval` checks its own plan, a forward and the loss (plan_eval), and
// advises the largest batch dividing train.batch_size that fits: with eval_steps scaled up it
// reads the same sequences (tests/test_eval.cpp, SmallerBatchesReadTheSameSequences).
Config eval_config(int batch_size) {
  return parse_config(
      "model: {family: llama, n_layers: 2, d_model: 64, n_heads: 8, n_kv_heads: 4, d_ff: 96}\n"
      "train: {batch_size: " +
          std::to_string(batch_size) +
          ", seq_len: 256, eval_steps: 5}\n"
          "data: {source: synthetic}\n",
      {}, "eval.yaml");
}

// eval_config with layer checkpointing and its layer inputs offloaded.
Config offloaded_config() {
  Config config = eval_config(2);
  config.memory.activation_checkpointing = ActivationCheckpointing::layer;
  config.memory.offload_checkpoints = true;
  return config;
}

TEST(EvalFit, AboveTheMemoryNamesTheLargestBatchThatReadsTheSameSequencesAndFits) {
  const int64_t peak_of_3 = plan_eval(eval_config(3), 1, 1).device_peak;
  const int64_t peak_of_6 = plan_eval(eval_config(6), 1, 1).device_peak;
  ASSERT_LT(peak_of_3, peak_of_6);
  EXPECT_EQ(eval_fit_problem(eval_config(6), 1, 1, RankMemory{peak_of_6, "fixed", 1}, RankMemory{}),
            "");
  EXPECT_EQ(eval_fit_problem(eval_config(6), 1, 1, RankMemory{}, RankMemory{}), "")
      << "memory not known";

  const RankMemory between{(peak_of_3 + peak_of_6) / 2, "fixed", 2};
  const std::string problem = eval_fit_problem(eval_config(6), 1, 1, between, RankMemory{});
  for (const std::string& part : std::vector<std::string>{
           "evaluating needs " + format_bytes(peak_of_6) +
               " per rank at the peak of a batch of 6 sequences of 256 tokens",
           "more than the " + format_bytes(between.bytes) +
               " this rank can have (fixed, split among the 2 ranks that share it)",
           // 4 and 5 do not divide 6; 3 is the largest that does, in twice the 5 steps.
           "--set train.batch_size=3 --set train.eval_steps=10 reads the same sequences",
           format_bytes(peak_of_3) + " planned"})
    EXPECT_NE(problem.find(part), std::string::npos) << part << "\nnot in: " << problem;
}

TEST(EvalFit, WhenNotEvenOneSequenceFitsItSaysSo) {
  const int64_t peak_of_1 = plan_eval(eval_config(1), 1, 1).device_peak;
  const std::string problem =
      eval_fit_problem(eval_config(4), 1, 1, RankMemory{peak_of_1 - 1, "fixed", 1}, RankMemory{});
  EXPECT_NE(problem.find("Even one sequence at a time does not fit"), std::string::npos) << problem;
  EXPECT_EQ(problem.find("--set train.batch_size"), std::string::npos) << problem;
}

// `ulysses-train sample` checks the plan of its forward over the whole context: within 5% of
// the tracked peak of the real model generating tokens, as the sample job builds it.
TEST(SampleFit, ThePlanIsTheRealForwardsPeakAndItsProblemNamesTheContext) {
  const Config config = eval_config(1);
  const int64_t context_len = 200;
  CpuBackend cpu;
  cpu.set_num_threads(1);
  auto sp = make_local_comm("sp");
  Model model(config, cpu, *sp, *sp, 1, context_len);
  TokenSampler greedy(SamplingOptions{0.0, 0, 1});
  generate(model, context_len, {1, 2, 3}, 2, greedy);
  const double run = double(cpu.memory().stats().total_peak);
  const int64_t plan = plan_sample(config, context_len, 1).device_peak;
  EXPECT_NEAR(double(plan), run, 0.05 * run);
  EXPECT_LT(plan, plan_sample(config, 2 * context_len, 1).device_peak);

  const std::string context = "the prompt's 3 tokens and --max-new-tokens 197";
  EXPECT_EQ(sample_fit_problem(config, context_len, context, 1, RankMemory{plan, "fixed", 1},
                               RankMemory{}),
            "");
  const std::string problem = sample_fit_problem(config, context_len, context, 1,
                                                 RankMemory{plan - 1, "fixed", 1}, RankMemory{});
  EXPECT_NE(problem.find("sampling needs " + format_bytes(plan) +
                         " at the peak of a forward over 200 tokens (" + context + ")"),
            std::string::npos)
      << problem;
}

// On the cpu backend memory.offload_checkpoints moves nothing: the layer inputs are in the
// host memory the rest of the step uses, so the check counts them there (the plan keeps them
// apart from the device total, as memory.limit_gib does). On cuda they are host memory beside
// the GPU's, checked by host_fit_problem.
TEST(MachineFit, OnTheCpuTheOffloadedLayerInputsCountInTheSameMemory) {
  const RankMemory memory{4 * kGiB, "host memory", 1};
  Config cpu = two_stage_config();
  const std::string problem =
      machine_fit_problem({planned({4096, 0, 4}, 3 * kGiB, 2 * kGiB)}, memory, cpu, 1, kPlan);
  EXPECT_NE(problem.find("needs 5.00 GiB per rank (2.00 GiB of it the layer inputs of "
                         "memory.offload_checkpoints, which on the cpu backend stay in this "
                         "memory) at the step peak of 4096 tokens x batch 4"),
            std::string::npos)
      << problem;
  Config cuda = two_stage_config();
  cuda.device = Device::cuda;
  EXPECT_EQ(machine_fit_problem({planned({4096, 0, 4}, 3 * kGiB, 2 * kGiB, Device::cuda)}, memory,
                                cuda, 1, kPlan),
            "");
  EXPECT_EQ(host_fit_problem({planned({4096, 0, 4}, 3 * kGiB, 2 * kGiB)}, memory, cpu), "")
      << "the cpu backend's one memory is machine_fit_problem's";
}

TEST(HostFit, ACudaStageAboveTheHostsShareIsNamedWithTheOffloadAdvice) {
  Config cuda = two_stage_config();
  cuda.device = Device::cuda;
  const RankMemory host{10 * kGiB, "host memory", 8};
  EXPECT_EQ(
      host_fit_problem({planned({4096, 0, 4}, 70 * kGiB, 10 * kGiB, Device::cuda)}, host, cuda),
      "");
  EXPECT_EQ(host_fit_problem({planned({4096, 0, 4}, kGiB, 1000 * kGiB, Device::cuda)}, RankMemory{},
                             cuda),
            "");
  const std::string problem =
      host_fit_problem({planned({4096, 0, 4}, kGiB, kGiB, Device::cuda),
                        planned({1 << 20, 100, 1}, 70 * kGiB, 211 * kGiB, Device::cuda)},
                       host, cuda);
  for (const std::string part :
       {"needs 211.00 GiB of host memory per rank at the step peak of 1048576 tokens x batch 1 "
        "(the train.seq_len_schedule stage 1048576x1@100)",
        "more than the 10.00 GiB this rank can have (host memory, split among the 8 ranks",
        "memory.offload_checkpoints: false"})
    EXPECT_NE(problem.find(part), std::string::npos) << part << "\nnot in: " << problem;
}

// The host part of each stage's plan: on cuda the offloaded layer inputs, the weights I/O and
// the pinned staging; on the cpu backend the offloaded layer inputs only (its weights I/O fills
// the master weights in place). And a cuda run is held to its host's memory whatever
// memory.limit_gib says, before it builds anything.
TEST(HostFit, EachStagesHostPeakIsItsPlansHostMemory) {
  Config config = offloaded_config();
  for (const Device device : {Device::cpu, Device::cuda}) {
    config.device = device;
    const MemoryPlan plan = plan_memory(config, 1, 1);
    ASSERT_GT(plan.host_checkpoints, 0) << name_of(device);
    const std::vector<StagePlan> stages = plan_stages(config, 1, 1);
    ASSERT_EQ(stages.size(), 1u);
    EXPECT_EQ(stages[0].device_peak, plan.device_peak);
    EXPECT_EQ(stages[0].rank_need, plan.rank_need);
    EXPECT_EQ(stages[0].host_peak,
              device == Device::cuda
                  ? plan.host_checkpoints + plan.host_weights_io + plan.host_staging
                  : plan.host_checkpoints)
        << name_of(device);
  }
  auto world = make_local_comm("world");
  config.memory.limit_gib = 1000;
  const RankMemory plenty{1000 * kGiB, "fixed", 1};
  check_stages_fit(*world, config, 1, kPlan, plenty, plenty);
  try {
    check_stages_fit(*world, config, 1, kPlan, plenty,
                     RankMemory{plan_stages(config, 1, 1)[0].host_peak - 1, "fixed", 1});
    ADD_FAILURE() << "a cuda run past its host memory was not refused";
  } catch (const JobError& error) {
    EXPECT_EQ(error.code(), ExitCode::runtime);
    EXPECT_NE(std::string(error.what()).find("of host memory per rank"), std::string::npos)
        << error.what();
  }
}

// eval and sample hold offloaded layer inputs too: on the cpu in the same memory, on cuda in
// the host memory beside the GPU, each checked where it is.
TEST(EvalFit, OffloadedLayerInputsAreCheckedWhereTheyLive) {
  Config config = offloaded_config();
  const StagePlan cpu = plan_eval(config, 1, 1);
  ASSERT_GT(cpu.host_peak, 0);
  const RankMemory between{cpu.device_peak + cpu.host_peak / 2, "fixed", 1};
  const std::string problem = eval_fit_problem(config, 1, 1, between, RankMemory{});
  EXPECT_NE(problem.find("evaluating needs " + format_bytes(cpu.device_peak + cpu.host_peak) +
                         " per rank (" + format_bytes(cpu.host_peak) +
                         " of it the layer inputs of memory.offload_checkpoints"),
            std::string::npos)
      << problem;

  config.device = Device::cuda;
  const StagePlan cuda = plan_eval(config, 1, 1);
  ASSERT_GT(cuda.host_peak, 0);
  const RankMemory gpu{cuda.device_peak, "fixed", 1};
  EXPECT_EQ(eval_fit_problem(config, 1, 1, gpu, RankMemory{cuda.host_peak, "fixed", 1}), "");
  const std::string host_problem =
      eval_fit_problem(config, 1, 1, gpu, RankMemory{cuda.host_peak - 1, "fixed", 1});
  EXPECT_NE(host_problem.find("evaluating needs " + format_bytes(cuda.host_peak) +
                              " of host memory per rank for the layer inputs of "
                              "memory.offload_checkpoints"),
            std::string::npos)
      << host_problem;
  const std::string sample_problem =
      sample_fit_problem(config, 256, "train.seq_len", 1, gpu,
                         RankMemory{plan_sample(config, 256, 1).host_peak - 1, "fixed", 1});
  EXPECT_NE(sample_problem.find("sampling needs "), std::string::npos) << sample_problem;
  EXPECT_NE(sample_problem.find(" of host memory per rank"), std::string::npos) << sample_problem;
}

// `plan` checks its budget against what the rank's memory must hold: on the cpu backend the
// offloaded layer inputs too, which it used to leave out (so "FITS" with offload on, and
// "cheapest options that fit: ... + offload", on a cpu where offloading moves nothing).
TEST(PlanFit, OnTheCpuTheBudgetHoldsTheOffloadedInputsAndOffloadIsNoAdvice) {
  Config config = offloaded_config();
  const MemoryPlan cpu = plan_memory(config, 1, 1);
  ASSERT_GT(cpu.host_checkpoints, 0);
  EXPECT_EQ(cpu.rank_need, cpu.device_peak + cpu.host_checkpoints);
  auto names = [](const std::vector<OptionSet>& ladder) {
    std::string all;
    for (const OptionSet& options : ladder) all += options.name + "; ";
    return all;
  };
  EXPECT_EQ(names(option_ladder(config, 2)).find("offload"), std::string::npos)
      << names(option_ladder(config, 2));

  config.device = Device::cuda;
  const MemoryPlan cuda = plan_memory(config, 1, 1);
  EXPECT_EQ(cuda.rank_need, cuda.device_peak) << "on cuda the offloaded inputs are not the GPU's";
  EXPECT_NE(names(option_ladder(config, 2)).find("offload"), std::string::npos)
      << names(option_ladder(config, 2));
}

}  // namespace
}  // namespace ulysses
