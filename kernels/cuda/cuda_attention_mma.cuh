// The native attention on tensor cores: FlashAttention-2's partition with bf16
// mma.sync.aligned.m16n8k16 and fp32 accumulation (docs/cuda.md, "Attention on tensor cores").
// A block of 4 warps owns 64 rows: query rows in the forward and dQ kernels, key rows in the
// dK/dV kernel; each warp owns 16 of them (one mma's m). The other side's tiles of 64 rows
// stream through shared memory, double-buffered with cp.async: tile j+1 is in flight while
// tile j is computed. Scores, the online softmax and every sum are fp32; probabilities are
// rounded to bf16 only as the operand of the next mma. Tiles of keys above the diagonal, and
// with packed documents those wholly in an earlier document, are skipped, and the element
// mask is applied only where a pair of tiles is not wholly visible (cuda_attention_mask.cuh,
// as for the FMA kernels). Same arguments, layouts and lse as the FMA kernels
// (cuda_attention_kernels.cuh), which remain for the head dims these do not take.
//
// Backward recomputes P from the saved log-sum-exp, as FlashAttention-2, in two kernels so
// that every output element is written once by one thread, with no atomics: dQ per query
// tile, dK and dV per key tile (looping over the q heads of the GQA group and the query tiles
// at or after the key tile). S and dP are thus computed twice, the price of determinism.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_attention_kernels.cuh"
#include "kernels/cuda/cuda_attention_mask.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_mma.cuh"

namespace ulysses::cuda_attention {

using ::ulysses::cuda::cp_async_16;
using ::ulysses::cuda::cp_async_commit;
using ::ulysses::cuda::cp_async_wait;
using ::ulysses::cuda::ldmatrix_x4;
using ::ulysses::cuda::ldmatrix_x4_trans;
using ::ulysses::cuda::mma_m16n8k16;
using ::ulysses::cuda::pack_bf16;

constexpr int kMmaRows = 64;  // rows of a block's own tile and of each streamed tile
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kWarpRows = kMmaRows / kMmaWarps;  // 16: one mma's m
constexpr int kScoreTiles = kMmaRows / 8;        // n-tiles of a warp's 16×64 score tile
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kMmaRows == kTile, "the mma kernels share the FMA kernels' 64-row tiling");

// Shared-memory row stride (bf16) of a tile: rows stay 16-byte aligned (cp.async, ldmatrix),
// and the 8 rows an ldmatrix reads start 4 banks apart, so they hit distinct banks.
template <int kDim>
constexpr int kMmaStride = kDim + 8;

// The tensor-core kernels take head dims that are multiples of 8 up to 128 (a cp.async piece
// is 8 bf16; the columns up to the kernel's width are zero-filled) and tensors whose rows
// start 16-byte aligned; anything else runs the FMA kernels.
constexpr bool mma_head_dim(int dim) {
  return dim % 8 == 0 && dim >= 8 && dim <= kMaxHeadDim;
}
inline bool aligned_16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
inline bool mma_attention_fits(int dim, const void* q, const void* k, const void* v,
                               const void* dout) {
  return mma_head_dim(dim) && aligned_16(q) && aligned_16(k) && aligned_16(v) && aligned_16(dout);
}

// PTX's accumulator layout (docs/cuda.md, "Fragment layouts"): element i of n-tile n held by
// this lane sits at this row and column of the warp's 16×64 tile.
__device__ __forceinline__ int fragment_row(int lane, int i) {
  return lane / 4 + 8 * (i / 2);
}
__device__ __forceinline__ int fragment_column(int lane, int n, int i) {
  return 8 * n + 2 * (lane % 4) + i % 2;
}

