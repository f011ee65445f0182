// CudaBackend: native causal attention, flash-style. A block owns a tile of 64 rows; q, k, v
// tiles sit in shared memory as bf16 (padded rows, so the four threads of a row and the eight
// rows of a warp hit distinct banks); scores, the online softmax and all sums are fp32.
// Thread layout: 256 threads, four per tile row; a thread owns 16 score columns
// (quad + 4j) and a quarter of the head dims (quad + 4c) of its row's accumulators.
//
// Backward recomputes probabilities from the saved log-sum-exp in two kernels: dQ per query
// tile, and dK/dV per key tile looping over the q heads of its GQA group and the query tiles
// after it. Each output element is written by one thread in a fixed order, with no atomics:
// results are bit-identical from run to run.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cudnn_attention.h"

namespace ulysses {

using cuda::bf16;
using cuda::check_cuda;
using cuda::check_launch;

namespace {

constexpr int kTile = 64;
constexpr int kAttentionThreads = 256;
constexpr int kScoresPerThread = kTile / 4;
constexpr int kScoreStride = kTile + 1;  // odd: column reads of a score tile spread over banks
constexpr int kMaxHeadDim = 128;

// Shared-memory row stride (in bf16) of a tile for head dims up to kDim: kDim + 2 makes the
// stride an odd number of 32-bit words for every kDim that is a multiple of 4.
template <int kDim>
constexpr int kTileStride = kDim + 2;

// tile[r][c] = src[(row0 + r) · row_stride + c] for c < dim, zero for rows at or after rows.
template <int kDim>
__device__ void load_tile(bf16* tile, const bf16* src, int64_t row0, int64_t rows,
                          int64_t row_stride, int dim) {
  constexpr int kStride = kTileStride<kDim>;
  for (int idx = threadIdx.x; idx < kTile * dim; idx += blockDim.x) {
    const int r = idx / dim, c = idx % dim;
    const int64_t row = row0 + r;
    tile[r * kStride + c] = row < rows ? src[row * row_stride + c] : __float2bfloat16(0.0f);
  }
}

// Σ_d a[d]·b[d] over an even dim, two bf16 at a time (rows are 4-byte aligned).
__device__ __forceinline__ float row_dot(const bf16* a, const bf16* b, int dim) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(a);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(b);
  float sum = 0.0f;
  for (int d = 0; d < dim / 2; ++d) {
    const float2 x = __bfloat1622float2(a2[d]);
    const float2 y = __bfloat1622float2(b2[d]);
    sum = fmaf(x.x, y.x, sum);
    sum = fmaf(x.y, y.y, sum);
  }
  return sum;
}

// Reductions over the four threads of a tile row (adjacent lanes).
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

struct AttentionDims {
  int64_t seq_len;
  int q_heads, kv_heads, dim;
  float scale;
};

// Grid: (query tiles, q heads, batch); the last (longest) query tiles are scheduled first.
template <int kDim>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             AttentionDims dims) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* k_tile = q_tile + kTile * kStride;
  bf16* v_tile = k_tile + kTile * kStride;
  float* probs = reinterpret_cast<float*>(v_tile + kTile * kStride);

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kv_h = h / (dims.q_heads / dims.kv_heads);
  const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
  const int64_t q0 = tile * kTile;
  const int64_t query = q0 + row;
  const int64_t q_row_stride = int64_t(dims.q_heads) * D;
  const int64_t kv_row_stride = int64_t(dims.kv_heads) * D;
  const bf16* k_head = k + (b * T * dims.kv_heads + kv_h) * D;
  const bf16* v_head = v + (b * T * dims.kv_heads + kv_h) * D;

  load_tile<kDim>(q_tile, q + (b * T * dims.q_heads + h) * D, q0, T, q_row_stride, D);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;

  for (int64_t key_tile = 0; key_tile <= tile; ++key_tile) {
    const int64_t k0 = key_tile * kTile;
    __syncthreads();  // the previous tile's k, v and probabilities are no longer read
    load_tile<kDim>(k_tile, k_head, k0, T, kv_row_stride, D);
    load_tile<kDim>(v_tile, v_head, k0, T, kv_row_stride, D);
    __syncthreads();

    float scores[kScoresPerThread];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int column = quad + 4 * j;
      const int64_t key = k0 + column;
      const float score =
          row_dot(q_tile + row * kStride, k_tile + column * kStride, D) * dims.scale;
      // Key k0 is visible from every row of this block, so the row max is always finite.
      scores[j] = key <= query && key < T ? score : -INFINITY;
      tile_max = fmaxf(tile_max, scores[j]);
    }
    const float new_max = fmaxf(row_max, quad_max(tile_max));
    const float correction = __expf(row_max - new_max);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const float p = __expf(scores[j] - new_max);
      probs[row * kScoreStride + quad + 4 * j] = p;
      sum += p;
    }
    row_sum = row_sum * correction + quad_sum(sum);
    row_max = new_max;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] *= correction;
    __syncthreads();

    for (int j = 0; j < kTile; ++j) {
      const float p = probs[row * kScoreStride + j];
      const bf16* v_row = v_tile + j * kStride;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int column = quad + 4 * c;
        if (column < D) acc[c] = fmaf(p, __bfloat162float(v_row[column]), acc[c]);
      }
    }
  }

  if (query >= T) return;
  bf16* out_row = out + ((b * T + query) * dims.q_heads + h) * D;
  const float inverse_sum = 1.0f / row_sum;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int column = quad + 4 * c;
    if (column < D) out_row[column] = __float2bfloat16_rn(acc[c] * inverse_sum);
  }
  if (quad == 0) lse[(b * dims.q_heads + h) * T + query] = row_max + logf(row_sum);
}

