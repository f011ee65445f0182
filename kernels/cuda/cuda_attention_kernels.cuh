// The native attention kernels on FMA units (see cuda_attention.cu for the design), for the
// head dims and tensors the tensor-core kernels (cuda_attention_mma.cuh) do not take; apart from
// their launches so that they can also run on the host: tests/test_cuda_attention_emulated.cpp and
// tests/test_backend_ops.cpp execute them thread by thread. The device environment is
// kernels/cuda/cuda_device.cuh (on the host, tests/cuda_emulation.h included first).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_attention_mask.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace ulysses::cuda_attention {

using ::ulysses::cuda::bf16;
using ::ulysses::cuda::dynamic_shared_memory;
using ::ulysses::cuda::LaunchShape;

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

// The query tile of this block on a grid (query tiles, q heads, batch), the last (longest)
// tiles scheduled first: its first row q0, its q head and the kv head the head reads (GQA by
// index), and where their rows lie in [B, T, H, d] (offset of row 0, stride between rows).
struct QueryTileBlock {
  int64_t b, q0;
  int h, kv_h;
  int64_t q_offset, q_row_stride, kv_offset, kv_row_stride;
};

__device__ __forceinline__ QueryTileBlock query_tile_block(const AttentionDims& dims) {
  QueryTileBlock block;
  block.b = blockIdx.z;
  block.q0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * kTile;
  block.h = blockIdx.y;
  block.kv_h = block.h / (dims.q_heads / dims.kv_heads);
  block.q_offset = (block.b * dims.seq_len * dims.q_heads + block.h) * dims.dim;
  block.q_row_stride = int64_t(dims.q_heads) * dims.dim;
  block.kv_offset = (block.b * dims.seq_len * dims.kv_heads + block.kv_h) * dims.dim;
  block.kv_row_stride = int64_t(dims.kv_heads) * dims.dim;
  return block;
}

// Grid: (query tiles, q heads, batch); the last (longest) query tiles are scheduled first.
// Key tiles before the document of the tile's first query, and past its last query, are
// skipped (cuda_attention_mask.cuh). A query that sees no key gets out 0 and lse −inf.
template <int kDim>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             AttentionDims dims, AttentionMask mask = {}) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  unsigned char* shared = dynamic_shared_memory();
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* k_tile = q_tile + kTile * kStride;
  bf16* v_tile = k_tile + kTile * kStride;
  float* probs = reinterpret_cast<float*>(v_tile + kTile * kStride);

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const QueryTileBlock block = query_tile_block(dims);
  const int64_t b = block.b, q0 = block.q0;
  const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
  const int64_t query = q0 + row;
  const int64_t kv_row_stride = block.kv_row_stride;
  const bf16* k_head = k + block.kv_offset;
  const bf16* v_head = v + block.kv_offset;

  load_tile<kDim>(q_tile, q + block.q_offset, q0, T, block.q_row_stride, D);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;
  const int64_t query_start = document_first_key(mask, b, query < T ? query : T - 1);

  const int64_t end_tile = end_key_tile(mask, q0 + kTile - 1, T, kTile);
  for (int64_t key_tile = first_key_tile(mask, b, q0, kTile); key_tile < end_tile; ++key_tile) {
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
      // A row may see no key of this tile (an earlier document's, or rows past T): its
      // max stays -inf and the correction below is then taken as 1.
      scores[j] = key_visible(mask, query, query_start, key, T) ? score : -INFINITY;
      tile_max = fmaxf(tile_max, scores[j]);
    }
    const float new_max = fmaxf(row_max, quad_max(tile_max));
    const float correction = new_max == -INFINITY ? 1.0f : __expf(row_max - new_max);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const float p = new_max == -INFINITY ? 0.0f : __expf(scores[j] - new_max);
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
  bf16* out_row = out + block.q_offset + query * block.q_row_stride;
  const float inverse_sum = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int column = quad + 4 * c;
    if (column < D) out_row[column] = __float2bfloat16_rn(acc[c] * inverse_sum);
  }
  if (quad == 0) lse[(b * dims.q_heads + block.h) * T + query] = row_max + logf(row_sum);
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

// Ring attention's merge (kernels/backend.h, attention_block_forward with merge): out and lse
// hold the blocks merged so far, block_out and block_lse one more block over the same
// queries; in f32, lse = log(e^lse + e^block_lse) and out = out·e^(lse_old − lse) +
// block_out·e^(block_lse − lse). A row that has seen no key in either keeps out 0, lse −inf.
// One warp per (b, t, h) row, grid-stride, as attention_row_dot_kernel.
__global__ void attention_merge_kernel(bf16* out, float* lse, const bf16* block_out,
                                       const float* block_lse, AttentionDims dims, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; warp < rows;
       warp += warps) {
    const int64_t h = warp % dims.q_heads;
    const int64_t bt = warp / dims.q_heads;
    const int64_t b = bt / dims.seq_len, t = bt % dims.seq_len;
    const int64_t stat = (b * dims.q_heads + h) * dims.seq_len + t;
    const float old_lse = lse[stat], new_lse = block_lse[stat];
    const float larger = fmaxf(old_lse, new_lse);
    float merged = -INFINITY, old_weight = 0.0f, block_weight = 0.0f;
    if (larger != -INFINITY) {
      merged = larger + logf(expf(old_lse - larger) + expf(new_lse - larger));
      old_weight = expf(old_lse - merged);
      block_weight = expf(new_lse - merged);
    }
    bf16* o_row = out + warp * dims.dim;
    const bf16* block_row = block_out + warp * dims.dim;
    for (int d = lane; d < dims.dim; d += 32)
      o_row[d] = __float2bfloat16_rn(__bfloat162float(o_row[d]) * old_weight +
                                     __bfloat162float(block_row[d]) * block_weight);
    __syncwarp();
    if (lane == 0) lse[stat] = merged;
  }
}

