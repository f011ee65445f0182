// CpuBackend: attention, flash-style. Queries and keys are cut into tiles of kTile rows; a
// query tile meets the key tiles up to the diagonal with an online softmax, so only
// O(tile² + tile·d) scratch per thread ever exists. Backward recomputes the probabilities
// from the saved log-sum-exp in two passes (query tiles for dQ, key tiles for dK and dV) so
// that every output element is written by one task in a fixed order: results are
// bit-identical for any thread count. With packed documents (kernels/documents.h) a query
// row sees only the keys of its own document, and key tiles that lie wholly before the
// document of a query tile's first row are never visited, so the work follows Σ doc_len²
// (docs/parallelism.md, "Packed documents"). The attention over one sequence is the block
// attention of ring attention (kernels/backend.h) with both blocks at position 0: one code.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/op_contracts.h"
#include "kernels/op_scratch.h"

namespace ulysses {

namespace {

// Head dims are padded inside the scratch tiles so that the inner loops have whole vectors;
// tiles and padding are kernels/op_scratch.h's, which sizes the scratch for the planner too.
constexpr int64_t kTile = kCpuAttentionTile;

// The shape of attention's inputs and the tiling of its sequences on the cpu.
struct AttentionShape {
  int64_t batch, seq_len, q_heads, kv_heads, dim, padded_dim, tiles;
  float scale;
};

// The front checked the shapes and dtypes (kernels/op_contracts.h).
AttentionShape checked_shape(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const char* op) {
  const contracts::AttentionShape in = contracts::attention_shape(q, k);
  return {in.batch,
          in.seq_len,
          in.q_heads,
          in.kv_heads,
          in.dim,
          cpu_attention_padded_dim(in.dim),
          (in.seq_len + kTile - 1) / kTile,
          float(1.0 / std::sqrt(double(in.dim)))};
}

// Hands out consecutive pieces of one thread's scratch slice.
class ScratchCursor {
 public:
  explicit ScratchCursor(float* base) : next_(base) {}
  float* take(int64_t count) {
    float* piece = next_;
    next_ += count;
    return piece;
  }

 private:
  float* next_;
};

// tile[r][c] = factor · src[r·stride + c] for r < rows, c < dim; zero up to [kTile][pdim].
void load_rows(float* tile, const float* src, int64_t stride, int64_t rows, int64_t dim,
               int64_t pdim, float factor) {
  for (int64_t r = 0; r < kTile; ++r) {
    float* row = tile + r * pdim;
    const int64_t filled = r < rows ? dim : 0;
    for (int64_t c = 0; c < filled; ++c) row[c] = factor * src[r * stride + c];
    std::fill(row + filled, row + pdim, 0.0f);
  }
}

// The tile loops below are compiled twice, for AVX2 + FMA and for the baseline the project
// builds for (x86-64-v2), and the loader picks the one the CPU runs: 256-bit vectors and FMA
// double their speed. Each machine always uses the same one, so results stay bit-identical
// from run to run.
#if defined(__GNUC__) && defined(__x86_64__)
#define ULYSSES_TILE_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ULYSSES_TILE_KERNEL
#endif

// Eight floats: one AVX register, or two SSE registers in the baseline build. The product
// below keeps a 6 × 16 block of c in registers, which plain loops do not get from GCC.
// Every tile is 64-byte aligned with rows of whole multiples of 16 floats, so tiles can be
// read as Vec8 directly.
typedef float Vec8 __attribute__((vector_size(32), may_alias));
// The same, at any float's address: rows of the inputs.
typedef float UnalignedVec8 __attribute__((vector_size(32), aligned(4), may_alias));

// The three rounds of an 8 × 8 transpose's lane picks, each of 8 of the 16 lanes of (x, y), y's
// lanes numbered 8..15 (__builtin_shufflevector: GCC 12 and clang both have it). By reference:
// a vector by value would take the baseline build's ABI.
inline __attribute__((always_inline)) void interleave_pairs(const Vec8& x, const Vec8& y, Vec8& low,
                                                            Vec8& high) {
  low = __builtin_shufflevector(x, y, 0, 8, 1, 9, 4, 12, 5, 13);
  high = __builtin_shufflevector(x, y, 2, 10, 3, 11, 6, 14, 7, 15);
}
inline __attribute__((always_inline)) void interleave_quads(const Vec8& x, const Vec8& y, Vec8& low,
                                                            Vec8& high) {
  low = __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13);
  high = __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
}
inline __attribute__((always_inline)) void join_halves(const Vec8& x, const Vec8& y, Vec8& low,
                                                       Vec8& high) {
  low = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11);
  high = __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
}

