// One whole training step (Model forward/backward + AdamW) on the cuda backend against the
// cpu backend, from the same fp32 weights and batch. The cuda model computes in bf16 (weights
// cast from the fp32 masters, bf16 activations, fp32 gradients), so agreement is within
// stated bf16 tolerances rather than round-off. Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/config/config.h"
#include "kernels/backend.h"
#include "testing.h"
#include "tests/training_comparison.h"

namespace ulysses {
namespace {

using testing::cuda_backend_or_reason;

using namespace training_test;

Config training_config(const std::string& family,
                       const std::string& memory = "loss_tile_tokens: 64") {
  const std::string kv = family == "llama" ? ", n_kv_heads: 2" : "";
  return parse_config("model: {family: " + family + ", n_layers: 2, d_model: 128, n_heads: 4" + kv +
                          ", d_ff: 256, vocab_size: 300, max_seq_len: 160, rope_theta: 10000}\n"
                          "train: {batch_size: 2, seq_len: 160, lr: 0.001, weight_decay: 0.1}\n"
                          "memory: {" +
                          memory +
                          "}\n"
                          "data: {source: synthetic, n_pairs: 1, n_queries: 1, n_keys: 4, "
                          "n_values: 4, n_filler: 4}\n",
                      {}, "cuda-training.yaml");
}

// (family, kernels.attention)
class CudaTraining : public ::testing::TestWithParam<std::tuple<std::string, AttentionKernel>> {};

TEST_P(CudaTraining, OneStepMatchesCpuWithinBf16Tolerances) {
  std::string reason;
  std::unique_ptr<Backend> gpu = cuda_backend_or_reason(reason, std::get<1>(GetParam()));
  if (!gpu) GTEST_SKIP() << reason;
  const Config config = training_config(std::get<0>(GetParam()));
  expect_steps_match_cpu(*gpu, config, config, 1);
}

// Layer inputs copied to pinned host memory on a side stream and brought back one layer ahead
// (docs/memory.md), a tiled MLP whose backward recomputes each tile, and the recompute pass
// that stops before it: the step still matches the cpu's, which keeps everything in place.
TEST_P(CudaTraining, WithOffloadedInputsAndATiledMlpOneStepMatchesCpu) {
  std::string reason;
  std::unique_ptr<Backend> gpu = cuda_backend_or_reason(reason, std::get<1>(GetParam()));
  if (!gpu) GTEST_SKIP() << reason;
  const Config config = training_config(std::get<0>(GetParam()),
                                        "loss_tile_tokens: 64, activation_checkpointing: layer, "
                                        "offload_checkpoints: true, tiled_mlp: 3");
  expect_steps_match_cpu(*gpu, config, with_default_memory(config), 1);
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndAttention, CudaTraining,
    ::testing::Combine(::testing::Values(std::string("llama"), std::string("gpt2")),
                       ::testing::Values(AttentionKernel::native, AttentionKernel::cudnn)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, AttentionKernel>>& info) {
      return std::get<0>(info.param) + "_" + name_of(std::get<1>(info.param));
    });

}  // namespace
}  // namespace ulysses