// D[b, h, t] = Σ_d dO·O, one warp per (b, t, h) row (grid-stride over rows).
__global__ void attention_row_dot_kernel(float* row_dot_out, const bf16* dout, const bf16* out,
                                         AttentionDims dims, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; warp < rows;
       warp += warps) {
    const bf16* o_row = out + warp * dims.dim;
    const bf16* do_row = dout + warp * dims.dim;
    float sum = 0.0f;
    for (int d = lane; d < dims.dim; d += 32)
      sum += __bfloat162float(o_row[d]) * __bfloat162float(do_row[d]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      const int64_t h = warp % dims.q_heads;
      const int64_t bt = warp / dims.q_heads;
      const int64_t b = bt / dims.seq_len, t = bt % dims.seq_len;
      row_dot_out[(b * dims.q_heads + h) * dims.seq_len + t] = sum;
    }
  }
}

// dQ = scale · Σ_keys dS K with dS = P ∘ (dP − D), P = exp(S − lse), dP = dO Vᵀ.
// Grid: (query tiles, q heads, batch).
template <int kDim>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dq_kernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const float* lse, const float* dout_dot_out, AttentionDims dims) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* do_tile = q_tile + kTile * kStride;
  bf16* k_tile = do_tile + kTile * kStride;
  bf16* v_tile = k_tile + kTile * kStride;
  float* dscores = reinterpret_cast<float*>(v_tile + kTile * kStride);

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kv_h = h / (dims.q_heads / dims.kv_heads);
  const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
  const int64_t q0 = tile * kTile;
  const int64_t query = q0 + row;
  const int64_t q_row_stride = int64_t(dims.q_heads) * D;
  const int64_t kv_row_stride = int64_t(dims.kv_heads) * D;
  const int64_t q_offset = (b * T * dims.q_heads + h) * D;
  const bf16* k_head = k + (b * T * dims.kv_heads + kv_h) * D;
  const bf16* v_head = v + (b * T * dims.kv_heads + kv_h) * D;
  const int64_t stat_index = (b * dims.q_heads + h) * T + query;
  const float row_lse = query < T ? lse[stat_index] : 0.0f;
  const float row_d = query < T ? dout_dot_out[stat_index] : 0.0f;

  load_tile<kDim>(q_tile, q + q_offset, q0, T, q_row_stride, D);
  load_tile<kDim>(do_tile, dout + q_offset, q0, T, q_row_stride, D);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;

  for (int64_t key_tile = 0; key_tile <= tile; ++key_tile) {
    const int64_t k0 = key_tile * kTile;
    __syncthreads();
    load_tile<kDim>(k_tile, k_head, k0, T, kv_row_stride, D);
    load_tile<kDim>(v_tile, v_head, k0, T, kv_row_stride, D);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int column = quad + 4 * j;
      const int64_t key = k0 + column;
      const bool visible = key <= query && key < T && query < T;
      const float score =
          row_dot(q_tile + row * kStride, k_tile + column * kStride, D) * dims.scale;
      const float p = visible ? __expf(score - row_lse) : 0.0f;
      const float dp = row_dot(do_tile + row * kStride, v_tile + column * kStride, D);
      dscores[row * kScoreStride + column] = p * (dp - row_d);
    }
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const float ds = dscores[row * kScoreStride + j];
      const bf16* k_row = k_tile + j * kStride;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int column = quad + 4 * c;
        if (column < D) acc[c] = fmaf(ds, __bfloat162float(k_row[column]), acc[c]);
      }
    }
  }

  if (query >= T) return;
  bf16* dq_row = dq + q_offset + query * q_row_stride;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int column = quad + 4 * c;
    if (column < D) dq_row[column] = __float2bfloat16_rn(acc[c] * dims.scale);
  }
}