// Starts the copies tile[r][c] = src[(row0 + r)·row_stride + c] in 16-byte pieces, zeros for
// rows at or after rows and columns at or after dim (the caller commits the group).
template <int kDim>
__device__ void copy_tile_async(bf16* tile, const bf16* src, int64_t row0, int64_t rows,
                                int64_t row_stride, int dim) {
  constexpr int kPieces = kDim / 8;
  for (int idx = threadIdx.x; idx < kMmaRows * kPieces; idx += kMmaThreads) {
    const int r = idx / kPieces, c = idx % kPieces * 8;
    const int64_t row = row0 + r;
    const bool inside = row < rows && c < dim;
    cp_async_16(tile + r * kMmaStride<kDim> + c, inside ? src + row * row_stride + c : src, inside);
  }
}

// acc[16×64] += A·Bᵀ, A the warp's 16 rows from a_row0 of a_tile, B the 64 rows of b_tile,
// both row-major bf16 tiles [64][dim] in shared memory: S = Q·Kᵀ and dP = dO·Vᵀ (forward,
// dQ), Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (dK, dV). ldmatrix's four 8×8 matrices are A's (rows 0–7,
// 8–15) × (k 0–7, 8–15) in the order of a[0..3], and B's (n 0–7: k 0–7, 8–15), (n 8–15: k
// 0–7, 8–15), the b registers of two n-tiles.
template <int kDim>
__device__ void warp_tile_abt(float acc[kScoreTiles][4], const bf16* a_tile, int a_row0,
                              const bf16* b_tile, int dim) {
  constexpr int kStride = kMmaStride<kDim>;
  const int lane = threadIdx.x % 32;
  const int a_row = a_row0 + lane % 8 + lane / 8 % 2 * 8, a_column = lane / 16 * 8;
  const int b_row = lane % 8 + lane / 16 * 8, b_column = lane / 8 % 2 * 8;
  for (int k0 = 0; k0 < dim; k0 += 16) {
    uint32_t a[4];
    ldmatrix_x4(a, a_tile + a_row * kStride + k0 + a_column);
    for (int n = 0; n < kScoreTiles; n += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + (8 * n + b_row) * kStride + k0 + b_column);
      mma_m16n8k16(acc[n], a, b);
      mma_m16n8k16(acc[n + 1], a, b + 2);
    }
  }
}

// acc[16×dim] += P·B, P the warp's 16×64 fp32 tile in accumulator fragments, B a row-major
// bf16 tile [64][dim] in shared memory: O += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q. The
// accumulator layout of n-tiles 2j and 2j+1 is the A layout of columns 16j..16j+15, so P
// becomes an A operand in registers; B comes through ldmatrix .trans (k-major in memory).
template <int kDim>
__device__ void warp_tile_pb(float acc[kDim / 8][4], const float p[kScoreTiles][4],
                             const bf16* b_tile, int dim) {
  constexpr int kStride = kMmaStride<kDim>;
  const int lane = threadIdx.x % 32;
  const int b_row = lane % 8 + lane / 8 % 2 * 8, b_column = lane / 16 * 8;
  for (int j = 0; j < kScoreTiles / 2; ++j) {
    const uint32_t a[4] = {pack_bf16(p[2 * j][0], p[2 * j][1]), pack_bf16(p[2 * j][2], p[2 * j][3]),
                           pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]),
                           pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3])};
    for (int n = 0; n < kDim / 8 && 8 * n < dim; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + (16 * j + b_row) * kStride + 8 * n + b_column);
      mma_m16n8k16(acc[n], a, b);
      mma_m16n8k16(acc[n + 1], a, b + 2);
    }
  }
}

// Rows [row0, row0 + 16) of a warp's [16][dim] fp32 accumulators, times scale, into the bf16
// rows of dst (row stride row_stride); rows at or after rows are padding and not written.
template <int kDim>
__device__ void store_rows(bf16* dst, const float acc[kDim / 8][4], const float scale[2],
                           int64_t row0, int64_t rows, int64_t row_stride, int dim) {
  const int lane = threadIdx.x % 32;
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + fragment_row(lane, 2 * half);
    if (row >= rows) continue;
    for (int n = 0; n < kDim / 8; ++n) {
      const int column = fragment_column(lane, n, 2 * half);
      if (column >= dim) break;
      dst[row * row_stride + column] = __float2bfloat16_rn(acc[n][2 * half] * scale[half]);
      dst[row * row_stride + column + 1] = __float2bfloat16_rn(acc[n][2 * half + 1] * scale[half]);
    }
  }
}

