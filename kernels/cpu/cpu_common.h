// Helpers shared by the cpu backend's source files: argument checks (done before any
// OpenMP region, since an exception must not leave one) and a vectorisable exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/tensor.h"

namespace ulysses::cpu {

inline void require_f32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != DType::f32 || t.data == nullptr) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a non-empty f32 tensor (got " +
                                dtype_name(t.dtype) + " " + t.shape_string() + ")");
  }
}

inline void require_i32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != DType::i32 || t.data == nullptr) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a non-empty i32 tensor (got " +
                                dtype_name(t.dtype) + " " + t.shape_string() + ")");
  }
}

inline void require_numel(const Tensor& t, int64_t numel, const char* op, const char* name) {
  if (t.numel() != numel) {
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() + " has " +
                                std::to_string(t.numel()) + " elements, expected " +
                                std::to_string(numel));
  }
}

inline void require_ndim(const Tensor& t, int ndim, const char* op, const char* name) {
  if (t.ndim != ndim) {
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() + " must be " +
                                std::to_string(ndim) + "-D");
  }
}

// Rows of a tensor seen as [rows, width]; throws when numel is not a multiple of width.
inline int64_t rows_of(const Tensor& t, int64_t width, const char* op, const char* name) {
  if (width <= 0 || t.numel() % width != 0) {
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() +
                                " is not a whole number of rows of width " + std::to_string(width));
  }
  return t.numel() / width;
}

// exp(x) in float, accurate to about 2 ulp, written without calls or branches so that loops
// over it vectorise (std::exp does not without -ffast-math). Cephes-style: x = n·ln2 + r,
// |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by building the exponent bits.
// Returns 0 below -87.3 (where the float result would be denormal).
inline float fast_exp(float x) {
  const float low_clamped = x < -87.3f ? -87.3f : x;
  const float clamped = low_clamped > 88.7f ? 88.7f : low_clamped;
  const float n = std::nearbyint(clamped * 1.44269504088896341f);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((int32_t(n) + 127) << 23);
  return x < -87.3f ? 0.0f : p * two_n;
}

}  // namespace ulysses::cpu
