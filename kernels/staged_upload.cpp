#include "kernels/staged_upload.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ulysses {

StagedUpload::StagedUpload(Backend& backend, int64_t piece)
    : backend_(backend),
      piece_(piece),
      block_(static_cast<float*>(backend.host_staging_alloc(size_t(2 * piece) * sizeof(float)))) {}

StagedUpload::~StagedUpload() {
  // Destructors cannot throw: an upload that failed has thrown from send or finish already,
  // or its error is the one unwinding the stack now.
  try {
    finish();
  } catch (...) {
  }
  backend_.host_staging_free(block_);
}

float* StagedUpload::next() {
  half_ = 1 - half_;
  backend_.wait_upload(tickets_[half_]);
  return block_ + half_ * piece_;
}

void StagedUpload::send(const Tensor& dst) {
  if (dst.dtype != DType::f32 || dst.numel() > piece_)
    throw std::logic_error("StagedUpload: " + std::to_string(dst.numel()) +
                           " elements sent from halves of " + std::to_string(piece_) + " floats");
  tickets_[half_] = backend_.upload_async(dst, block_ + half_ * piece_);
}

void StagedUpload::finish() {
  backend_.wait_upload(std::max(tickets_[0], tickets_[1]));
}

}  // namespace ulysses