// What a warp of the forward and dQ kernels knows of its 16 query rows: the first row, the
// document starts of this lane's two fragment rows and of the warp's last row (a padding row
// past T takes the last token's; the mask hides it anyway), and the key tiles [first, end)
// that the block's queries see.
struct WarpQueries {
  int64_t q0;
  int64_t query_start[2];
  int64_t last_start;
  int64_t first_tile, end_tile;
};

__device__ __forceinline__ WarpQueries warp_queries(const QueryTileBlock& block,
                                                    const AttentionMask& mask, int64_t T) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WarpQueries rows;
  rows.q0 = block.q0 + warp * kWarpRows;
  for (int half = 0; half < 2; ++half) {
    const int64_t query = rows.q0 + fragment_row(lane, 2 * half);
    rows.query_start[half] = document_first_key(mask, block.b, query < T ? query : T - 1);
  }
  const int64_t last = rows.q0 + kWarpRows - 1;
  rows.last_start = document_first_key(mask, block.b, last < T ? last : T - 1);
  rows.first_tile = first_key_tile(mask, block.b, block.q0, kMmaRows);
  rows.end_tile = end_key_tile(mask, block.q0 + kMmaRows - 1, T, kMmaRows);
  return rows;
}

// One step of the K, V double buffer of the forward and dQ kernels, at key tile key_tile of
// [first, end) in buffer (key_tile − first) % 2: starts the copies of the next tile into the other
// buffer, if there is one, and waits until this tile has landed, for every thread. The
// caller's __syncthreads after its last read frees the buffer for the step after.
template <int kDim>
__device__ void stream_key_tiles(bf16* k_tiles, bf16* v_tiles, int buffer, int64_t key_tile,
                                 int64_t end, const bf16* k_head, const bf16* v_head, int64_t T,
                                 int64_t kv_row_stride, int dim) {
  constexpr int kTileElements = kMmaRows * kMmaStride<kDim>;
  if (key_tile + 1 < end) {
    const int64_t next = (key_tile + 1) * kMmaRows;
    copy_tile_async<kDim>(k_tiles + (1 - buffer) * kTileElements, k_head, next, T, kv_row_stride,
                          dim);
    copy_tile_async<kDim>(v_tiles + (1 - buffer) * kTileElements, v_head, next, T, kv_row_stride,
                          dim);
  }
  cp_async_commit();   // possibly empty: the wait below always leaves exactly the newest
  cp_async_wait<1>();  // this tile's group has landed, the next one may still be in flight
  __syncthreads();     // and every thread's part of it
}

