// Two whole training steps of a tiny llama and a tiny gpt2 (1 layer, d 32, T 17) with the
// CUDA backend's hand-written kernels run on the host (tests/emulated_cuda_backend.h: bf16
// weights and activations, fp32 gradients and AdamW, GEMMs on the cpu), against the cpu
// backend from the same fp32 weights and batch, tensor by tensor within the bf16 tolerances
// that the GPU's own training test uses (tests/training_comparison.h). This is the model's
// whole use of the kernels, in the model's own order and aliasing, on every machine. A run of
// the trainer on it takes the device-time path of the profiler (docs/profiling.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/report/step_report.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "tests/emulated_cuda_backend.h"
#include "tests/testing.h"
#include "tests/training_comparison.h"

namespace ulysses {
namespace {

using namespace training_test;

// Head dim 8; 17 tokens: not a multiple of a warp or the 64-row attention tile; loss tiles of
// 16 rows, so the last tile is partial.
Config tiny_config(const std::string& family, const std::string& memory = "loss_tile_tokens: 16") {
  const std::string kv = family == "llama" ? ", n_kv_heads: 2" : "";
  return parse_config("model: {family: " + family + ", n_layers: 1, d_model: 32, n_heads: 4" + kv +
                          ", d_ff: 64, vocab_size: 50, max_seq_len: 17, rope_theta: 10000}\n"
                          "train: {batch_size: 2, seq_len: 17, lr: 0.001, weight_decay: 0.1}\n"
                          "memory: {" +
                          memory +
                          "}\n"
                          "data: {source: synthetic, n_pairs: 1, n_queries: 1, n_keys: 4, "
                          "n_values: 4, n_filler: 4}\n",
                      {}, "emulated-cuda-training.yaml");
}

class EmulatedCudaTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(EmulatedCudaTraining, TwoStepsMatchCpuWithinBf16Tolerances) {
  auto emulated = make_emulated_cuda_backend();
  const Config config = tiny_config(GetParam());
  expect_steps_match_cpu(*emulated, config, config, 2);
}

// Two layers checkpointed, the MLP in 3 tiles of rows (its backward recomputes each tile and
// writes the gradients over the intermediates, SwiGLU's in place): the cpu keeps everything.
TEST_P(EmulatedCudaTraining, CheckpointedWithATiledMlpMatchesCpu) {
  auto emulated = make_emulated_cuda_backend();
  Config config = tiny_config(
      GetParam(), "loss_tile_tokens: 16, activation_checkpointing: layer, tiled_mlp: 3");
  config.model.n_layers = 2;
  expect_steps_match_cpu(*emulated, config, with_default_memory(config), 1);
}

// The device-time path on every machine (docs/profiling.md, "Device time"): the emulated
// backend's timeline reports its operations as the device's work, and the trainer writes each
// step's phases with device and host seconds and busy time, the device's busy share and its
// launches. The emulated device runs each operation as it is enqueued, so it reaches every
// phase mark when the host issues it: device and host seconds agree.
TEST(EmulatedCudaProfiling, MetricsCarryDeviceTimeBusyShareAndLaunches) {
  testing::TempDir dir;
  Config config = tiny_config("llama");
  config.train.steps = 2;  // slow: each launch runs a thread per GPU thread
  config.log.metrics_file = dir.file("m.jsonl");
  auto emulated = make_emulated_cuda_backend();
  auto world = make_local_comm();
  Mesh mesh = make_mesh(*world, 1);
  {
    Trainer trainer(config, *emulated, mesh);
    trainer.run();
  }
  std::vector<nlohmann::json> steps;
  for (const nlohmann::json& line : testing::read_metrics_lines(dir.file("m.jsonl")))
    if (line.contains("phases")) steps.push_back(line);
  ASSERT_EQ(steps.size(), 2u);
  for (const nlohmann::json& step : steps) {
    SCOPED_TRACE(step.dump());
    const double step_seconds = step["step_ms"].get<double>() / 1e3;
    double device_sum = 0.0;
    for (const std::string& name : step_phases()) {
      const std::string key = name == phase::kStep ? "other" : name;
      if (!step["phases"].contains(key)) continue;
      const nlohmann::json& phase = step["phases"][key];
      device_sum += phase["s"].get<double>();
      EXPECT_NEAR(phase["s"].get<double>(), phase["host_s"].get<double>(), 1e-9) << key;
      EXPECT_LE(phase["busy_s"].get<double>(), phase["s"].get<double>() + 1e-9) << key;
      EXPECT_GE(phase["busy_s"].get<double>(), -1e-9) << key;
    }
    EXPECT_NEAR(device_sum, step_seconds, 0.05 * step_seconds);
    EXPECT_GT(step["phases"]["mlp"]["busy_s"].get<double>(), 0.0);
    EXPECT_GT(step["device_busy"].get<double>(), 0.0);
    EXPECT_LE(step["device_busy"].get<double>(), 1.0);
    EXPECT_GT(step["launches"].get<int64_t>(), 0);
    EXPECT_GE(step["device_readback_ms"].get<double>(), 0.0);
  }
  // The same operations every step: a count that leaked across steps would differ.
  EXPECT_EQ(steps[0]["launches"], steps[1]["launches"]);
}

INSTANTIATE_TEST_SUITE_P(Families, EmulatedCudaTraining,
                         ::testing::Values(std::string("llama"), std::string("gpt2")),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ulysses
