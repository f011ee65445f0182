// Uploads of f32 values made on the host, through one block of host staging memory cut in
// two halves: the host fills one half while the other travels (Backend::upload_async), so
// making the next piece overlaps moving the last one. The weights at startup go this way
// (ZeroState::upload_weights; docs/memory.md, "Host memory per rank").
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace ulysses {

class StagedUpload {
 public:
  // Halves of `piece` floats each.
  StagedUpload(Backend& backend, int64_t piece);
  // Waits for the uploads in flight before the staging memory goes.
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  int64_t piece() const { return piece_; }
  // The half to fill next, once its last upload has read it.
  float* next();
  // Starts uploading the first dst.numel() (<= piece()) floats of the half next() gave to dst.
  void send(const Tensor& dst);
  // Returns once every upload has read its host memory.
  void finish();

 private:
  Backend& backend_;
  int64_t piece_;
  float* block_;
  int64_t tickets_[2] = {0, 0};  // the last upload from each half (0: none)
  int half_ = 1;                 // the half next() gave out last
};

}  // namespace ulysses