// out[c·out_stride + r] = in[r·in_stride + c] for r, c < 8: eight rows in registers, transposed by
// shuffles (pairs of rows interleaved, then pairs of pairs, then the 128-bit halves).
inline __attribute__((always_inline)) void transpose_8x8(float* out, int64_t out_stride,
                                                         const float* in, int64_t in_stride) {
  Vec8 row[8], pair[8], quad[8];
  for (int r = 0; r < 8; ++r) row[r] = *reinterpret_cast<const UnalignedVec8*>(in + r * in_stride);
  for (int r = 0; r < 8; r += 2) interleave_pairs(row[r], row[r + 1], pair[r], pair[r + 1]);
  // quad[q + 4·h]: columns q and q + 4 of rows 4h..4h+3.
  for (int h = 0; h < 2; ++h) {
    const Vec8* pairs = pair + 4 * h;
    interleave_quads(pairs[0], pairs[2], quad[4 * h + 0], quad[4 * h + 1]);
    interleave_quads(pairs[1], pairs[3], quad[4 * h + 2], quad[4 * h + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    Vec8 column, column_plus_4;
    join_halves(quad[q], quad[q + 4], column, column_plus_4);
    *reinterpret_cast<UnalignedVec8*>(out + q * out_stride) = column;
    *reinterpret_cast<UnalignedVec8*>(out + (q + 4) * out_stride) = column_plus_4;
  }
}

// tile[c][r] = src[r·stride + c], the transposed layout [pdim][kTile], zero-padded: 8 × 8
// blocks transposed in registers, the edges one element at a time.
ULYSSES_TILE_KERNEL void load_columns(float* tile, const float* src, int64_t stride, int64_t rows,
                                      int64_t dim, int64_t pdim) {
  if (rows < kTile || dim < pdim) std::fill(tile, tile + pdim * kTile, 0.0f);
  const int64_t block_rows = rows / 8 * 8, block_columns = dim / 8 * 8;
  for (int64_t r = 0; r < block_rows; r += 8)
    for (int64_t c = 0; c < block_columns; c += 8)
      transpose_8x8(tile + c * kTile + r, kTile, src + r * stride + c, stride);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first_column = r < block_rows ? block_columns : 0;
    for (int64_t c = first_column; c < dim; ++c) tile[c * kTile + r] = src[r * stride + c];
  }
}

// Rows i0 .. i0 + kRows − 1, columns j0 .. j0 + 15 of tile_matmul's c, held in registers while
// p runs: every element is the same chain of multiply-adds over p in order, whatever the block.
template <int kRows>
inline __attribute__((always_inline)) void tile_matmul_block(float* c, const float* a,
                                                             int64_t a_row, int64_t a_col,
                                                             const float* b, int64_t n, int64_t k,
                                                             bool accumulate, int64_t i0,
                                                             int64_t j0) {
  Vec8 acc[kRows][2] = {};
  for (int r = 0; r < kRows && accumulate; ++r) {
    const Vec8* c_row = reinterpret_cast<const Vec8*>(c + (i0 + r) * n + j0);
    acc[r][0] = c_row[0];
    acc[r][1] = c_row[1];
  }
  for (int64_t p = 0; p < k; ++p) {
    const Vec8* b_row = reinterpret_cast<const Vec8*>(b + p * n + j0);
    for (int r = 0; r < kRows; ++r) {
      const float a_ip = a[(i0 + r) * a_row + p * a_col];
      acc[r][0] += a_ip * b_row[0];
      acc[r][1] += a_ip * b_row[1];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    Vec8* c_row = reinterpret_cast<Vec8*>(c + (i0 + r) * n + j0);
    c_row[0] = acc[r][0];
    c_row[1] = acc[r][1];
  }
}

// c[i][j] (+)= Σ_p a(i, p) · b[p][j] for i < kTile, j < n (a multiple of 16), p < k, where
// a(i, p) = a[i·a_row + p·a_col]: (a_row, a_col) = (k, 1) reads a as [kTile][k], and
// (1, kTile) reads it transposed from [k][kTile]. Adds to c when accumulate is set,
// overwrites it otherwise. Blocks of 6 × 16 keep 12 vectors of sums in flight (12 of AVX2's 16
// registers), enough to hide the multiply-add's latency on two FMA units; the rows left over
// (4 of 64) take one smaller block.
ULYSSES_TILE_KERNEL void tile_matmul(float* c, const float* a, int64_t a_row, int64_t a_col,
                                     const float* b, int64_t n, int64_t k, bool accumulate) {
  constexpr int kRows = 6;
  constexpr int64_t kBlockedRows = kTile / kRows * kRows;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    for (int64_t i0 = 0; i0 < kBlockedRows; i0 += kRows)
      tile_matmul_block<kRows>(c, a, a_row, a_col, b, n, k, accumulate, i0, j0);
    if constexpr (kBlockedRows < kTile)
      tile_matmul_block<kTile - kBlockedRows>(c, a, a_row, a_col, b, n, k, accumulate, kBlockedRows,
                                              j0);
  }
}

// The keys of a key tile (first key at position key0, k_rows rows) that the tile's query row i
// (position q0 + i) sees under attention_visible (kernels/backend.h) are one run of columns,
// [first, end), empty when first >= end: the causal rule ends it, the query's document start
// (row_start[i]: the document start of each query row of the tile; null without documents)
// begins it. The loops mask by these two bounds, which keeps them vectorised; as 32-bit
// integers (a tile has 64 keys) the masks compare eight lanes per instruction on AVX2, not four.
struct VisibleRun {
  int32_t first, end;
};

VisibleRun visible_run(const int64_t* row_start, int64_t q0, int64_t q_rows, int64_t k0,
                       int64_t k_rows, int64_t i) {
  if (i >= q_rows) return {0, 0};
  const int64_t query = q0 + i;
  int64_t end = std::clamp<int64_t>(query - k0 + 1, 0, k_rows);
  while (end > 0 && !attention_visible(query, k0 + end - 1)) --end;
  const int64_t first = row_start ? std::max<int64_t>(row_start[i] - k0, 0) : 0;
  return {int32_t(std::min(first, kTile)), int32_t(end)};
}

// Tiles are visited only where the causal rule can make a key visible: a key tile starting
// after a query tile's last query is skipped (the document rule skips the tiles before the
// first query's document where the loops begin).
inline bool tile_may_see(int64_t last_query, int64_t key0) {
  return attention_visible(last_query, key0);
}

// The document start of each of the `rows` positions from `first` on of every sequence,
// [B·rows], in the positions the starts are given in (empty without documents).
std::vector<int64_t> row_document_starts(const Documents& documents, int64_t first, int64_t rows) {
  std::vector<int64_t> start_of;
  start_of.reserve(documents.starts.size() * size_t(rows));
  for (const std::vector<int64_t>& starts : documents.starts)
    for (int64_t t = first; t < first + rows; ++t) start_of.push_back(document_start(starts, t));
  return start_of;
}

// Forward online-softmax step for one [kTile][kTile] score tile: scores become the
// probabilities relative to the new running max, running sums are updated, and rows of the
// output accumulator are rescaled by exp(old max − new max).
// q0 and k0 are the positions of the tiles' first query and key.
ULYSSES_TILE_KERNEL void online_softmax_tile(float* scores, float* o_tile, float* row_max,
                                             float* row_sum, const int64_t* row_start, int64_t q0,
                                             int64_t q_rows, int64_t k0, int64_t k_rows,
                                             int64_t pdim) {
  constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < kTile; ++i) {
    float* p = scores + i * kTile;
    const VisibleRun keys = visible_run(row_start, q0, q_rows, k0, k_rows, i);
    const int32_t first = keys.first, end = keys.end;
    if (end <= first) {
      std::fill(p, p + kTile, 0.0f);
      continue;
    }
    // The loops compute every lane and select with masks (cpu_common.h), so they vectorise. The
    // bounds are plain locals: read from the struct in the loop, GCC left the loop scalar once
    // visible_run was not inlined (scripts/cpu-vectorisation.sh checks every such loop).
    float tile_max = kMinusInfinity;
#pragma omp simd reduction(max : tile_max)
    for (int32_t j = 0; j < int32_t(kTile); ++j) {
      const float score = p[j];
      tile_max = cpu::vector_max(
          tile_max, cpu::select(cpu::mask_if(j >= first && j < end), score, kMinusInfinity));
    }
    const float new_max = std::max(row_max[i], tile_max);
    const float correction = cpu::fast_exp(row_max[i] - new_max);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int32_t j = 0; j < int32_t(kTile); ++j) {
      const float value =
          cpu::select(cpu::mask_if(j >= first && j < end), cpu::fast_exp(p[j] - new_max), 0.0f);
      p[j] = value;
      sum += value;
    }
    row_sum[i] = row_sum[i] * correction + sum;
    row_max[i] = new_max;
    float* o_row = o_tile + i * pdim;
#pragma omp simd
    for (int64_t c = 0; c < pdim; ++c) o_row[c] *= correction;
  }
}