// out = softmax(scale·Q·Kᵀ, causal)·V and lse = its log-sum-exp, [B, T, H, d] and [B, H, T].
// Grid (query tiles, q heads, batch), the last (longest) query tiles first; 4 warps of 16
// query rows. Shared memory: Q, then K and V twice (double buffer).
template <int kDim>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 AttentionDims dims, AttentionMask mask = {}) {
  constexpr int kTileElements = kMmaRows * kMmaStride<kDim>;
  bf16* q_tile = reinterpret_cast<bf16*>(::ulysses::cuda::dynamic_shared_memory());
  bf16* k_tiles = q_tile + kTileElements;
  bf16* v_tiles = k_tiles + 2 * kTileElements;

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const QueryTileBlock block = query_tile_block(dims);
  const WarpQueries rows = warp_queries(block, mask, T);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16* k_head = k + block.kv_offset;
  const bf16* v_head = v + block.kv_offset;

  copy_tile_async<kDim>(q_tile, q + block.q_offset, block.q0, T, block.q_row_stride, D);
  copy_tile_async<kDim>(k_tiles, k_head, rows.first_tile * kMmaRows, T, block.kv_row_stride, D);
  copy_tile_async<kDim>(v_tiles, v_head, rows.first_tile * kMmaRows, T, block.kv_row_stride, D);
  cp_async_commit();

  float o[kDim / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = dims.scale * kLog2e;  // scores in log2 units: exp2 is one instruction
  for (int64_t key_tile = rows.first_tile; key_tile < rows.end_tile; ++key_tile) {
    const int buffer = int((key_tile - rows.first_tile) % 2);
    stream_key_tiles<kDim>(k_tiles, v_tiles, buffer, key_tile, rows.end_tile, k_head, v_head, T,
                           block.kv_row_stride, D);
    const bf16* k_tile = k_tiles + buffer * kTileElements;
    const bf16* v_tile = v_tiles + buffer * kTileElements;

    float s[kScoreTiles][4] = {};
    warp_tile_abt<kDim>(s, q_tile, warp * kWarpRows, k_tile, D);
    const int64_t k0 = key_tile * kMmaRows;
    // Padding rows (query ≥ T) are never written.
    const bool all_visible =
        tiles_fully_visible(mask, rows.q0, rows.last_start, k0, k0 + kMmaRows - 1);
    for (int n = 0; n < kScoreTiles; ++n)
      for (int i = 0; i < 4; ++i) {
        const int64_t query = rows.q0 + fragment_row(lane, i);
        const int64_t key = k0 + fragment_column(lane, n, i);
        s[n][i] = all_visible || key_visible(mask, query, rows.query_start[i / 2], key, T)
                      ? s[n][i] * scale_log2
                      : -INFINITY;
      }

    // Online softmax per row (this lane's rows g and g + 8, in i / 2): the four lanes of a row
    // agree on its max; each keeps its own part of the row sum until the end.
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
      for (int n = 0; n < kScoreTiles; ++n)
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      const float new_max = fmaxf(row_max[half], quad_max(tile_max));
      // A row that has seen no key so far (padding rows, or a document starting after this
      // tile) keeps max −∞ and sum 0: exp2(−∞ − 0) = 0, not NaN. A row that sees none of
      // this tile keeps its max and sum (correction 1, every p 0).
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = exp2f(row_max[half] - base);
      row_sum[half] *= correction;
      for (int n = 0; n < kDim / 8; ++n) {
        o[n][2 * half] *= correction;
        o[n][2 * half + 1] *= correction;
      }
      for (int n = 0; n < kScoreTiles; ++n)
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[n][2 * half + e] - base);
          s[n][2 * half + e] = p;
          row_sum[half] += p;
        }
      row_max[half] = new_max;
    }
    warp_tile_pb<kDim>(o, s, v_tile, D);
    __syncthreads();  // every warp is done with this buffer before the next copies into it
  }

  float inverse_sum[2];
  for (int half = 0; half < 2; ++half) {
    const float total = quad_sum(row_sum[half]);
    inverse_sum[half] = total > 0.0f ? 1.0f / total : 0.0f;  // a row that saw no key: out 0
    const int64_t query = rows.q0 + fragment_row(lane, 2 * half);
    if (lane % 4 == 0 && query < T)
      lse[(block.b * dims.q_heads + block.h) * T + query] = (row_max[half] + log2f(total)) / kLog2e;
  }
  store_rows<kDim>(out + block.q_offset, o, inverse_sum, rows.q0, T, block.q_row_stride, D);
}

