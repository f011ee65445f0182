// CudaBackend: fused LM head + cross-entropy. Rows with a target are gathered into tiles of at
// most tile_rows rows; per tile, cuBLASLt forms the logits [tile, V] in fp32, one block per
// row finds the max, argmax and log-sum-exp and writes dlogits in the compute dtype, and two
// more GEMMs give dhidden and accumulate dweight (f32). Logits never exist for all rows at
// once. Per-row losses stay on the device and are summed on the host in row order.
#include <cstdio>
#include <cub/block/block_reduce.cuh>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend_impl.cuh"

namespace ulysses {

using cuda::check_cuda;
using cuda::check_launch;
using cuda::from_float;
using cuda::kThreads;
using cuda::to_float;

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

}  // namespace

LossResult CudaBackend::lm_head_loss(const Tensor& hidden, const Tensor& weight,
                                     const Tensor& targets, int64_t tile_rows, float grad_scale,
                                     const Tensor& dhidden, const Tensor& dweight) {
  const char* op = "lm_head_loss";
  cuda::require_float(hidden, op, "hidden");
  cuda::require_same_dtype(weight, hidden, op, "weight", "hidden");
  cuda::require_dtype(targets, DType::i32, op, "targets");
  cuda::require_ndim(weight, 2, op, "weight");
  const int64_t vocab = weight.shape[0], width = weight.shape[1];
  const int64_t rows = cuda::rows_of(hidden, width, op, "hidden");
  cuda::require_numel(targets, rows, op, "targets");
  if (tile_rows < 1) throw std::invalid_argument("lm_head_loss: tile_rows must be >= 1");
  if (rows > int64_t(0x7fffffff))
    throw std::invalid_argument("lm_head_loss: more than 2^31 rows in one call");
  const bool with_grad = !dhidden.empty();
  if (with_grad) {
    cuda::require_same_dtype(dhidden, hidden, op, "dhidden", "hidden");
    cuda::require_dtype(dweight, DType::f32, op, "dweight");
    cuda::require_numel(dhidden, rows * width, op, "dhidden");
    cuda::require_numel(dweight, vocab * width, op, "dweight");
  }

  std::vector<int32_t> target_ids(static_cast<size_t>(rows));
  download(target_ids.data(), targets);
  // plan = counted row indices, then their targets.
  std::vector<int32_t> plan;
  std::vector<int32_t> counted_targets;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = target_ids[size_t(r)];
    if (target >= vocab)
      throw std::out_of_range("lm_head_loss: target " + std::to_string(target) + " at row " +
                              std::to_string(r) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
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
      gather_rows_kernel<<<cuda::blocks_for(n * width), kThreads, 0, stream_>>>(
          static_cast<T*>(h_tile.data), static_cast<const T*>(hidden.data), source_rows + start, n,
          width);
    });
    check_launch(op);
    // logits[n, V] = hidden_tile[n, C] · weight[V, C]ᵀ
    gemm(h_tile, false, weight, true, logit_tile, 1.0f, 0.0f);
    cuda::dispatch_float(hidden, op, [&](auto tag) {
      using T = decltype(tag);
      loss_rows_kernel<<<unsigned(n), kThreads, 0, stream_>>>(
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
      scatter_rows_kernel<<<cuda::blocks_for(n * width), kThreads, 0, stream_>>>(
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