// Backward: probs becomes P = exp(S − lse) and dprobs becomes dS = P ∘ (dP − D), both zero
// where masked; tile_lse and tile_d hold lse and D of the tile's query rows; q0 and k0 are
// the positions of the tiles' first query and key.
ULYSSES_TILE_KERNEL void softmax_grad_tile(float* probs, float* dprobs, const float* tile_lse,
                                           const float* tile_d, const int64_t* row_start,
                                           int64_t q0, int64_t q_rows, int64_t k0, int64_t k_rows) {
  for (int64_t i = 0; i < kTile; ++i) {
    float* p = probs + i * kTile;
    float* dp = dprobs + i * kTile;
    const VisibleRun keys = visible_run(row_start, q0, q_rows, k0, k_rows, i);
    const int32_t first = keys.first, end = keys.end;
    const float row_lse = tile_lse[i], row_d = tile_d[i];
#pragma omp simd
    for (int32_t j = 0; j < int32_t(kTile); ++j) {
      const float prob =
          cpu::select(cpu::mask_if(j >= first && j < end), cpu::fast_exp(p[j] - row_lse), 0.0f);
      p[j] = prob;
      dp[j] = prob * (dp[j] - row_d);
    }
  }
}

// One query tile of one (sequence, q head): where its rows lie in q, out, dq and dO
// ([B, T, Hq, d]) and in lse and D ([B, Hq, T]), and the document start of each row (null
// without documents).
struct QueryTile {
  int64_t q0, rows, offset, stat_offset;
  const int64_t* row_start;
};

