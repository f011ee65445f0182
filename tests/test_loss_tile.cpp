// memory.loss_tile_tokens: auto (kernels/op_scratch.h): 256 rows on the host, and on a device
// the tallest tile up to 4096 rows whose buffers take at most 1/128 of the memory limit.
#include <gtest/gtest.h>

#include "core/config/config.h"
#include "core/model/model.h"
#include "kernels/op_scratch.h"
#include "kernels/planning_backend.h"
#include "parallel/local_comm.h"

namespace ulysses {
namespace {

constexpr int64_t kVocab = 32000, kWidth = 2048;
// fp32 logits, bf16 d logits, bf16 hidden rows and their gradient.
constexpr int64_t kBytesPerRow = kVocab * 6 + kWidth * 4;

TEST(LossTile, OnADeviceTheTileGrowsWhileItsBuffersTakeAt128thOfTheLimit) {
  EXPECT_EQ(device_loss_tile_tokens(kVocab, kWidth, 0), kDeviceLossTileTokensMax);  // no limit
  const int64_t h200_free = int64_t(143771) << 20;
  EXPECT_EQ(device_loss_tile_tokens(kVocab, kWidth, h200_free), 4096);
  const int64_t gpu_80_gib = int64_t(79) << 30;
  EXPECT_EQ(device_loss_tile_tokens(kVocab, kWidth, gpu_80_gib), 2048);
  for (int64_t limit : {int64_t(1) << 30, int64_t(24) << 30, gpu_80_gib, h200_free}) {
    const int64_t tile = device_loss_tile_tokens(kVocab, kWidth, limit);
    // Never below the host's 256 rows, however small the limit.
    if (tile > kHostLossTileTokens) EXPECT_LE(tile * kBytesPerRow, limit / 128) << limit;
    if (tile < kDeviceLossTileTokensMax) EXPECT_GT(2 * tile * kBytesPerRow, limit / 128) << limit;
  }
  EXPECT_EQ(device_loss_tile_tokens(kVocab, kWidth, int64_t(1) << 20), kHostLossTileTokens);
}

TEST(LossTile, EachBackendAnswersAuto) {
  PlanningBackend host(BackendKind::cpu, AttentionKernel::native, 1);
  EXPECT_EQ(host.auto_loss_tile_tokens(kVocab, kWidth), kHostLossTileTokens);
  PlanningBackend device(BackendKind::cuda, AttentionKernel::native, 1);
  device.memory().set_limit(int64_t(79) << 30);
  EXPECT_EQ(device.auto_loss_tile_tokens(kVocab, kWidth), 2048);
}

TEST(LossTile, TheModelTakesTheSettingOrTheBackendsAuto) {
  Config config =
      parse_config("model:\n  d_model: 64\n  n_heads: 4\n  n_layers: 1\n", {}, "c.yaml");
  auto sp = make_local_comm("sp");
  PlanningBackend device(BackendKind::cuda, AttentionKernel::native, 1);
  device.memory().set_limit(int64_t(1) << 30);
  const int64_t expected = device_loss_tile_tokens(config.model.vocab_size, 64, int64_t(1) << 30);
  EXPECT_EQ(Model(config, device, *sp, *sp, 1, 64).loss_tile_tokens(), expected);
  config.memory.loss_tile_tokens = 48;
  EXPECT_EQ(Model(config, device, *sp, *sp, 1, 64).loss_tile_tokens(), 48);
}

}  // namespace
}  // namespace ulysses
