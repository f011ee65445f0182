// The activation-memory options (docs/memory.md) proven on tracked bytes under mpirun with 2
// and 4 ranks: head chunks (UPipe) cut the attention peak to about 1/U, a tiled MLP cuts the
// MLP peak by the tile count and gives the untiled results, and with everything on
// (ZeRO-3, layer checkpointing, offloaded layer inputs, one head per stage, tiled MLP) a
// step's working memory is two layer inputs, four [R, C] buffers, a loss tile and one head
// stage, whatever the number of layers. Offloaded inputs that move
// (as on cuda; run here on a cpu backend told that its host memory is apart) give the same
// bits and leave two layer inputs on the device.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "core/config/config.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/op_scratch.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"
#include "tests/mpi/training_bounds.h"

namespace ulysses {
namespace {

class MemoryOptions : public testing::MpiTest {
 protected:
  // The tracked peaks of one training step. separate_host: the offloaded layer inputs move
  // out and back as on a device backend (docs/memory.md).
  MemoryStats step_peaks(const Config& config, bool separate_host = false) {
    auto backend = std::make_unique<CpuBackend>(0);
    if (separate_host) backend->treat_host_memory_as_separate();
    backend->set_num_threads(1);
    Mesh mesh = make_mesh(world(), config.parallel.sp);
    Trainer trainer(config, *backend, mesh);
    trainer.train_step();  // first touches and one-off buffers out of the way
    backend->memory().reset_peaks();
    trainer.train_step();
    return backend->memory().stats();
  }
};

// A model wide enough in heads for stages: 16 heads of dim 8, sp = the world.
Config wide_config(const std::string& family, int kv_heads, int layers, int sp) {
  Config config = testing::tiny_training_config(family, 4, sp, 2);
  config.model.n_layers = layers;
  config.model.d_model = 128;
  config.model.n_heads = 16;
  config.model.n_kv_heads = kv_heads;
  config.model.d_ff = family == "llama" ? 352 : 512;
  config.train.seq_len = 256;
  config.model.max_seq_len = 256;
  config.train.grad_accum = 1;
  config.memory.activation_checkpointing = ActivationCheckpointing::layer;
  return config;
}

int64_t peak(const MemoryStats& stats, MemCategory category) {
  return stats.peak[int(category)];
}

// Per stage the full-sequence q/k/v/out (and the backward's dout/dq/dk/dv) of h/U heads live
// at once; what stays is the layer's attention output [B, Tl, H, d] and the lse of every
// stage [B, H/P, N] f32.
TEST_F(MemoryOptions, HeadChunksCutTheAttentionPeakToOneStage) {
  const int P = world().size();
  for (const auto& [family, kv_heads] : {std::pair{"gpt2", 16}, std::pair{"llama", 4}}) {
    Config config = wide_config(family, kv_heads, 2, P);
    const MemoryStats one = step_peaks(config);
    const int64_t B = 2, Tl = 256 / P, H = 16, d = 8, N = 256;
    const int64_t fixed = B * Tl * H * d * 4 + B * (H / P) * N * 4;
    // Stages of at least one whole kv group, so k and v shrink with q.
    const int group = 16 / kv_heads, per_rank = 16 / P;
    for (int chunks = 2; chunks <= per_rank / group; chunks *= 2) {
      config.parallel.head_chunks = chunks;
      const MemoryStats staged = step_peaks(config);
      const double bound =
          (1.0 / chunks + 0.05) * double(peak(one, MemCategory::attention)) + double(fixed);
      EXPECT_LE(double(peak(staged, MemCategory::attention)), bound)
          << family << " head_chunks " << chunks << ": U = 1 peaks at "
          << peak(one, MemCategory::attention);
    }
  }
}

TEST_F(MemoryOptions, TiledMlpCutsTheMlpPeakByTheTileCount) {
  for (const std::string family : {"llama", "gpt2"}) {
    Config config = wide_config(family, family == "llama" ? 4 : 16, 2, world().size());
    const int64_t untiled = peak(step_peaks(config), MemCategory::mlp);
    config.memory.tiled_mlp = {TiledMlp::Mode::tiles, 4};
    const int64_t tiled = peak(step_peaks(config), MemCategory::mlp);
    EXPECT_LE(tiled, untiled / 4) << family << ": untiled " << untiled;
    EXPECT_GT(tiled, 0) << family;
  }
}

// Tiles sum the MLP's weight gradients tile by tile where one GEMM sums all rows: the same
// sums in another order, within the bounds of tests/mpi/training_bounds.h.
TEST_F(MemoryOptions, TiledMlpGivesTheUntiledLossesAndGradients) {
  for (const std::string family : {"llama", "gpt2"}) {
    for (const TiledMlp tiles :
         {TiledMlp{TiledMlp::Mode::tiles, 4}, TiledMlp{TiledMlp::Mode::automatic, 0}}) {
      Config config = testing::tiny_training_config(family, 2, world().size(), 2);
      if (family == "gpt2") config.model.n_kv_heads = config.model.n_heads;
      const testing::TrainingOutcome untiled = testing::train_for(config, world(), 3);
      config.memory.tiled_mlp = tiles;
      const testing::TrainingOutcome tiled = testing::train_for(config, world(), 3);
      testing::expect_same_training(tiled, untiled, config,
                                    testing::tokens_per_step(config, world().size()),
                                    family + " tiled_mlp " + tiled_mlp_text(tiles));
    }
  }
}

// ZeRO-3, layer checkpointing with the layer inputs offloaded (and moving, as on cuda), one
// head per stage and a tiled MLP: at no time does a step hold more device memory outside the
// model state than two layer inputs and four [R, C] working buffers, plus one tile of the
// fused loss, the buffers of one head stage and a few values per row, whatever the depth;
// only the host's copies of the layer inputs grow with it (docs/memory.md, "With everything
// on"). The loss tile is small so that the peak is the stage's: a stage's buffer kept into
// the next stage would then break the bound.
TEST_F(MemoryOptions, WithEverythingOnAStepHoldsTwoInputsFourRowBuffersALossTileAndOneStage) {
  const int P = world().size();
  const int64_t B = 2, Tl = 256 / P, N = 256, C = 128, H = 16, d = 8, R = B * Tl;
  const int64_t row_buffer = R * C * 4;  // [R, C] f32
  for (const auto& [family, kv_heads] : {std::pair{"gpt2", 16}, std::pair{"llama", 4}}) {
    std::map<int, MemoryStats> by_depth;
    Config config;
    for (int layers : {2, 4}) {
      config = wide_config(family, kv_heads, layers, P);
      config.parallel.zero_stage = 3;
      config.parallel.head_chunks = int(H) / P;
      config.memory.offload_checkpoints = true;
      config.memory.tiled_mlp = {TiledMlp::Mode::automatic, 0};
      config.memory.loss_tile_tokens = 8;
      by_depth[layers] = step_peaks(config, true);
    }
    const int64_t loss_tile =
        config.memory.loss_tile_tokens * (config.model.vocab_size + 2 * C) * 4;
    // With U = H/P a stage has one q head and one kv head. Its backward holds the most at
    // once: the all-to-all buffers q, k, v, out and d out received in the head layout and
    // dq, dk, dv sent back from it, each [B, N, 1, d], and the attention kernel's scratch.
    const int64_t stage_tensor = B * N * d * 4;
    CpuBackend scratch_backend(0);
    const int64_t kernel_scratch =
        int64_t(cpu_attention_backward_scratch(scratch_backend, 1, d).bytes() +
                attention_row_dot(scratch_backend, B, 1, N).bytes());
    const int64_t stage = 8 * stage_tensor + kernel_scratch;
    // Per row: tokens, targets and the norms' statistics (rstd of the two block norms and the
    // final one, and their means for layernorm), and the lse of every head [B, H/P, N].
    const int64_t row_values =
        (std::string(family) == "gpt2" ? 8 : 5) * R * 4 + B * (H / P) * N * 4;
    const int64_t bound = 6 * row_buffer + loss_tile + stage + row_values;
    for (const auto& [layers, stats] : by_depth) {
      std::string held;
      for (int i = 0; i < kNumMemCategories; ++i)
        held += std::string(" ") + mem_category_name(MemCategory(i)) + " " +
                std::to_string(stats.peak[size_t(i)]);
      EXPECT_LE(stats.working_peak, bound)
          << family << ", " << layers << " layers: [R, C] is " << row_buffer
          << " bytes, the loss tile " << loss_tile << ", a stage " << stage
          << ", the values per row " << row_values << "; peaks:" << held;
    }
    EXPECT_EQ(by_depth[4].working_peak, by_depth[2].working_peak) << family;
    EXPECT_EQ(peak(by_depth[2], MemCategory::checkpoints), 2 * row_buffer) << family;
    EXPECT_EQ(peak(by_depth[4], MemCategory::checkpoints_host) -
                  peak(by_depth[2], MemCategory::checkpoints_host),
              2 * row_buffer)
        << family;
  }
}

// The inputs copied out as the forward makes them and back one layer ahead in backward: two
// stay on the device whatever the depth, the host holds one per layer, and training gives the
// bits of the run that keeps them all on the device. A copy brought back into the wrong slot,
// or waited for too late on a device, would change the losses.
TEST_F(MemoryOptions, OffloadThatMovesKeepsTwoInputsOnTheDeviceAndTheSameBits) {
  const int P = world().size();
  const int64_t layer_input = 2 * (256 / P) * 128 * 4;
  for (int layers : {1, 3}) {
    Config config = wide_config("llama", 4, layers, P);
    config.memory.offload_checkpoints = true;
    const MemoryStats moved = step_peaks(config, true);
    EXPECT_EQ(peak(moved, MemCategory::checkpoints), 2 * layer_input);
    EXPECT_EQ(peak(moved, MemCategory::checkpoints_host), layers * layer_input);

    std::unique_ptr<CpuBackend> separate = testing::make_test_cpu_backend();
    separate->treat_host_memory_as_separate();
    const testing::TrainingOutcome offloaded = testing::train_on(*separate, config, world(), 3);
    config.memory.offload_checkpoints = false;
    const testing::TrainingOutcome kept = testing::train_for(config, world(), 3);
    EXPECT_EQ(offloaded.losses, kept.losses) << layers << " layers";
    EXPECT_EQ(offloaded.grad_norms, kept.grad_norms) << layers << " layers";
    EXPECT_EQ(offloaded.params, kept.params) << layers << " layers";
  }
}

// With a tiled MLP the recompute pass stops before the MLP (the backward recomputes each
// tile): moving the layer inputs then needs no buffer for the recomputed block's output, and
// the bits are those of the run that keeps its inputs on the device.
TEST_F(MemoryOptions, TiledMlpIsNotRecomputedTwiceAndMovedInputsNeedNoOutputBuffer) {
  const int P = world().size();
  const int64_t layer_input = 2 * (256 / P) * 128 * 4;
  Config config = wide_config("llama", 4, 3, P);
  config.memory.offload_checkpoints = true;
  const MemoryStats untiled_moved = step_peaks(config, true);
  const MemoryStats untiled_kept = step_peaks(config);
  EXPECT_EQ(peak(untiled_moved, MemCategory::workspace),
            peak(untiled_kept, MemCategory::workspace) + layer_input);
  config.memory.tiled_mlp = {TiledMlp::Mode::tiles, 4};
  const MemoryStats moved = step_peaks(config, true);
  const MemoryStats kept = step_peaks(config);
  EXPECT_EQ(peak(moved, MemCategory::workspace), peak(kept, MemCategory::workspace));

  std::unique_ptr<CpuBackend> separate = testing::make_test_cpu_backend();
  separate->treat_host_memory_as_separate();
  const testing::TrainingOutcome offloaded = testing::train_on(*separate, config, world(), 2);
  config.memory.offload_checkpoints = false;
  const testing::TrainingOutcome on_device = testing::train_for(config, world(), 2);
  EXPECT_EQ(offloaded.losses, on_device.losses);
  EXPECT_EQ(offloaded.params, on_device.params);
}

}  // namespace
}  // namespace ulysses