QueryTile query_tile(const AttentionShape& s, const std::vector<int64_t>& start_of, int64_t b,
                     int64_t h, int64_t tile) {
  const int64_t q0 = tile * kTile;
  return {q0, std::min(kTile, s.seq_len - q0), ((b * s.seq_len + q0) * s.q_heads + h) * s.dim,
          (b * s.q_heads + h) * s.seq_len + q0,
          start_of.empty() ? nullptr : &start_of[size_t(b * s.seq_len + q0)]};
}

// The tasks over query tiles run in (b, q head, tile) order with the longest (last) tiles
// first; each writes only its own rows, so the schedule cannot change the results. Key tiles
// before the document of the tile's first row are masked whole: the task starts after them.
struct QueryTask {
  int64_t b, h, kv_h;
  QueryTile tile;
  int64_t first_key_tile;
};

QueryTask query_task(const AttentionShape& s, const std::vector<int64_t>& start_of, int64_t task,
                     int64_t k_first) {
  const int64_t h = (task / s.tiles) % s.q_heads;
  const int64_t b = task / (s.tiles * s.q_heads);
  const QueryTile tile = query_tile(s, start_of, b, h, s.tiles - 1 - task % s.tiles);
  const int64_t first_key_tile =
      tile.row_start ? std::max<int64_t>(tile.row_start[0] - k_first, 0) / kTile : 0;
  return {b, h, h / (s.q_heads / s.kv_heads), tile, first_key_tile};
}