// dQ = scale · Σ_keys dS K with dS = P ∘ (dP − D), P = exp(S − lse), dP = dO Vᵀ.
// Grid: (query tiles, q heads, batch).
template <int kDim>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dq_kernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const float* lse, const float* dout_dot_out, AttentionDims dims,
                        AttentionMask mask = {}) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  unsigned char* shared = dynamic_shared_memory();
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* do_tile = q_tile + kTile * kStride;
  bf16* k_tile = do_tile + kTile * kStride;
  bf16* v_tile = k_tile + kTile * kStride;
  float* dscores = reinterpret_cast<float*>(v_tile + kTile * kStride);

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const QueryTileBlock block = query_tile_block(dims);
  const int64_t b = block.b, q0 = block.q0;
  const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
  const int64_t query = q0 + row;
  const int64_t q_row_stride = block.q_row_stride, kv_row_stride = block.kv_row_stride;
  const int64_t q_offset = block.q_offset;
  const bf16* k_head = k + block.kv_offset;
  const bf16* v_head = v + block.kv_offset;
  const int64_t stat_index = (b * dims.q_heads + block.h) * T + query;
  const float row_lse = query < T ? lse[stat_index] : 0.0f;
  const float row_d = query < T ? dout_dot_out[stat_index] : 0.0f;

  load_tile<kDim>(q_tile, q + q_offset, q0, T, q_row_stride, D);
  load_tile<kDim>(do_tile, dout + q_offset, q0, T, q_row_stride, D);
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;

  const int64_t query_start = document_first_key(mask, b, query < T ? query : T - 1);
  const int64_t end_tile = end_key_tile(mask, q0 + kTile - 1, T, kTile);
  for (int64_t key_tile = first_key_tile(mask, b, q0, kTile); key_tile < end_tile; ++key_tile) {
    const int64_t k0 = key_tile * kTile;
    __syncthreads();
    load_tile<kDim>(k_tile, k_head, k0, T, kv_row_stride, D);
    load_tile<kDim>(v_tile, v_head, k0, T, kv_row_stride, D);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int column = quad + 4 * j;
      const int64_t key = k0 + column;
      const bool visible = key_visible(mask, query, query_start, key, T);
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
                         AttentionDims dims, AttentionMask mask = {}) {
  constexpr int kStride = kTileStride<kDim>;
  constexpr int kCols = kDim / 4;
  unsigned char* shared = dynamic_shared_memory();
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

  // Query tiles that start after the document of the tile's last key see none of its keys.
  const int64_t last_key = (k0 + kTile < T ? k0 + kTile : T) - 1;
  const int64_t end_tile = end_query_tile(mask, b, last_key, T, kTile);
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    const int64_t q_offset = (b * T * dims.q_heads + h) * D;
    for (int64_t tile = first_query_tile(mask, k0, kTile); tile < end_tile && tile < tiles;
         ++tile) {
      const int64_t q0 = tile * kTile;
      const int64_t query = q0 + row;
      const int64_t query_start = document_first_key(mask, b, query < T ? query : T - 1);
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
        const bool visible = key_visible(mask, query, query_start, key, T);
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

// Dynamic shared memory of each kernel for head dims up to kDim (the launch's third parameter).
constexpr size_t forward_shared_bytes(int dim) {
  return 3 * tile_bytes(dim) + score_bytes();
}
constexpr size_t dq_shared_bytes(int dim) {
  return 4 * tile_bytes(dim) + score_bytes();
}
constexpr size_t dkv_shared_bytes(int dim) {
  return 4 * tile_bytes(dim) + 2 * score_bytes();
}

// The kernels are instantiated for head dims up to 64 and up to 128.
constexpr int kernel_dim(int dim) {
  return dim <= 64 ? 64 : 128;
}

inline unsigned query_tiles(const AttentionDims& dims) {
  return unsigned((dims.seq_len + kTile - 1) / kTile);
}

// Grid (query tiles, q heads, batch).
inline LaunchShape attention_forward_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.q_heads), unsigned(batch)),
          unsigned(kAttentionThreads), forward_shared_bytes(kernel_dim(dims.dim))};
}

// One warp per (b, t, h) row, grid-stride.
inline LaunchShape attention_row_dot_launch(int64_t rows) {
  return ::ulysses::cuda::elementwise_launch(rows * 32);
}

// One warp per (b, t, h) row, grid-stride.
inline LaunchShape attention_merge_launch(int64_t rows) {
  return ::ulysses::cuda::elementwise_launch(rows * 32);
}

// Grid (query tiles, q heads, batch).
inline LaunchShape attention_dq_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.q_heads), unsigned(batch)),
          unsigned(kAttentionThreads), dq_shared_bytes(kernel_dim(dims.dim))};
}

// Grid (key tiles, kv heads, batch).
inline LaunchShape attention_dkv_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.kv_heads), unsigned(batch)),
          unsigned(kAttentionThreads), dkv_shared_bytes(kernel_dim(dims.dim))};
}

}  // namespace ulysses::cuda_attention
