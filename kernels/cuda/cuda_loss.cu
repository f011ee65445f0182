// CudaBackend: fused LM head + cross-entropy. Rows with a target are gathered into tiles of at
// most tile_rows rows; per tile, cuBLASLt forms the logits [tile, V] in fp32, one block per
// row finds the max, argmax and log-sum-exp and writes dlogits in the compute dtype, and two
// more GEMMs give dhidden and accumulate dweight (f32). Logits never exist for all rows at
// once. Per-row losses stay on the device and are summed on the host in row order.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cuda_loss_kernels.cuh"
#include "kernels/op_contracts.h"

namespace ulysses {

using cuda::check_cuda;
using cuda::check_launch;
using cuda::LaunchShape;

LossResult CudaBackend::lm_head_loss_impl(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, int64_t tile_rows,
                                          float grad_scale, const Tensor& dhidden,
                                          const Tensor& dweight) {
  const char* op = "lm_head_loss";
  cuda::require_float(hidden, op, "hidden");
  cuda::require_same_dtype(weight, hidden, op, "weight", "hidden");
  cuda::require_dtype(targets, DType::i32, op, "targets");
  const int64_t vocab = weight.shape[0], width = weight.shape[1];
  const int64_t rows = hidden.numel() / width;
  if (rows > int64_t(0x7fffffff))
    throw std::invalid_argument("lm_head_loss: more than 2^31 rows in one call");
  const bool with_grad = !dhidden.empty();
  if (with_grad) {
    cuda::require_same_dtype(dhidden, hidden, op, "dhidden", "hidden");
    cuda::require_dtype(dweight, DType::f32, op, "dweight");
  }

  std::vector<int32_t> target_ids(static_cast<size_t>(rows));
  download(target_ids.data(), targets);
  // plan = counted row indices, then their targets.
  std::vector<int32_t> plan;
  std::vector<int32_t> counted_targets;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = target_ids[size_t(r)];
    contracts::check_target(target, r, vocab);
    if (target >= 0) {
      plan.push_back(int32_t(r));
      counted_targets.push_back(target);
    }
  }
  if (with_grad) fill_zero(dhidden);
  LossResult result;
  result.count = int64_t(counted_targets.size());
  if (result.count == 0) return result;
  plan.insert(plan.end(), counted_targets.begin(), counted_targets.end());

  const int64_t count = result.count;
  const int64_t tile = std::min(tile_rows, count);
  const DType dtype = hidden.dtype;
  LossScratch scratch =
      lm_head_loss_scratch(*this, BackendKind::cuda, count, tile, vocab, width, dtype, with_grad);
  Buffer& device_plan = scratch.rows_and_targets;
  upload(device_plan, plan.data());
  const int32_t* source_rows = device_plan.i32();
  const int32_t* tile_targets = source_rows + count;
  Buffer& row_loss = scratch.row_loss;
  Buffer& row_correct = scratch.row_correct;
  Buffer& logits = scratch.logits;
  Buffer& hidden_tile = scratch.hidden_tile;
  Buffer& dlogits = scratch.dlogits;
  Buffer& dhidden_tile = scratch.dhidden_tile;

  for (int64_t start = 0; start < count; start += tile) {
    const int64_t n = std::min(tile, count - start);
    const Tensor h_tile = hidden_tile.tensor().slice_rows(0, n);
    const Tensor logit_tile = logits.tensor().slice_rows(0, n);
    cuda::dispatch_float(hidden, op, [&](auto tag) {
      using T = decltype(tag);
      const LaunchShape shape = cuda::elementwise_launch(n * width);
      cuda::gather_rows_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          static_cast<T*>(h_tile.data), static_cast<const T*>(hidden.data), source_rows + start, n,
          width);
    });
    check_launch(op);
    // logits[n, V] = hidden_tile[n, C] · weight[V, C]ᵀ
    gemm(h_tile, false, weight, true, logit_tile, 1.0f, 0.0f);
    cuda::dispatch_float(hidden, op, [&](auto tag) {
      using T = decltype(tag);
      const LaunchShape shape = cuda::block_per_row_launch(n);
      cuda::loss_rows_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          logits.f32(), vocab, tile_targets + start, row_loss.f32() + start,
          row_correct.i32() + start, with_grad ? static_cast<T*>(dlogits.tensor().data) : nullptr,
          grad_scale);
    });
    check_launch(op);
    if (!with_grad) continue;

    // dhidden_tile[n, C] = dlogits[n, V] · weight[V, C]; dweight[V, C] += dlogitsᵀ · hidden_tile
    const Tensor dlogit_tile = dlogits.tensor().slice_rows(0, n);
    const Tensor dh_tile = dhidden_tile.tensor().slice_rows(0, n);
    gemm(dlogit_tile, false, weight, false, dh_tile, 1.0f, 0.0f);
    gemm(dlogit_tile, true, h_tile, false, dweight, 1.0f, 1.0f);
    cuda::dispatch_float(hidden, op, [&](auto tag) {
      using T = decltype(tag);
      const LaunchShape shape = cuda::elementwise_launch(n * width);
      cuda::scatter_rows_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          static_cast<T*>(dhidden.data), static_cast<const T*>(dh_tile.data), source_rows + start,
          n, width);
    });
    check_launch(op);
  }

  std::vector<float> losses(static_cast<size_t>(count));
  std::vector<int32_t> hits(static_cast<size_t>(count));
  download(losses.data(), row_loss);
  download(hits.data(), row_correct);
  for (int64_t i = 0; i < count; ++i) {
    result.loss_sum += double(losses[size_t(i)]);
    result.correct += hits[size_t(i)];
  }
  return result;
}

}  // namespace ulysses