// One key tile of one (sequence, kv head): where its rows lie in k, v, dk and dv.
struct KeyTile {
  int64_t k0, rows, offset;
};

KeyTile key_tile_of(const AttentionShape& s, int64_t b, int64_t kv_h, int64_t key_tile) {
  const int64_t k0 = key_tile * kTile;
  return {k0, std::min(kTile, s.seq_len - k0), ((b * s.seq_len + k0) * s.kv_heads + kv_h) * s.dim};
}

// One thread's slice of the backward's scratch (kernels/op_scratch.h sizes it): the query
// side (q pre-scaled by 1/√d, dO, lse and D of the rows), the key side (K and V transposed,
// K as rows), P and dS, and the accumulators of the two passes (dQ; dK and dV).
struct BackwardTiles {
  float *q, *dout, *kt, *vt, *k, *dq, *dk, *dv, *probs, *dprobs, *lse, *d;
  BackwardTiles(float* slice, int64_t pdim) {
    ScratchCursor cursor(slice);
    for (float** tile : {&q, &dout, &kt, &vt, &k, &dq, &dk, &dv}) *tile = cursor.take(kTile * pdim);
    probs = cursor.take(kTile * kTile);
    dprobs = cursor.take(kTile * kTile);
    lse = cursor.take(kTile);
    d = cursor.take(kTile);
  }
};

}  // namespace

void CpuBackend::attention_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                                        const Tensor& k, const Tensor& v,
                                        const Documents& documents) {
  attention_block_forward_impl(out, lse, q, k, v, 0, 0, false, documents);
}

void CpuBackend::attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                         const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         const Documents& documents) {
  block_backward(dq, dk, dv, dout, q, k, v, out, lse, 0, 0, documents, false);
}

void CpuBackend::attention_block_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                               const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const Tensor& out,
                                               const Tensor& lse, int64_t q_first, int64_t k_first,
                                               const Documents& documents) {
  block_backward(dq, dk, dv, dout, q, k, v, out, lse, q_first, k_first, documents, true);
}