// dQ = scale · Σ_keys dS·K with dS = P ∘ (dP − D), P = exp(scale·Q·Kᵀ − lse), dP = dO·Vᵀ and
// D = rowsum(dO ∘ O) (attention_row_dot_kernel). Grid (query tiles, q heads, batch), 4 warps
// of 16 query rows. Shared memory: Q, dO, then K and V twice.
template <int kDim>
__global__ void __launch_bounds__(kMmaThreads)
    attention_dq_mma_kernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                            const float* lse, const float* dout_dot_out, AttentionDims dims,
                            AttentionMask mask = {}) {
  constexpr int kTileElements = kMmaRows * kMmaStride<kDim>;
  bf16* q_tile = reinterpret_cast<bf16*>(::ulysses::cuda::dynamic_shared_memory());
  bf16* do_tile = q_tile + kTileElements;
  bf16* k_tiles = do_tile + kTileElements;
  bf16* v_tiles = k_tiles + 2 * kTileElements;

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const QueryTileBlock block = query_tile_block(dims);
  const WarpQueries rows = warp_queries(block, mask, T);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16* k_head = k + block.kv_offset;
  const bf16* v_head = v + block.kv_offset;

  float row_lse[2], row_d[2];  // lse in log2 units; padding rows read nothing
  for (int half = 0; half < 2; ++half) {
    const int64_t query = rows.q0 + fragment_row(lane, 2 * half);
    const int64_t stat = (block.b * dims.q_heads + block.h) * T + query;
    row_lse[half] = query < T ? lse[stat] * kLog2e : 0.0f;
    row_d[half] = query < T ? dout_dot_out[stat] : 0.0f;
  }

  copy_tile_async<kDim>(q_tile, q + block.q_offset, block.q0, T, block.q_row_stride, D);
  copy_tile_async<kDim>(do_tile, dout + block.q_offset, block.q0, T, block.q_row_stride, D);
  copy_tile_async<kDim>(k_tiles, k_head, rows.first_tile * kMmaRows, T, block.kv_row_stride, D);
  copy_tile_async<kDim>(v_tiles, v_head, rows.first_tile * kMmaRows, T, block.kv_row_stride, D);
  cp_async_commit();

  float dq_acc[kDim / 8][4] = {};
  const float scale_log2 = dims.scale * kLog2e;
  for (int64_t key_tile = rows.first_tile; key_tile < rows.end_tile; ++key_tile) {
    const int buffer = int((key_tile - rows.first_tile) % 2);
    stream_key_tiles<kDim>(k_tiles, v_tiles, buffer, key_tile, rows.end_tile, k_head, v_head, T,
                           block.kv_row_stride, D);
    const bf16* k_tile = k_tiles + buffer * kTileElements;
    const bf16* v_tile = v_tiles + buffer * kTileElements;

    float s[kScoreTiles][4] = {}, dp[kScoreTiles][4] = {};
    warp_tile_abt<kDim>(s, q_tile, warp * kWarpRows, k_tile, D);
    warp_tile_abt<kDim>(dp, do_tile, warp * kWarpRows, v_tile, D);
    const int64_t k0 = key_tile * kMmaRows;
    // Padding rows (query ≥ T) are never written.
    const bool all_visible =
        tiles_fully_visible(mask, rows.q0, rows.last_start, k0, k0 + kMmaRows - 1);
    for (int n = 0; n < kScoreTiles; ++n)
      for (int i = 0; i < 4; ++i) {
        const int64_t query = rows.q0 + fragment_row(lane, i);
        const int64_t key = k0 + fragment_column(lane, n, i);
        const float p = all_visible || key_visible(mask, query, rows.query_start[i / 2], key, T)
                            ? exp2f(s[n][i] * scale_log2 - row_lse[i / 2])
                            : 0.0f;
        s[n][i] = p * (dp[n][i] - row_d[i / 2]);  // dS
      }
    warp_tile_pb<kDim>(dq_acc, s, k_tile, D);
    __syncthreads();
  }
  const float scale[2] = {dims.scale, dims.scale};
  store_rows<kDim>(dq + block.q_offset, dq_acc, scale, rows.q0, T, block.q_row_stride, D);
}

