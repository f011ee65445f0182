// Deterministic column sums for weight and bias gradients: dst[j] += Σ_r term(r, j).
// Pass 1 sums fixed chunks of rows in row order, one thread per (chunk, column), into a
// [chunks, width] scratch; pass 2 adds the chunks in order. No atomics: the same inputs give
// the same bits on every run.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_device.cuh"

namespace ulysses::cuda {

enum class ColumnTerm {
  value,               // g[r, j]
  times_rms_input,     // g[r, j] · x[r, j] · rstd[r]          (RMSNorm weight)
  times_normed_input,  // g[r, j] · (x[r, j] − mean[r]) · rstd[r]  (LayerNorm weight)
};

// Rows per partial sum and the number of partial sums for a column reduction over rows: at
// most 1024 partial rows, so the scratch stays [1024, width] however long the sequence.
struct ColumnChunks {
  int64_t rows_per_chunk, chunks;
};
inline ColumnChunks column_chunks(int64_t rows) {
  const int64_t rows_per_chunk = std::max<int64_t>(64, (rows + 1023) / 1024);
  return {rows_per_chunk, std::max<int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk)};
}

// Pass 1: a grid-stride loop over columns in x, one chunk of rows per blockIdx.y.
inline LaunchShape column_partials_launch(int64_t width, const ColumnChunks& chunks) {
  return {dim3(blocks_for(width), unsigned(chunks.chunks)), unsigned(kThreads), 0};
}

// Pass 2: a grid-stride loop over columns.
inline LaunchShape add_column_partials_launch(int64_t width) {
  return elementwise_launch(width);
}

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
namespace {

template <ColumnTerm kTerm, typename T>
__global__ void column_partials_kernel(float* parts, const T* g, const T* x, const float* mean,
                                       const float* rstd, int64_t rows, int64_t width,
                                       int64_t rows_per_chunk) {
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < width;
       j += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t r = begin; r < end; ++r) {
      const float grad = to_float(g[r * width + j]);
      if constexpr (kTerm == ColumnTerm::value) {
        sum += grad;
      } else if constexpr (kTerm == ColumnTerm::times_rms_input) {
        sum += grad * to_float(x[r * width + j]) * rstd[r];
      } else {
        sum += grad * (to_float(x[r * width + j]) - mean[r]) * rstd[r];
      }
    }
    parts[chunk * width + j] = sum;
  }
}

__global__ void add_column_partials_kernel(float* dst, const float* parts, int64_t chunks,
                                           int64_t width) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < width;
       j += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) sum += parts[c * width + j];
    dst[j] += sum;
  }
}

}  // namespace

}  // namespace ulysses::cuda
