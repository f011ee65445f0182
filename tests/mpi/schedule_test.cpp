// The step schedule changes where collectives are issued and waited for, never the
// arithmetic: losses, gradient norms and weights after 5 steps are bit-identical to values
// recorded from the code before the schedule existed (tests/mpi/golden/schedule.txt), for
// sp 1/2/4, ZeRO stages 0-3, with and without layer checkpointing, llama (GQA) and gpt2,
// on 4 ranks. Re-recorded when the initial weights became counter-based (core/model/param_init.h;
// with the earlier weights put back, that code reproduced the values before it bit for bit),
// and once more when the trainer tests moved to the portable GEMM: the values no longer depend
// on the GEMM kernels OpenBLAS picks for a CPU (docs/design.md, "Bits that do not depend on the
// machine"). To re-record after an intended change of the arithmetic:
//   ULYSSES_RECORD_SCHEDULE_GOLDEN=1 mpirun -np 4 build/tests/mpi/schedule_test
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "parallel/mpi_comm.h"
#include "parallel/progress_thread.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

const std::string kGolden = std::string(ULYSSES_SOURCE_DIR) + "/tests/mpi/golden/schedule.txt";

// Exact text of a double: its bits in hex.
std::string bits(double value) {
  uint64_t word;
  std::memcpy(&word, &value, sizeof word);
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", (unsigned long long)word);
  return text;
}

// FNV-1a over the bytes of every weight.
std::string fingerprint(const std::vector<float>& values) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", (unsigned long long)hash);
  return text;
}

// "losses ... | norms ... | weights hash"
std::string outcome_line(const testing::TrainingOutcome& outcome) {
  std::string line;
  for (double loss : outcome.losses) line += bits(loss) + " ";
  line += "|";
  for (double norm : outcome.grad_norms) line += " " + bits(norm);
  return line + " | " + fingerprint(outcome.params);
}

// "llama sp2 zero3 layer" -> outcome_line
std::map<std::string, std::string> read_golden() {
  std::map<std::string, std::string> golden;
  std::ifstream in(kGolden);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    if (line.empty() || line[0] == '#' || colon == std::string::npos) continue;
    golden[line.substr(0, colon)] = line.substr(colon + 2);
  }
  return golden;
}

class Schedule : public testing::MpiTest {};

// Why the recorded bits may not hold here, or "" when they do. They are the portable GEMM's,
// and the loader picks one code path by CPU: attention's tile loops (kernels/cpu/cpu_attention.cpp)
// have a build for AVX2 and FMA (x86-64-v3, every such CPU runs it) and a baseline one, which
// rounds differently. glibc's libm also has FMA variants; the values here do not change with
// them (GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA gives the same bits).
std::string why_the_recorded_bits_do_not_apply() {
  if (testing::test_gemm() != CpuGemm::portable)
    return "the recorded values are the portable GEMM's; ULYSSES_TEST_GEMM=openblas is set";
#if defined(__clang__)
  return "the recorded values are GCC's build: clang contracts a·b + c into an FMA at other "
         "places, so its bits differ";
#elif defined(__x86_64__) && defined(__GNUC__)
  if (!__builtin_cpu_supports("x86-64-v3"))
    return "the recorded values are for CPUs with AVX2 and FMA (x86-64-v3); on this one "
           "attention's tile loops run their baseline build, which rounds differently";
  return "";
#else
  return "the recorded values are for x86-64 CPUs with AVX2 and FMA";
#endif
}

TEST_F(Schedule, EveryStageAndSpGivesTheRecordedBitsAfterFiveSteps) {
  ASSERT_EQ(world().size(), 4) << "the recorded values are for 4 ranks";
  const std::string not_here = why_the_recorded_bits_do_not_apply();
  if (!not_here.empty()) GTEST_SKIP() << not_here;
  const bool record = std::getenv("ULYSSES_RECORD_SCHEDULE_GOLDEN") != nullptr;
  const std::map<std::string, std::string> golden = read_golden();
  std::ostringstream recorded;
  for (const std::string family : {"llama", "gpt2"}) {
    for (int sp : {1, 2, 4}) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (const ActivationCheckpointing checkpointing :
             {ActivationCheckpointing::none, ActivationCheckpointing::layer}) {
          Config config = testing::tiny_training_config(family, 2, sp, 2);
          if (family == "gpt2") config.model.n_kv_heads = config.model.n_heads;
          config.parallel.zero_stage = stage;
          config.parallel.bucket_mb = 1e-6;  // one unit per layer: the most collectives
          config.memory.activation_checkpointing = checkpointing;
          const std::string line = outcome_line(testing::train_for(config, world(), 5));
          const std::string key = family + " sp" + std::to_string(sp) + " zero" +
                                  std::to_string(stage) + " " + name_of(checkpointing);
          recorded << key << ": " << line << "\n";
          if (record) continue;
          auto expected = golden.find(key);
          ASSERT_NE(expected, golden.end()) << key << " is not in " << kGolden;
          EXPECT_EQ(line, expected->second) << key;
        }
      }
    }
  }
  if (record && world().rank() == 0) {
    std::ofstream out(kGolden);
    out << "# losses (5 steps, double bits) | gradient norms | FNV-1a of the weights, per setup.\n"
        << "# Written by tests/mpi/schedule_test.cpp with ULYSSES_RECORD_SCHEDULE_GOLDEN=1.\n"
        << recorded.str();
  }
}

// Prefetch off, and a progress thread driving MPI while units compute: the bits of the default
// schedule in this process (which the test above compares with the recorded values).
TEST_F(Schedule, WithoutPrefetchAndWithAProgressThreadTheBitsAreTheSame) {
  std::unique_ptr<Comm> owned = world().split(0, world().rank(), "world with progress");
  auto* with_progress = dynamic_cast<MpiComm*>(owned.get());
  ASSERT_NE(with_progress, nullptr);
  if (mpi_thread_multiple()) with_progress->start_progress_thread();
  for (int stage : {2, 3}) {
    Config config = testing::tiny_training_config("llama", 2, 2, 2);
    config.parallel.zero_stage = stage;
    config.parallel.bucket_mb = 1e-6;
    const std::string expected = outcome_line(testing::train_for(config, world(), 5));
    for (const bool prefetch : {false, true}) {
      config.parallel.prefetch = prefetch;
      const testing::TrainingOutcome outcome = testing::train_for(config, *owned, 5);
      EXPECT_EQ(outcome_line(outcome), expected)
          << "llama sp2 zero" << stage << (prefetch ? " with prefetch" : " without prefetch");
    }
  }
}

}  // namespace
}  // namespace ulysses
