#include "kernels/tensor.h"

#include <bit>
#include <utility>


namespace ulysses {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  const uint32_t round_to_even = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + round_to_even) >> 16);
}

Tensor::Tensor(void* data_in, DType dtype_in, std::initializer_list<int64_t> dims)
    : data(data_in), dtype(dtype_in), ndim(int(dims.size())) {
  if (ndim > kMaxDims) throw std::invalid_argument("tensor rank above 4");
  int i = 0;
  for (int64_t d : dims) shape[i++] = d;
}

int64_t Tensor::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

float* Tensor::f32() const {
  if (dtype != DType::f32)
    throw std::logic_error("tensor is " + std::string(dtype_name(dtype)) + ", not f32");
  return static_cast<float*>(data);
}

int32_t* Tensor::i32() const {
  if (dtype != DType::i32)
    throw std::logic_error("tensor is " + std::string(dtype_name(dtype)) + ", not i32");
  return static_cast<int32_t*>(data);
}

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  Tensor view(data, dtype, dims);
  if (view.numel() != numel())
    throw std::logic_error("reshape of " + shape_string() + " to " + view.shape_string());
  return view;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  if (begin < 0 || end > shape[0] || begin > end)
    throw std::logic_error("slice_rows out of range on " + shape_string());
  Tensor view = *this;
  int64_t row = numel() / shape[0];
  view.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  view.shape[0] = end - begin;
  return view;
}

Tensor Tensor::flat_range(int64_t offset, int64_t count) const {
  if (offset < 0 || offset + count > numel())
    throw std::logic_error("flat_range out of range on " + shape_string());
  return Tensor(static_cast<char*>(data) + size_t(offset) * dtype_size(dtype), dtype, {count});
}

std::string Tensor::shape_string() const {
  std::string text = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace ulysses
