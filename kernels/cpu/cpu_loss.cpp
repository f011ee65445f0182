// CpuBackend: fused LM head + cross-entropy. Only rows with a target are processed, gathered
// into tiles of at most tile_rows rows, so logits exist for one tile at a time ([tile, V],
// never [R, V]); the tile's dlogits overwrite its logits in place.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/op_contracts.h"
#include "kernels/op_scratch.h"

namespace ulysses {

LossResult CpuBackend::lm_head_loss_impl(const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets, int64_t tile_rows, float grad_scale,
                                         const Tensor& dhidden, const Tensor& dweight) {
  const char* op = "lm_head_loss";
  const int64_t vocab = weight.shape[0], width = weight.shape[1];
  const int64_t rows = hidden.numel() / width;
  const bool with_grad = !dhidden.empty();
  if (with_grad) {
  }

  const int32_t* target_ids = targets.i32();
  std::vector<int64_t> counted;
  for (int64_t r = 0; r < rows; ++r) {
    contracts::check_target(target_ids[r], r, vocab);
    if (target_ids[r] >= 0) counted.push_back(r);
  }
  if (with_grad) fill_zero(dhidden);
  LossResult result;
  result.count = int64_t(counted.size());
  if (counted.empty()) return result;

  const int64_t tile = std::min(tile_rows, result.count);
  LossScratch scratch = lm_head_loss_scratch(*this, BackendKind::cpu, result.count, tile, vocab,
                                             width, DType::f32, with_grad);
  Buffer& logits = scratch.logits;
  Buffer& hidden_tile = scratch.hidden_tile;
  Buffer& dhidden_tile = scratch.dhidden_tile;
  std::vector<double> row_loss(static_cast<size_t>(tile));
  std::vector<char> row_correct(static_cast<size_t>(tile));

  const float* h_data = hidden.f32();
  const float* w_data = weight.f32();
  float* logit_data = logits.f32();
  float* h_tile = hidden_tile.f32();
  for (int64_t start = 0; start < result.count; start += tile) {
    const int64_t n = std::min(tile, result.count - start);
    const int64_t* tile_source_rows = counted.data() + start;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* src = h_data + tile_source_rows[i] * width;
      std::copy(src, src + width, h_tile + i * width);
    }
    // logits[n, V] = hidden_tile[n, C] · weight[V, C]ᵀ
    sgemm(false, true, n, vocab, width, 1.0f, h_tile, width, w_data, width, 0.0f, logit_data,
          vocab);

    // Per row: argmax (first on ties), log-sum-exp with the max subtracted, and, for the
    // backward, grad_scale · (softmax − onehot) written over the logits.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* row = logit_data + i * vocab;
      const int32_t target = target_ids[tile_source_rows[i]];
      int64_t argmax = 0;
      for (int64_t j = 1; j < vocab; ++j) {
        if (row[j] > row[argmax]) argmax = j;
      }
      const float max_logit = row[argmax];
      const float target_logit = row[target];
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < vocab; ++j) {
        row[j] = cpu::fast_exp(row[j] - max_logit);
        sum += row[j];
      }
      const double lse = double(max_logit) + std::log(sum);
      row_loss[size_t(i)] = lse - double(target_logit);
      row_correct[size_t(i)] = argmax == target;
      if (with_grad) {
        const float factor = float(double(grad_scale) / sum);
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) row[j] *= factor;
        row[target] -= grad_scale;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      result.loss_sum += row_loss[size_t(i)];
      result.correct += row_correct[size_t(i)];
    }
    if (!with_grad) continue;

    // dhidden_tile[n, C] = dlogits[n, V] · weight[V, C]; dweight[V, C] += dlogitsᵀ · hidden_tile
    float* dh_tile = dhidden_tile.f32();
    sgemm(false, false, n, width, vocab, 1.0f, logit_data, vocab, w_data, width, 0.0f, dh_tile,
          width);
    sgemm(true, false, vocab, width, n, 1.0f, logit_data, vocab, h_tile, width, 1.0f, dweight.f32(),
          width);
    float* dh_data = dhidden.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* src = dh_tile + i * width;
      std::copy(src, src + width, dh_data + tile_source_rows[i] * width);
    }
  }
  return result;
}

}  // namespace ulysses