void CpuBackend::attention_block_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                                              const Tensor& k, const Tensor& v, int64_t q_first,
                                              int64_t k_first, bool merge,
                                              const Documents& documents) {
  const AttentionShape s = checked_shape(q, k, v, out, lse, "attention_forward");
  const std::vector<int64_t> start_of = row_document_starts(documents, q_first, s.seq_len);
  const int64_t pdim = s.padded_dim;
  const int64_t q_stride = s.q_heads * s.dim, kv_stride = s.kv_heads * s.dim;
  Buffer scratch = cpu_attention_forward_scratch(*this, omp_get_max_threads(), s.dim);
  const int64_t per_thread = scratch.tensor().dim(1);

  const float* q_data = q.f32();
  const float* k_data = k.f32();
  const float* v_data = v.f32();
  float* out_data = out.f32();
  float* lse_data = lse.f32();
  const int64_t tasks = s.batch * s.q_heads * s.tiles;
#pragma omp parallel
  {
    ScratchCursor cursor(scratch.f32() + omp_get_thread_num() * per_thread);
    float* q_tile = cursor.take(kTile * pdim);
    float* kt_tile = cursor.take(pdim * kTile);
    float* v_tile = cursor.take(kTile * pdim);
    float* o_tile = cursor.take(kTile * pdim);
    float* scores = cursor.take(kTile * kTile);
    float* row_max = cursor.take(kTile);
    float* row_sum = cursor.take(kTile);

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const QueryTask t = query_task(s, start_of, task, k_first);
      const QueryTile& qt = t.tile;
      // The q tile is pre-scaled by 1/sqrt(d), so its products are the scaled scores.
      load_rows(q_tile, q_data + qt.offset, q_stride, qt.rows, s.dim, pdim, s.scale);
      std::fill(o_tile, o_tile + kTile * pdim, 0.0f);
      std::fill(row_max, row_max + kTile, -std::numeric_limits<float>::infinity());
      std::fill(row_sum, row_sum + kTile, 0.0f);

      const int64_t last_query = q_first + qt.q0 + qt.rows - 1;
      for (int64_t key_tile = t.first_key_tile; key_tile < s.tiles; ++key_tile) {
        const KeyTile kt = key_tile_of(s, t.b, t.kv_h, key_tile);
        if (!tile_may_see(last_query, k_first + kt.k0)) break;
        load_columns(kt_tile, k_data + kt.offset, kv_stride, kt.rows, s.dim, pdim);
        load_rows(v_tile, v_data + kt.offset, kv_stride, kt.rows, s.dim, pdim, 1.0f);
        tile_matmul(scores, q_tile, pdim, 1, kt_tile, kTile, pdim, false);
        online_softmax_tile(scores, o_tile, row_max, row_sum, qt.row_start, q_first + qt.q0,
                            qt.rows, k_first + kt.k0, kt.rows, pdim);
        tile_matmul(o_tile, scores, kTile, 1, v_tile, pdim, kTile, true);
      }

      for (int64_t i = 0; i < qt.rows; ++i) {
        float* out_row = out_data + qt.offset + i * q_stride;
        float& row_lse = lse_data[qt.stat_offset + i];
        if (row_sum[i] == 0.0f) {  // the block hides every key from this query
          if (!merge) {
            std::fill(out_row, out_row + s.dim, 0.0f);
            row_lse = -std::numeric_limits<float>::infinity();
          }
          continue;
        }
        const float inverse_sum = 1.0f / row_sum[i];
        const float block_lse = row_max[i] + std::log(row_sum[i]);
        if (!merge) {
          for (int64_t c = 0; c < s.dim; ++c) out_row[c] = o_tile[i * pdim + c] * inverse_sum;
          row_lse = block_lse;
          continue;
        }
        // Log-sum-exp merge with what out and lse hold (kernels/backend.h), in f32.
        const float merged_lse =
            std::max(row_lse, block_lse) + std::log1p(std::exp(-std::fabs(row_lse - block_lse)));
        const float old_weight = std::exp(row_lse - merged_lse);
        const float block_weight = std::exp(block_lse - merged_lse) * inverse_sum;
        for (int64_t c = 0; c < s.dim; ++c)
          out_row[c] = out_row[c] * old_weight + o_tile[i * pdim + c] * block_weight;
        row_lse = merged_lse;
      }
    }
  }
}

