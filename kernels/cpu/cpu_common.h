// Helpers shared by the cpu backend's source files: comparisons without branches, a
// vectorisable exp and deterministic column sums. The dtypes and shapes of every op are checked by
// its contract (kernels/op_contracts.h) before any OpenMP region, since an exception must not leave
// one.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/tensor.h"

namespace ulysses::cpu {

// Comparison and selection through the sign bit and integer masks. Under GCC's default
// -ftrapping-math a floating-point compare keeps a loop from vectorising; these become
// plain vector subtract/and/or instructions.
// All ones when a < b, else zero (for ordered operands whose difference is not -0).
inline int32_t less_mask(float a, float b) {
  return std::bit_cast<int32_t>(a - b) >> 31;
}

inline float select(int32_t mask, float if_set, float if_clear) {
  return std::bit_cast<float>((std::bit_cast<int32_t>(if_set) & mask) |
                              (std::bit_cast<int32_t>(if_clear) & ~mask));
}

// All ones when the condition holds, else zero.
inline int32_t mask_if(bool condition) {
  return -int32_t(condition);
}

inline float vector_max(float a, float b) {
  return select(less_mask(a, b), b, a);
}

// exp(x) in float to within about 1e-7 relative, written without calls, branches or
// floating-point compares so that loops over it vectorise (std::exp does not without
// -ffast-math). Cephes-style: x = n·ln2 + r with |r| <= ln2/2, exp(r) by a degree-6
// polynomial, 2^n built in the exponent bits. Inputs are clamped to [-87.3, 88.3], and the
// result is 0 below -87.3 (where it would be denormal).
inline float fast_exp(float x) {
  const int32_t underflow = less_mask(x, -87.3f);
  const float low_clamped = select(underflow, -87.3f, x);
  const float clamped = select(less_mask(88.3f, low_clamped), 88.3f, low_clamped);
  // Adding 1.5·2^23 rounds to an integer, which then sits in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const float shifted = clamped * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float value = p * std::bit_cast<float>((n_int + 127) << 23);
  return select(underflow, 0.0f, value);
}

// dst[j] += sum over r of term(r, j), for j < width. Threads own blocks of columns, so every
// column is summed by one thread in row order.
template <typename Term>
void add_column_sums(float* dst, int64_t width, int64_t rows, Term term) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (width + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t j0 = block * kBlock;
    const int64_t count = std::min(kBlock, width - j0);
    double sum[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < count; ++j) sum[j] += term(r, j0 + j);
    }
    for (int64_t j = 0; j < count; ++j) dst[j0 + j] += float(sum[j]);
  }
}

}  // namespace ulysses::cpu
