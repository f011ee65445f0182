// Buffer, the owning allocation of kernels/tensor.h: charged to the memory ledger, backed by
// the backend (or only planned). Apart from tensor.cpp so that code that only reads tensor
// views (the parsers of tests/fuzz) links without a backend.
#include <cstring>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "kernels/tensor.h"

namespace ulysses {

namespace {

// Where a planned buffer "lives": never dereferenced (the planning backend runs no op), but
// not null, so that it and the views cut from it are not empty() and code that tells a
// buffer from an absent one (an optional bias, a shared scratch) takes the path it takes in
// a real run (docs/memory.md, "The planner").
void* const kPlannedAddress = reinterpret_cast<void*>(uintptr_t(1) << 44);

}  // namespace

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
  } catch (const OutOfMemoryError& error) {
    // The backend knows only the size; the message also names the buffer and what is held,
    // as an allocation past memory.limit_gib does.
    backend_->memory().release(category_, int64_t(bytes));
    throw OutOfMemoryError(std::string(error.what()) + " for " + what + " (" +
                           mem_category_name(category_) +
                           "); held: " + backend_->memory().describe_current());
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