void CpuBackend::block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse,
                                int64_t q_first, int64_t k_first, const Documents& documents,
                                bool accumulate) {
  const char* op = "attention_backward";
  const AttentionShape s = checked_shape(q, k, v, out, lse, op);
  const std::vector<int64_t> start_of = row_document_starts(documents, q_first, s.seq_len);
  const int64_t pdim = s.padded_dim;
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t q_stride = s.q_heads * s.dim, kv_stride = s.kv_heads * s.dim;

  const float* q_data = q.f32();
  const float* k_data = k.f32();
  const float* v_data = v.f32();
  const float* o_data = out.f32();
  const float* do_data = dout.f32();
  const float* lse_data = lse.f32();
  float* dq_data = dq.f32();
  float* dk_data = dk.f32();
  float* dv_data = dv.f32();

  // D[b, h, t] = Σ_c dO·O, the row term of the softmax gradient.
  Buffer row_dot = attention_row_dot(*this, s.batch, s.q_heads, s.seq_len);
  float* d_data = row_dot.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < s.batch * s.seq_len; ++bt) {
    const int64_t b = bt / s.seq_len, t = bt % s.seq_len;
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const float* o_row = o_data + (bt * s.q_heads + h) * s.dim;
      const float* do_row = do_data + (bt * s.q_heads + h) * s.dim;
      double sum = 0.0;
      for (int64_t c = 0; c < s.dim; ++c) sum += double(o_row[c]) * double(do_row[c]);
      d_data[(b * s.q_heads + h) * s.seq_len + t] = float(sum);
    }
  }

  Buffer scratch = cpu_attention_backward_scratch(*this, omp_get_max_threads(), s.dim);
  const int64_t per_thread = scratch.tensor().dim(1);

  // The query side of one tile into tiles: q pre-scaled by 1/√d (so S needs no further
  // scaling), dO, lse and D, zero-padded.
  auto load_query_side = [&](BackwardTiles& tiles, const QueryTile& qt) {
    load_rows(tiles.q, q_data + qt.offset, q_stride, qt.rows, s.dim, pdim, s.scale);
    load_rows(tiles.dout, do_data + qt.offset, q_stride, qt.rows, s.dim, pdim, 1.0f);
    std::fill(tiles.lse, tiles.lse + kTile, 0.0f);
    std::fill(tiles.d, tiles.d + kTile, 0.0f);
    std::copy(lse_data + qt.stat_offset, lse_data + qt.stat_offset + qt.rows, tiles.lse);
    std::copy(d_data + qt.stat_offset, d_data + qt.stat_offset + qt.rows, tiles.d);
  };
  // P = exp(S − lse) and dS = P ∘ (dP − D) of the loaded query tile against the loaded key
  // tile, with dP = dO Vᵀ.
  auto probabilities = [&](BackwardTiles& tiles, const QueryTile& qt, const KeyTile& kt) {
    tile_matmul(tiles.probs, tiles.q, pdim, 1, tiles.kt, kTile, pdim, false);
    tile_matmul(tiles.dprobs, tiles.dout, pdim, 1, tiles.vt, kTile, pdim, false);
    softmax_grad_tile(tiles.probs, tiles.dprobs, tiles.lse, tiles.d, qt.row_start, q_first + qt.q0,
                      qt.rows, k_first + kt.k0, kt.rows);
  };

  // Pass 1, per (b, q head, query tile): dQ = scale · Σ_j dS K.
  const int64_t q_tasks = s.batch * s.q_heads * s.tiles;
