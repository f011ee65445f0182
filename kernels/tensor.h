// Non-owning views of backend memory, and the owning Buffer they usually come from.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/memory.h"

namespace ulysses {

enum class DType : uint8_t { f32, bf16, i32 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// Host conversions of one bf16 value (its bit pattern). Widening is exact; narrowing rounds
// to nearest, ties to even, and a NaN stays a quiet NaN.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);

constexpr int kMaxDims = 4;

// A view: pointer, element type and a row-major contiguous shape of up to 4 dims.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims);

  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  bool empty() const { return data == nullptr; }

  // Typed access (checked dtype).
  float* f32() const;
  int32_t* i32() const;

  // Same memory, another shape with the same element count.
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  // Rows [begin, end) of the leading dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Elements [offset, offset + count) as a 1-D view.
  Tensor flat_range(int64_t offset, int64_t count) const;

  std::string shape_string() const;
};

class Backend;

// Owns one allocation from a backend, charged to a memory category until destroyed.
class Buffer {
 public:
  Buffer() = default;
  // zeroed: every byte zero (Backend::alloc_zeroed).
  Buffer(Backend* backend, MemCategory category, DType dtype, std::initializer_list<int64_t> dims,
         const std::string& what, bool zeroed = false);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& tensor() const { return view_; }
  Tensor& tensor() { return view_; }
  operator const Tensor&() const { return view_; }
  float* f32() const { return view_.f32(); }
  int32_t* i32() const { return view_.i32(); }
  size_t bytes() const { return view_.bytes(); }
  bool empty() const { return view_.data == nullptr; }
  void reset();

 private:
  Backend* backend_ = nullptr;
  bool planned_only_ = false;  // charged in planning mode, never allocated
  MemCategory category_ = MemCategory::workspace;
  Tensor view_;
};

}  // namespace ulysses
