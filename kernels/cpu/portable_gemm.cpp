// The portable GEMM: blocks of c are independent tasks, so threads never split a sum; within a
// task every element's sum runs over k in order, so blocking k does not reorder it either.
// kernels/CMakeLists.txt builds this file with -ffp-contract=off, so that a build for a CPU
// with FMA (-march=native) still rounds each product on its own; the loops vectorise across
// j only, which changes no element's arithmetic.
#include "kernels/cpu/portable_gemm.h"

#include <algorithm>

#if defined(__FAST_MATH__)
#error "portable_gemm.cpp must be built without -ffast-math: it reorders the sums"
#endif

namespace ulysses::cpu {

namespace {

// A task computes a kRows × kColumns block of c; op(b) is packed kDepth rows at a time.
// Both scratch blocks (40 KiB) live on the thread's stack.
constexpr int64_t kRows = 32;
constexpr int64_t kColumns = 64;
constexpr int64_t kDepth = 128;

// op(x)(row, col) for a row-major x with row stride ld.
inline float element(const float* x, int64_t ld, bool trans, int64_t row, int64_t col) {
  return trans ? x[col * ld + row] : x[row * ld + col];
}

}  // namespace

void portable_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) {
  const int64_t row_blocks = (m + kRows - 1) / kRows;
  const int64_t column_blocks = (n + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < row_blocks * column_blocks; ++task) {
    const int64_t i0 = task / column_blocks * kRows, j0 = task % column_blocks * kColumns;
    const int64_t rows = std::min(kRows, m - i0), columns = std::min(kColumns, n - j0);
    alignas(64) float sums[kRows][kColumns] = {};
    alignas(64) float panel[kDepth][kColumns];
    for (int64_t p0 = 0; p0 < k; p0 += kDepth) {
      const int64_t depth = std::min(kDepth, k - p0);
      // panel[p][j] = op(b)(p0 + p, j0 + j)
      for (int64_t p = 0; p < depth; ++p)
        for (int64_t j = 0; j < columns; ++j)
          panel[p][j] = element(b, ldb, trans_b, p0 + p, j0 + j);
      for (int64_t i = 0; i < rows; ++i) {
        float* sum_row = sums[i];
        for (int64_t p = 0; p < depth; ++p) {
          const float a_ip = element(a, lda, trans_a, i0 + i, p0 + p);
          const float* b_row = panel[p];
          for (int64_t j = 0; j < columns; ++j) sum_row[j] += a_ip * b_row[j];
        }
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* c_row = c + (i0 + i) * ldc + j0;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < columns; ++j) c_row[j] = alpha * sums[i][j];
      } else {
        for (int64_t j = 0; j < columns; ++j) c_row[j] = alpha * sums[i][j] + beta * c_row[j];
      }
    }
  }
}

}  // namespace ulysses::cpu
