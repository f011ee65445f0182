// Which keys a query sees, in one place for every native attention kernel (the FMA ones in
// cuda_attention_kernels.cuh and the tensor-core ones in cuda_attention_mma.cuh): the element
// mask, and the tile ranges that let a kernel skip whole tiles. A mask that hides more keys
// changes these functions and nothing else.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"

namespace ulysses::cuda_attention {

// Causal: query t sees keys 0..t. (Rows at or after the sequence's end are a tile's padding,
// which the kernels handle themselves.)
__device__ __forceinline__ bool key_visible(int64_t query, int64_t key) {
  return key <= query;
}

// Whether every query from q_first on sees every key up to k_last, so that a kernel can leave
// out the element mask for a pair of tiles.
__device__ __forceinline__ bool tiles_fully_visible(int64_t q_first, int64_t k_last) {
  return k_last <= q_first;
}

// Key tiles [first_key_tile, end_key_tile) of tile_keys keys hold every key visible from the
// queries [q_first, q_last]: the tiles above the diagonal are skipped.
__device__ __forceinline__ int64_t first_key_tile(int64_t /*q_first*/, int /*tile_keys*/) {
  return 0;  // causal: every query sees the first key
}
__device__ __forceinline__ int64_t end_key_tile(int64_t q_last, int tile_keys) {
  return q_last / tile_keys + 1;
}

// Query tiles [first_query_tile, query_tiles) of tile_rows rows hold every query that sees a
// key in [k_first, k_last]: the backward's dK, dV skip the tiles before the diagonal.
__device__ __forceinline__ int64_t first_query_tile(int64_t k_first, int tile_rows) {
  return k_first / tile_rows;
}

}  // namespace ulysses::cuda_attention