// The query-side tiles of one step of the dK/dV kernel's loop into a buffer: q and dO rows by
// cp.async (the caller commits); lse (log2 units), D and each query's document start by plain
// stores (their rows need not be 16-byte aligned). Padding rows get zeros and the last
// token's start, and the mask hides them.
template <int kDim>
__device__ void load_query_side(bf16* q_tile, bf16* do_tile, float* stats, int32_t* starts,
                                const bf16* q, const bf16* dout, const float* lse,
                                const float* dout_dot_out, const AttentionMask& mask, int h,
                                int64_t b, int64_t q0, const AttentionDims& dims) {
  const int64_t T = dims.seq_len;
  const int64_t q_row_stride = int64_t(dims.q_heads) * dims.dim;
  const int64_t q_offset = (b * T * dims.q_heads + h) * dims.dim;
  copy_tile_async<kDim>(q_tile, q + q_offset, q0, T, q_row_stride, dims.dim);
  copy_tile_async<kDim>(do_tile, dout + q_offset, q0, T, q_row_stride, dims.dim);
  const int r = threadIdx.x % kMmaRows;
  const int64_t query = q0 + r, stat = (b * dims.q_heads + h) * T + query;
  if (threadIdx.x < kMmaRows) {
    stats[r] = query < T ? lse[stat] * kLog2e : 0.0f;
  } else {
    stats[kMmaRows + r] = query < T ? dout_dot_out[stat] : 0.0f;
    starts[r] = int32_t(document_first_key(mask, b, query < T ? query : T - 1));
  }
}

// dV = Σ Pᵀ·dO and dK = scale · Σ dSᵀ·Q over the q heads of the kv head's group and the query
// tiles at or after the key tile, computed transposed (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ) so that each
// warp owns 16 key rows of dK and dV. Grid (key tiles, kv heads, batch). Shared memory: K, V,
// then Q and dO twice, then lse and D twice, then the queries' document starts twice.
template <int kDim>
__global__ void __launch_bounds__(kMmaThreads)
    attention_dkv_mma_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                             const bf16* v, const float* lse, const float* dout_dot_out,
                             AttentionDims dims, AttentionMask mask = {}) {
  constexpr int kTileElements = kMmaRows * kMmaStride<kDim>;
  bf16* k_tile = reinterpret_cast<bf16*>(::ulysses::cuda::dynamic_shared_memory());
  bf16* v_tile = k_tile + kTileElements;
  bf16* q_tiles = v_tile + kTileElements;
  bf16* do_tiles = q_tiles + 2 * kTileElements;
  float* stats = reinterpret_cast<float*>(do_tiles + 2 * kTileElements);   // [2][lse, D][64]
  int32_t* starts = reinterpret_cast<int32_t*>(stats + 2 * 2 * kMmaRows);  // [2][64]

  const int64_t T = dims.seq_len;
  const int D = dims.dim;
  const int64_t key_tile = blockIdx.x;
  const int kv_h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int group = dims.q_heads / dims.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k0 = key_tile * kMmaRows, warp_k0 = k0 + warp * kWarpRows;
  const int64_t kv_row_stride = int64_t(dims.kv_heads) * D;
  const int64_t kv_offset = (b * T * dims.kv_heads + kv_h) * D;
  // The loop's steps: (q head of the group, query tile from the first that sees a key here to
  // the last, which holds the end of the document of the tile's last key).
  const int64_t first = first_query_tile(mask, k0, kMmaRows);
  const int64_t last_key = (k0 + kMmaRows < T ? k0 + kMmaRows : T) - 1;
  const int64_t end = end_query_tile(mask, b, last_key, T, kMmaRows);
  const int64_t per_head = end > first ? end - first : 0;
  const int64_t steps = group * per_head;

  copy_tile_async<kDim>(k_tile, k + kv_offset, k0, T, kv_row_stride, D);
  copy_tile_async<kDim>(v_tile, v + kv_offset, k0, T, kv_row_stride, D);
  load_query_side<kDim>(q_tiles, do_tiles, stats, starts, q, dout, lse, dout_dot_out, mask,
                        kv_h * group, b, first * kMmaRows, dims);
  cp_async_commit();

  float dk_acc[kDim / 8][4] = {}, dv_acc[kDim / 8][4] = {};
  const float scale_log2 = dims.scale * kLog2e;
  for (int64_t step = 0; step < steps; ++step) {
    const int buffer = int(step % 2);
    if (step + 1 < steps)
      load_query_side<kDim>(
          q_tiles + (1 - buffer) * kTileElements, do_tiles + (1 - buffer) * kTileElements,
          stats + (1 - buffer) * 2 * kMmaRows, starts + (1 - buffer) * kMmaRows, q, dout, lse,
          dout_dot_out, mask, int(kv_h * group + (step + 1) / per_head), b,
          (first + (step + 1) % per_head) * kMmaRows, dims);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* q_tile = q_tiles + buffer * kTileElements;
    const bf16* do_tile = do_tiles + buffer * kTileElements;
    const float* lse_row = stats + buffer * 2 * kMmaRows;
    const float* d_row = lse_row + kMmaRows;
    const int32_t* start_row = starts + buffer * kMmaRows;
    const int64_t q0 = (first + step % per_head) * kMmaRows;

    float s[kScoreTiles][4] = {}, dp[kScoreTiles][4] = {};  // Sᵀ and dPᵀ: key rows, query columns
    warp_tile_abt<kDim>(s, k_tile, warp * kWarpRows, q_tile, D);
    warp_tile_abt<kDim>(dp, v_tile, warp * kWarpRows, do_tile, D);
    // Padding query rows (query ≥ T) would add to every key's dK, dV: masked too.
    const bool all_visible =
        q0 + kMmaRows <= T &&
        tiles_fully_visible(mask, q0, start_row[kMmaRows - 1], warp_k0, warp_k0 + kWarpRows - 1);
    for (int n = 0; n < kScoreTiles; ++n)
      for (int i = 0; i < 4; ++i) {
        const int column = fragment_column(lane, n, i);
        const int64_t key = warp_k0 + fragment_row(lane, i), query = q0 + column;
        const float p = all_visible || key_visible(mask, query, start_row[column], key, T)
                            ? exp2f(s[n][i] * scale_log2 - lse_row[column])
                            : 0.0f;
        s[n][i] = p;
        dp[n][i] = p * (dp[n][i] - d_row[column]);  // dSᵀ
      }
    warp_tile_pb<kDim>(dv_acc, s, do_tile, D);
    warp_tile_pb<kDim>(dk_acc, dp, q_tile, D);
    __syncthreads();
  }
  const float dk_scale[2] = {dims.scale, dims.scale}, dv_scale[2] = {1.0f, 1.0f};
  store_rows<kDim>(dk + kv_offset, dk_acc, dk_scale, warp_k0, T, kv_row_stride, D);
  store_rows<kDim>(dv + kv_offset, dv_acc, dv_scale, warp_k0, T, kv_row_stride, D);
}