// dV = Σ Pᵀ dO and dK = scale · Σ dSᵀ Q over the q heads of the kv head's group and the query
// tiles at or after the key tile. Grid: (key tiles, kv heads, batch); key tile 0, the longest,
// first. Scores are computed as in dQ (thread row = query row); the accumulation then gives
// each thread a key row.
template <int kDim>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dkv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                         const bf16* v, const float* lse, const float* dout_dot_out,
                         AttentionDims dims) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);
  bf16* v_tile = k_tile + kTile * kStride;
  bf16* q_tile = v_tile + kTile * kStride;
  bf16* do_tile = q_tile + kTile * kStride;
  float* probs = reinterpret_cast<float*>(do_tile + kTile * kStride);
  float* dscores = probs + kTile * kScoreStride;

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const int64_t tiles = gridDim.x;
  const int64_t key_tile = blockIdx.x;
  const int kv_h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int group = dims.q_heads / dims.kv_heads;
  const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
  const int64_t k0 = key_tile * kTile;
  const int64_t q_row_stride = int64_t(dims.q_heads) * D;
  const int64_t kv_row_stride = int64_t(dims.kv_heads) * D;
  const int64_t kv_offset = (b * T * dims.kv_heads + kv_h) * D;

  load_tile<kDim>(k_tile, k + kv_offset, k0, T, kv_row_stride, D);
  load_tile<kDim>(v_tile, v + kv_offset, k0, T, kv_row_stride, D);
  float dk_acc[kCols], dv_acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) dk_acc[c] = dv_acc[c] = 0.0f;

  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    const int64_t q_offset = (b * T * dims.q_heads + h) * D;
    for (int64_t tile = key_tile; tile < tiles; ++tile) {
      const int64_t q0 = tile * kTile;
      const int64_t query = q0 + row;
      __syncthreads();
      load_tile<kDim>(q_tile, q + q_offset, q0, T, q_row_stride, D);
      load_tile<kDim>(do_tile, dout + q_offset, q0, T, q_row_stride, D);
      __syncthreads();
      const int64_t stat_index = (b * dims.q_heads + h) * T + query;
      const float row_lse = query < T ? lse[stat_index] : 0.0f;
      const float row_d = query < T ? dout_dot_out[stat_index] : 0.0f;
#pragma unroll
      for (int j = 0; j < kScoresPerThread; ++j) {
        const int column = quad + 4 * j;
        const int64_t key = k0 + column;
        const bool visible = key <= query && key < T && query < T;
        const float score =
            row_dot(q_tile + row * kStride, k_tile + column * kStride, D) * dims.scale;
        const float p = visible ? __expf(score - row_lse) : 0.0f;
        const float dp = row_dot(do_tile + row * kStride, v_tile + column * kStride, D);
        probs[row * kScoreStride + column] = p;
        dscores[row * kScoreStride + column] = p * (dp - row_d);
      }
      __syncthreads();
      for (int i = 0; i < kTile; ++i) {
        const float p = probs[i * kScoreStride + row];
        const float ds = dscores[i * kScoreStride + row];
        const bf16* q_row = q_tile + i * kStride;
        const bf16* do_row = do_tile + i * kStride;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int column = quad + 4 * c;
          if (column < D) {
            dv_acc[c] = fmaf(p, __bfloat162float(do_row[column]), dv_acc[c]);
            dk_acc[c] = fmaf(ds, __bfloat162float(q_row[column]), dk_acc[c]);
          }
        }
      }
    }
  }

  const int64_t key = k0 + row;
  if (key >= T) return;
  bf16* dk_row = dk + kv_offset + key * kv_row_stride;
  bf16* dv_row = dv + kv_offset + key * kv_row_stride;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int column = quad + 4 * c;
    if (column < D) {
      dk_row[column] = __float2bfloat16_rn(dk_acc[c] * dims.scale);
      dv_row[column] = __float2bfloat16_rn(dv_acc[c]);
    }
  }
}

