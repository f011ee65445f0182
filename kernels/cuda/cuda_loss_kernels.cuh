// The LM head + loss kernels (launched by cuda_loss.cu around its cuBLASLt GEMMs), apart from
// their launches so that the host emulation can run them too (tests/test_backend_ops.cpp):
// gathering counted rows into a tile and scattering their gradients back (grid-stride,
// elementwise_launch), and per row of the tile the max, argmax, log-sum-exp and dlogits (one
// block per row, block_per_row_launch). The tile loop around them (lm_head_loss_tiles) is
// shared too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/op_contracts.h"
#include "kernels/op_scratch.h"
#ifdef __CUDACC__
#include <cub/block/block_reduce.cuh>
#endif

namespace ulysses::cuda {

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
namespace {

struct ArgMax {
  float value;
  int64_t index;
};

// The larger value; on ties the smaller index (the first maximum, as the cpu backend).
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index < b.index ? a : b;
  }
};

template <typename T>
__global__ void gather_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t count,
                                   int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count * width;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[int64_t(rows[i / width]) * width + i % width];
}

template <typename T>
__global__ void scatter_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t count,
                                    int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count * width;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[int64_t(rows[i / width]) * width + i % width] = src[i];
}

// One block per row of the tile.
template <typename T>
__global__ void loss_rows_kernel(const float* logits, int64_t vocab, const int32_t* targets,
                                 float* row_loss, int32_t* row_correct, T* dlogits,
                                 float grad_scale) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  ArgMax best{-INFINITY, vocab};
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (x[j] > best.value) best = {x[j], j};
  }
  using MaxReduce = cub::BlockReduce<ArgMax, kThreads>;
  using SumReduce = cub::BlockReduce<float, kThreads>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename SumReduce::TempStorage sum;
  } storage;
  __shared__ ArgMax row_best;
  __shared__ float row_sum;
  const ArgMax reduced = MaxReduce(storage.max).Reduce(best, ArgMaxOp());
  if (threadIdx.x == 0) row_best = reduced;
  __syncthreads();
  const float max_logit = row_best.value;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += __expf(x[j] - max_logit);
  const float reduced_sum = SumReduce(storage.sum).Sum(sum);
  if (threadIdx.x == 0) row_sum = reduced_sum;
  __syncthreads();
  const int32_t target = targets[row];
  if (threadIdx.x == 0) {
    row_loss[row] = max_logit + logf(row_sum) - x[target];
    row_correct[row] = row_best.index == target;
  }
  if (!dlogits) return;
  const float factor = grad_scale / row_sum;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float grad = __expf(x[j] - max_logit) * factor - (j == target ? grad_scale : 0.0f);
    dlogits[row * vocab + j] = from_float<T>(grad);
  }
}

// Backend::lm_head_loss on the cuda backend, shared with the host emulation: the rows with a
// target are gathered into tiles; per tile backend.gemm forms the logits [tile, V] (cuBLASLt on
// the device), loss_rows_kernel the per-row loss and dlogits, and two more GEMMs give dhidden
// and accumulate dweight. Per-row losses are summed on the host in row order. T is the dtype
// of hidden; launch(shape, kernel, args...) runs one kernel, on the stream (StreamLaunch,
// kernels/cuda/cuda_common.cuh) or on the host (tests/cuda_emulation.h).
template <typename T, typename Launch>
LossResult lm_head_loss_tiles(Backend& backend, const Launch& launch, const Tensor& hidden,
                              const Tensor& weight, const Tensor& targets, int64_t tile_rows,
                              float grad_scale, const Tensor& dhidden, const Tensor& dweight) {
  const int64_t vocab = weight.shape[0], width = weight.shape[1];
  const int64_t rows = hidden.numel() / width;
  const bool with_grad = !dhidden.empty();
  std::vector<int32_t> target_ids(static_cast<size_t>(rows));
  backend.download(target_ids.data(), targets);
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
  if (with_grad) backend.fill_zero(dhidden);
  LossResult result;
  result.count = int64_t(counted_targets.size());
  if (result.count == 0) return result;
  plan.insert(plan.end(), counted_targets.begin(), counted_targets.end());

  const int64_t count = result.count;
  const int64_t tile = std::min(tile_rows, count);
  LossScratch scratch = lm_head_loss_scratch(backend, BackendKind::cuda, count, tile, vocab, width,
                                             hidden.dtype, with_grad);
  backend.upload(scratch.rows_and_targets, plan.data());
  const int32_t* source_rows = scratch.rows_and_targets.i32();
  const int32_t* tile_targets = source_rows + count;
  T* dlogits = with_grad ? static_cast<T*>(scratch.dlogits.tensor().data) : nullptr;

  for (int64_t start = 0; start < count; start += tile) {
    const int64_t n = std::min(tile, count - start);
    const Tensor h_tile = scratch.hidden_tile.tensor().slice_rows(0, n);
    const Tensor logit_tile = scratch.logits.tensor().slice_rows(0, n);
    launch(elementwise_launch(n * width), gather_rows_kernel<T>, static_cast<T*>(h_tile.data),
           static_cast<const T*>(hidden.data), source_rows + start, n, width);
    // logits[n, V] = hidden_tile[n, C] · weight[V, C]ᵀ
    backend.gemm(h_tile, false, weight, true, logit_tile, 1.0f, 0.0f);
    launch(block_per_row_launch(n), loss_rows_kernel<T>, scratch.logits.f32(), vocab,
           tile_targets + start, scratch.row_loss.f32() + start, scratch.row_correct.i32() + start,
           dlogits, grad_scale);
    if (!with_grad) continue;

    // dhidden_tile[n, C] = dlogits[n, V] · weight[V, C]; dweight[V, C] += dlogitsᵀ · hidden_tile
    const Tensor dlogit_tile = scratch.dlogits.tensor().slice_rows(0, n);
    const Tensor dh_tile = scratch.dhidden_tile.tensor().slice_rows(0, n);
    backend.gemm(dlogit_tile, false, weight, false, dh_tile, 1.0f, 0.0f);
    backend.gemm(dlogit_tile, true, h_tile, false, dweight, 1.0f, 1.0f);
    launch(elementwise_launch(n * width), scatter_rows_kernel<T>, static_cast<T*>(dhidden.data),
           static_cast<const T*>(dh_tile.data), source_rows + start, n, width);
  }

  std::vector<float> losses(static_cast<size_t>(count));
  std::vector<int32_t> hits(static_cast<size_t>(count));
  backend.download(losses.data(), scratch.row_loss);
  backend.download(hits.data(), scratch.row_correct);
  for (int64_t i = 0; i < count; ++i) {
    result.loss_sum += double(losses[size_t(i)]);
    result.correct += hits[size_t(i)];
  }
  return result;
}

}  // namespace

}  // namespace ulysses::cuda
