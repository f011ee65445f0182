// Packed documents in the native attention kernels (docs/parallelism.md, "Packed documents"):
// a query sees the keys of its own document up to itself. One struct and three predicates, so
// that every attention kernel masks and skips tiles the same way. The document starts of the
// batch (kernels/documents.h) travel as one small i32 buffer in device memory.
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
__device__ __forceinline__ bool key_visible(int64_t query, int64_t query_start, int64_t key,
                                            int64_t seq_len) {
  return key <= query && key >= query_start && key < seq_len && query < seq_len;
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