constexpr size_t mma_tile_bytes(int kernel_width) {
  return size_t(kMmaRows) * size_t(kernel_width + 8) * sizeof(bf16);
}

// Grid (query tiles, q heads, batch); shared memory Q + 2·(K, V).
inline LaunchShape attention_forward_mma_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.q_heads), unsigned(batch)), unsigned(kMmaThreads),
          5 * mma_tile_bytes(kernel_dim(dims.dim))};
}

// Grid (query tiles, q heads, batch); shared memory Q, dO + 2·(K, V).
inline LaunchShape attention_dq_mma_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.q_heads), unsigned(batch)), unsigned(kMmaThreads),
          6 * mma_tile_bytes(kernel_dim(dims.dim))};
}

// Grid (key tiles, kv heads, batch); shared memory K, V + 2·(Q, dO, lse, D, document starts).
inline LaunchShape attention_dkv_mma_launch(const AttentionDims& dims, int64_t batch) {
  return {dim3(query_tiles(dims), unsigned(dims.kv_heads), unsigned(batch)), unsigned(kMmaThreads),
          6 * mma_tile_bytes(kernel_dim(dims.dim)) + 2 * 2 * kMmaRows * sizeof(float) +
              2 * kMmaRows * sizeof(int32_t)};
}

}  // namespace ulysses::cuda_attention
