// Which keys a query sees, in one place for every native attention kernel (the FMA ones in
// cuda_attention_kernels.cuh and the tensor-core ones in cuda_attention_mma.cuh): causal
// attention, and with packed documents (docs/parallelism.md, "Packed documents") only the keys
// of the query's own document. The element mask, and the tile ranges and whole-tile test that
// let a kernel skip tiles or leave the element mask out; a mask that hides more keys changes
// these functions and nothing else. The document starts of the batch (kernels/documents.h)
// travel as one small i32 buffer in device memory.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/documents.h"

namespace ulysses::cuda_attention {

// The mask of one call. first[b] .. first[b + 1] index sequence b's starts in starts
// (ascending, the first 0); null first: no documents, every sequence one causal text. The
// call's queries and keys may be a block of the sequence (ring attention, kernels/backend.h
// attention_block_forward): query index i sits at position q_first + i and key index j at
// k_first + j, and document starts are positions. The kernels work in indices; the functions
// below turn positions into key and query indices, so the whole attention (q_first = k_first
// = 0) and a block take the same code.
struct AttentionMask {
  const int32_t* first = nullptr;
  const int32_t* starts = nullptr;
  int64_t q_first = 0, k_first = 0;
};

// The start of the document that holds `position` of sequence b (0 without documents).
__device__ __forceinline__ int64_t document_start_position(const AttentionMask& mask, int64_t b,
                                                           int64_t position) {
  if (mask.first == nullptr) return 0;
  int32_t low = mask.first[b], high = mask.first[b + 1];  // the answer is in [low, high)
  while (high - low > 1) {
    const int32_t middle = low + (high - low) / 2;
    if (mask.starts[middle] <= position)
      low = middle;
    else
      high = middle;
  }
  return mask.starts[low];
}

// The key index where the document of query index `query` starts (negative when it starts
// before the block's keys).
__device__ __forceinline__ int64_t document_first_key(const AttentionMask& mask, int64_t b,
                                                      int64_t query) {
  return document_start_position(mask, b, mask.q_first + query) - mask.k_first;
}

// The last key index that query index `query` may see causally (its own position).
__device__ __forceinline__ int64_t causal_last_key(const AttentionMask& mask, int64_t query) {
  return query + mask.q_first - mask.k_first;
}

// The query index one past the document that holds key index `key`, in [0, seq_len].
__device__ __forceinline__ int64_t document_end_query(const AttentionMask& mask, int64_t b,
                                                      int64_t key, int64_t seq_len) {
  int64_t end = seq_len;
  if (mask.first != nullptr) {
    const int64_t position = mask.k_first + key;
    for (int32_t i = mask.first[b]; i < mask.first[b + 1]; ++i)
      if (mask.starts[i] > position) {
        end = mask.starts[i] - mask.q_first;
        break;
      }
  }
  return end < 0 ? 0 : end < seq_len ? end : seq_len;
}

// Whether query (whose document's first key is query_first_key) sees key, both indices inside
// the block of seq_len rows. Rows at or past seq_len are a tile's padding and see nothing.
__device__ __forceinline__ bool key_visible(const AttentionMask& mask, int64_t query,
                                            int64_t query_first_key, int64_t key, int64_t seq_len) {
  return key <= causal_last_key(mask, query) && key >= query_first_key && key < seq_len &&
         query < seq_len;
}

// Whether every query in [q_first, q_last] sees every key in [k_first, k_last] (indices, all
// inside the block), q_last's document's first key being q_last_first_key: the keys are at or
// before the first query and inside the last query's document (which then holds every
// query's document start at or before k_first). A kernel leaves the element mask out for such
// a pair of tiles.
__device__ __forceinline__ bool tiles_fully_visible(const AttentionMask& mask, int64_t q_first,
                                                    int64_t q_last_first_key, int64_t k_first,
                                                    int64_t k_last) {
  return k_last <= causal_last_key(mask, q_first) && q_last_first_key <= k_first;
}

// Key tiles [first_key_tile, end_key_tile) of tile_keys keys hold every key visible from the
// queries [q_first, q_last] of sequence b: the tiles wholly in earlier documents and those
// past the last query's position are skipped (none at all when every key is).
__device__ __forceinline__ int64_t first_key_tile(const AttentionMask& mask, int64_t b,
                                                  int64_t q_first, int tile_keys) {
  const int64_t key = document_first_key(mask, b, q_first);
  return key > 0 ? key / tile_keys : 0;
}
__device__ __forceinline__ int64_t end_key_tile(const AttentionMask& mask, int64_t q_last,
                                                int64_t seq_len, int tile_keys) {
  int64_t last = causal_last_key(mask, q_last);
  if (last >= seq_len) last = seq_len - 1;
  return last < 0 ? 0 : last / tile_keys + 1;
}

// Query tiles [first_query_tile, end_query_tile) of tile_rows rows hold every query that sees
// a key in [k_first, k_last] (k_last < seq_len): the backward's dK, dV skip the tiles before
// the keys' positions and those wholly in later documents (none at all when every query is).
__device__ __forceinline__ int64_t first_query_tile(const AttentionMask& mask, int64_t k_first,
                                                    int tile_rows) {
  const int64_t query = k_first - (mask.q_first - mask.k_first);
  return query > 0 ? query / tile_rows : 0;
}
__device__ __forceinline__ int64_t end_query_tile(const AttentionMask& mask, int64_t b,
                                                  int64_t k_last, int64_t seq_len, int tile_rows) {
  return (document_end_query(mask, b, k_last, seq_len) + tile_rows - 1) / tile_rows;
}

// The host side: documents as one i32 array, the B + 1 offsets `first` and then every start;
// empty without documents. The backend uploads it (the emulated one keeps it on the host).
inline std::vector<int32_t> document_mask_words(const Documents& documents) {
  std::vector<int32_t> words;
  if (documents.none()) return words;
  const size_t batch = documents.starts.size();
  int32_t next = int32_t(batch + 1);
  for (const std::vector<int64_t>& starts : documents.starts) {
    words.push_back(next);
    next += int32_t(starts.size());
  }
  words.push_back(next);
  for (const std::vector<int64_t>& starts : documents.starts)
    for (int64_t start : starts) words.push_back(int32_t(start));
  return words;
}

// The mask over such an array at `words` (null: no documents), for a block whose first query
// and key sit at positions q_first and k_first (0 and 0: the whole attention).
inline AttentionMask attention_mask_at(const int32_t* words, int64_t q_first = 0,
                                       int64_t k_first = 0) {
  return AttentionMask{words, words, q_first, k_first};
}

}  // namespace ulysses::cuda_attention