constexpr size_t tile_bytes(int dim) {
  return size_t(kTile) * size_t(dim + 2) * sizeof(bf16);
}
constexpr size_t score_bytes() {
  return size_t(kTile) * kScoreStride * sizeof(float);
}

// Kernels above 48 KiB of dynamic shared memory must opt in.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, const char* op) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             op);
}

AttentionDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const char* op) {
  cuda::require_dtype(q, DType::bf16, op, "q");
  cuda::require_dtype(k, DType::bf16, op, "k");
  cuda::require_dtype(v, DType::bf16, op, "v");
  cuda::require_dtype(out, DType::bf16, op, "out");
  cuda::require_dtype(lse, DType::f32, op, "lse");
  cuda::require_ndim(q, 4, op, "q");
  cuda::require_ndim(k, 4, op, "k");
  cuda::require_ndim(v, 4, op, "v");
  const int64_t batch = q.shape[0], seq_len = q.shape[1], q_heads = q.shape[2], dim = q.shape[3];
  const int64_t kv_heads = k.shape[2];
  const bool kv_ok = k.shape[0] == batch && k.shape[1] == seq_len && k.shape[3] == dim &&
                     v.ndim == 4 && v.shape == k.shape;
  if (!kv_ok || kv_heads == 0 || q_heads % kv_heads != 0)
    throw std::invalid_argument(std::string(op) + ": q " + q.shape_string() + ", k " +
                                k.shape_string() + ", v " + v.shape_string() +
                                " do not fit q[B, T, Hq, d], k/v[B, T, Hkv, d] with Hq % Hkv == 0");
  if (dim < 2 || dim > kMaxHeadDim || dim % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": head dim " + std::to_string(dim) +
                                " is not supported by the native cuda attention (even, 2..." +
                                std::to_string(kMaxHeadDim) + ")");
  if (batch > 65535 || q_heads > 65535)
    throw std::invalid_argument(std::string(op) + ": batch and heads must be at most 65535");
  cuda::require_numel(out, q.numel(), op, "out");
  cuda::require_numel(lse, batch * q_heads * seq_len, op, "lse");
  return {seq_len, int(q_heads), int(kv_heads), int(dim), float(1.0 / std::sqrt(double(dim)))};
}

}  // namespace

void CudaBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                    const Tensor& k, const Tensor& v) {
  const char* op = "attention_forward";
  const AttentionDims dims = check_attention(q, k, v, out, lse, op);
  if (q.numel() == 0) return;
#ifdef ULYSSES_WITH_CUDNN
  if (cudnn_attention_) return cudnn_attention_->forward(out, lse, q, k, v);
#endif
  const dim3 grid(unsigned((dims.seq_len + kTile - 1) / kTile), unsigned(dims.q_heads),
                  unsigned(q.shape[0]));
  auto launch = [&](auto kernel, int kDim) {
    const size_t bytes = 3 * tile_bytes(kDim) + score_bytes();
    allow_shared_memory(kernel, bytes, op);
    kernel<<<grid, kAttentionThreads, bytes, stream_>>>(
        static_cast<bf16*>(out.data), lse.f32(), static_cast<const bf16*>(q.data),
        static_cast<const bf16*>(k.data), static_cast<const bf16*>(v.data), dims);
  };
  if (dims.dim <= 64)
    launch(attention_forward_kernel<64>, 64);
  else
    launch(attention_forward_kernel<128>, 128);
  check_launch(op);
}

void CudaBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                     const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_backward";
  const AttentionDims dims = check_attention(q, k, v, out, lse, op);
  cuda::require_dtype(dq, DType::bf16, op, "dq");
  cuda::require_dtype(dk, DType::bf16, op, "dk");
  cuda::require_dtype(dv, DType::bf16, op, "dv");
  cuda::require_dtype(dout, DType::bf16, op, "dout");
  cuda::require_numel(dq, q.numel(), op, "dq");
  cuda::require_numel(dout, q.numel(), op, "dout");
  cuda::require_numel(dk, k.numel(), op, "dk");
  cuda::require_numel(dv, k.numel(), op, "dv");
  if (q.numel() == 0) return;
#ifdef ULYSSES_WITH_CUDNN
  if (cudnn_attention_) return cudnn_attention_->backward(dq, dk, dv, dout, q, k, v, out, lse);
#endif
  const int64_t batch = q.shape[0];

  Buffer row_dot = alloc(MemCategory::attention, DType::f32, {batch, dims.q_heads, dims.seq_len},
                         "attention_backward dO·O");
  const int64_t rows = batch * dims.seq_len * dims.q_heads;
  attention_row_dot_kernel<<<cuda::blocks_for(rows * 32), cuda::kThreads, 0, stream_>>>(
      row_dot.f32(), static_cast<const bf16*>(dout.data), static_cast<const bf16*>(out.data), dims,
      rows);
  check_launch(op);

  const unsigned tiles = unsigned((dims.seq_len + kTile - 1) / kTile);
  const auto* dout_data = static_cast<const bf16*>(dout.data);
  const auto* q_data = static_cast<const bf16*>(q.data);
  const auto* k_data = static_cast<const bf16*>(k.data);
  const auto* v_data = static_cast<const bf16*>(v.data);
  auto launch = [&](auto dq_kernel, auto dkv_kernel, int kDim) {
    const size_t dq_bytes = 4 * tile_bytes(kDim) + score_bytes();
    allow_shared_memory(dq_kernel, dq_bytes, op);
    dq_kernel<<<dim3(tiles, unsigned(dims.q_heads), unsigned(batch)), kAttentionThreads, dq_bytes,
                stream_>>>(static_cast<bf16*>(dq.data), dout_data, q_data, k_data, v_data,
                           lse.f32(), row_dot.f32(), dims);
    check_launch(op);
    const size_t dkv_bytes = 4 * tile_bytes(kDim) + 2 * score_bytes();
    allow_shared_memory(dkv_kernel, dkv_bytes, op);
    dkv_kernel<<<dim3(tiles, unsigned(dims.kv_heads), unsigned(batch)), kAttentionThreads,
                 dkv_bytes, stream_>>>(static_cast<bf16*>(dk.data), static_cast<bf16*>(dv.data),
                                       dout_data, q_data, k_data, v_data, lse.f32(), row_dot.f32(),
                                       dims);
    check_launch(op);
  };
  if (dims.dim <= 64)
    launch(attention_dq_kernel<64>, attention_dkv_kernel<64>, 64);
  else
    launch(attention_dq_kernel<128>, attention_dkv_kernel<128>, 128);
}

}  // namespace ulysses
