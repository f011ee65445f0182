// The shape checks that every backend makes the same way, with the same messages: element
// counts, ranks and rows. Dtype checks stay with each backend (kernels/cpu/cpu_common.h,
// kernels/cuda/cuda_common.cuh), since what each accepts differs.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/tensor.h"

namespace ulysses::shape_checks {

inline void require_numel(const Tensor& t, int64_t numel, const char* op, const char* name) {
  if (t.numel() != numel)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() + " has " +
                                std::to_string(t.numel()) + " elements, expected " +
                                std::to_string(numel));
}

inline void require_ndim(const Tensor& t, int ndim, const char* op, const char* name) {
  if (t.ndim != ndim)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() +
                                " must be " + std::to_string(ndim) + "-D");
}

// Rows of a tensor seen as [rows, width]; throws when numel is not a multiple of width.
inline int64_t rows_of(const Tensor& t, int64_t width, const char* op, const char* name) {
  if (width <= 0 || t.numel() % width != 0)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() +
                                " is not a whole number of rows of width " + std::to_string(width));
  return t.numel() / width;
}

}  // namespace ulysses::shape_checks