#pragma omp parallel
  {
    BackwardTiles tiles(scratch.f32() + omp_get_thread_num() * per_thread, pdim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < q_tasks; ++task) {
      const QueryTask t = query_task(s, start_of, task, k_first);
      const QueryTile& qt = t.tile;
      load_query_side(tiles, qt);
      std::fill(tiles.dq, tiles.dq + kTile * pdim, 0.0f);

      const int64_t last_query = q_first + qt.q0 + qt.rows - 1;
      for (int64_t key_tile = t.first_key_tile; key_tile < s.tiles; ++key_tile) {
        const KeyTile kt = key_tile_of(s, t.b, t.kv_h, key_tile);
        if (!tile_may_see(last_query, k_first + kt.k0)) break;
        load_columns(tiles.kt, k_data + kt.offset, kv_stride, kt.rows, s.dim, pdim);
        load_columns(tiles.vt, v_data + kt.offset, kv_stride, kt.rows, s.dim, pdim);
        load_rows(tiles.k, k_data + kt.offset, kv_stride, kt.rows, s.dim, pdim, 1.0f);
        probabilities(tiles, qt, kt);
        tile_matmul(tiles.dq, tiles.dprobs, kTile, 1, tiles.k, pdim, kTile, true);
      }

      for (int64_t i = 0; i < qt.rows; ++i) {
        float* dq_row = dq_data + qt.offset + i * q_stride;
        for (int64_t c = 0; c < s.dim; ++c) {
          const float value = s.scale * tiles.dq[i * pdim + c];
          dq_row[c] = accumulate ? dq_row[c] + value : value;
        }
      }
    }
  }

  // Pass 2, per (b, kv head, key tile): dV = Σ Pᵀ dO and dK = scale · Σ dSᵀ Q over the q
  // heads of the group and the query tiles at or after the key tile. P and dS are read
  // transposed by the products; the pre-scaled q tile supplies the factor scale.
  const int64_t kv_tasks = s.batch * s.kv_heads * s.tiles;
#pragma omp parallel
  {
    BackwardTiles tiles(scratch.f32() + omp_get_thread_num() * per_thread, pdim);
    // Key tile 0 sees every query tile: the longest tasks come first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < kv_tasks; ++task) {
      const int64_t kv_h = (task / s.tiles) % s.kv_heads;
      const int64_t b = task / (s.tiles * s.kv_heads);
      const KeyTile kt = key_tile_of(s, b, kv_h, task % s.tiles);
      // Query tiles that start after the document of the tile's last key are masked whole.
      const int64_t query_end =
          documents.none() ? s.seq_len
                           : std::clamp<int64_t>(
                                 document_end(documents.starts[size_t(b)],
                                              k_first + kt.k0 + kt.rows - 1, q_first + s.seq_len) -
                                     q_first,
                                 0, s.seq_len);
      const int64_t end_tile = (query_end + kTile - 1) / kTile;

      load_columns(tiles.kt, k_data + kt.offset, kv_stride, kt.rows, s.dim, pdim);
      load_columns(tiles.vt, v_data + kt.offset, kv_stride, kt.rows, s.dim, pdim);
      std::fill(tiles.dk, tiles.dk + kTile * pdim, 0.0f);
      std::fill(tiles.dv, tiles.dv + kTile * pdim, 0.0f);

      for (int64_t h = kv_h * group; h < (kv_h + 1) * group; ++h) {
        for (int64_t tile = 0; tile < end_tile; ++tile) {
          const QueryTile qt = query_tile(s, start_of, b, h, tile);
          if (!tile_may_see(q_first + qt.q0 + qt.rows - 1, k_first + kt.k0)) continue;
          load_query_side(tiles, qt);
          probabilities(tiles, qt, kt);
          tile_matmul(tiles.dv, tiles.probs, 1, kTile, tiles.dout, pdim, kTile, true);
          tile_matmul(tiles.dk, tiles.dprobs, 1, kTile, tiles.q, pdim, kTile, true);
        }
      }

      for (int64_t j = 0; j < kt.rows; ++j) {
        float* dk_row = dk_data + kt.offset + j * kv_stride;
        float* dv_row = dv_data + kt.offset + j * kv_stride;
        for (int64_t c = 0; c < s.dim; ++c) {
          dk_row[c] = accumulate ? dk_row[c] + tiles.dk[j * pdim + c] : tiles.dk[j * pdim + c];
          dv_row[c] = accumulate ? dv_row[c] + tiles.dv[j * pdim + c] : tiles.dv[j * pdim + c];
        }
      }
    }
  }
}

}  // namespace ulysses
