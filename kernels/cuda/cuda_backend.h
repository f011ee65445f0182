// The CUDA backend: bf16 activations and weights, fp32 master weights and optimizer state.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/backend.h"

namespace ulysses {

// Throws "no CUDA device" when no usable GPU is present.
std::unique_ptr<Backend> make_cuda_backend(int64_t memory_limit_bytes);

}  // namespace ulysses
