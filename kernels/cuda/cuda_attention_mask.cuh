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

// first[b] .. first[b + 1] index sequence b's starts in starts (ascending, the first 0).
// Null first: no documents, every sequence one causal text.
struct DocumentMask {
  const int32_t* first = nullptr;
  const int32_t* starts = nullptr;
};

// The start of the document that holds position t of sequence b (0 without documents).
__device__ __forceinline__ int64_t document_start(const DocumentMask& mask, int64_t b, int64_t t) {
  if (mask.first == nullptr) return 0;
  int32_t low = mask.first[b], high = mask.first[b + 1];  // the answer is in [low, high)
  while (high - low > 1) {
    const int32_t middle = low + (high - low) / 2;
    if (mask.starts[middle] <= t)
      low = middle;
    else
      high = middle;
  }
  return mask.starts[low];
}

// One past the last position of the document that holds position t, at most seq_len.
__device__ __forceinline__ int64_t document_end(const DocumentMask& mask, int64_t b, int64_t t,
                                                int64_t seq_len) {
  if (mask.first == nullptr) return seq_len;
  for (int32_t i = mask.first[b]; i < mask.first[b + 1]; ++i)
    if (mask.starts[i] > t) return mask.starts[i];
  return seq_len;
}

// Whether query (whose document starts at query_start) sees key, both inside the sequence.
// Rows at or past seq_len are a tile's padding and see nothing.
__device__ __forceinline__ bool key_visible(int64_t query, int64_t query_start, int64_t key,
                                            int64_t seq_len) {
  return key <= query && key >= query_start && key < seq_len && query < seq_len;
}

// Whether every query in [q_first, q_last] sees every key in [k_first, k_last], all inside the
// sequence, q_last's document starting at q_last_start: the keys are at or before the first
// query and inside the last query's document (which then holds every query's document start
// at or before k_first). A kernel leaves the element mask out for such a pair of tiles.
__device__ __forceinline__ bool tiles_fully_visible(int64_t q_first, int64_t q_last_start,
                                                    int64_t k_first, int64_t k_last) {
  return k_last <= q_first && q_last_start <= k_first;
}

// Key tiles [first_key_tile, end_key_tile) of tile_keys keys hold every key visible from the
// queries [q_first, q_last] of sequence b: the tiles wholly in earlier documents and those
// above the diagonal are skipped.
__device__ __forceinline__ int64_t first_key_tile(const DocumentMask& mask, int64_t b,
                                                  int64_t q_first, int tile_keys) {
  return document_start(mask, b, q_first) / tile_keys;
}
__device__ __forceinline__ int64_t end_key_tile(int64_t q_last, int tile_keys) {
  return q_last / tile_keys + 1;
}

// Query tiles [first_query_tile, end_query_tile) of tile_rows rows hold every query that sees
// a key in [k_first, k_last] (k_last < seq_len): the backward's dK, dV skip the tiles before
// the diagonal and those wholly in later documents.
__device__ __forceinline__ int64_t first_query_tile(int64_t k_first, int tile_rows) {
  return k_first / tile_rows;
}
__device__ __forceinline__ int64_t end_query_tile(const DocumentMask& mask, int64_t b,
                                                  int64_t k_last, int64_t seq_len, int tile_rows) {
  return (document_end(mask, b, k_last, seq_len) + tile_rows - 1) / tile_rows;
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

// The mask over such an array at `words` (null: no documents).
inline DocumentMask document_mask_at(const int32_t* words) {
  return words == nullptr ? DocumentMask{} : DocumentMask{words, words};
}

}  // namespace ulysses::cuda_attention
