#include "kernels/tensor.h"

#include <bit>
#include <cstring>
#include <utility>

#include "kernels/backend.h"

namespace ulysses {

namespace {

// Where a planned buffer "lives": never dereferenced (the planning backend runs no op), but
// not null, so that it and the views cut from it are not empty() and code that tells a
// buffer from an absent one (an optional bias, a shared scratch) takes the path it takes in
// a real run (docs/memory.md, "The planner").
void* const kPlannedAddress = reinterpret_cast<void*>(uintptr_t(1) << 44);

}  // namespace

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

Buffer::Buffer(Backend* backend, MemCategory category, DType dtype,
               std::initializer_list<int64_t> dims, const std::string& what, bool zeroed)
    : backend_(backend), category_(category), view_(nullptr, dtype, dims) {
  size_t bytes = view_.bytes();
  backend_->memory().charge(category_, int64_t(bytes), what);
  if (backend_->memory().planning()) {
    planned_only_ = true;
    view_.data = kPlannedAddress;
    return;
  }
  try {
    // Offloaded layer inputs live in host memory the device copies fastest (pinned on cuda).
    if (category_ == MemCategory::checkpoints_host) {
      view_.data = backend_->host_staging_alloc(bytes);
      if (zeroed) std::memset(view_.data, 0, bytes);
      return;
    }
    if (zeroed) view_.data = backend_->raw_alloc_zeroed(bytes);
    if (view_.data) return;
    view_.data = backend_->raw_alloc(bytes);
  } catch (...) {
    backend_->memory().release(category_, int64_t(bytes));
    throw;
  }
  if (!zeroed) return;
  try {
    backend_->fill_zero(view_);
  } catch (...) {
    backend_->raw_free(view_.data);
    view_.data = nullptr;
    backend_->memory().release(category_, int64_t(bytes));
    throw;
  }
}

Buffer::~Buffer() {
  reset();
}

void Buffer::reset() {
  if (backend_ && view_.data) {
    if (!planned_only_) {
      if (category_ == MemCategory::checkpoints_host)
        backend_->host_staging_free(view_.data);
      else
        backend_->raw_free(view_.data);
    }
    backend_->memory().release(category_, int64_t(view_.bytes()));
  }
  view_ = Tensor();
  backend_ = nullptr;
  planned_only_ = false;
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      planned_only_(std::exchange(other.planned_only_, false)),
      category_(other.category_),
      view_(std::exchange(other.view_, Tensor())) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::exchange(other.backend_, nullptr);
    planned_only_ = std::exchange(other.planned_only_, false);
    category_ = other.category_;
    view_ = std::exchange(other.view_, Tensor());
  }
  return *this;
}

}  // namespace ulysses
