// Helpers shared by the CUDA backend's host code: status checks that throw, a checked launch on
// a stream, and the dispatch on a float dtype (the dtypes and shapes are the op's contract,
// kernels/op_contracts.h). The device environment is kernels/cuda/cuda_device.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_enqueued.h"
#include "kernels/tensor.h"

namespace ulysses::cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda: ") + what + " failed: " + cudaGetErrorName(status) +
                             " (" + cudaGetErrorString(status) + ")");
}

// After `launches` kernel launches: counts them, and reports bad launch configurations at the
// op that caused them.
inline void check_launch(const char* op, int launches = 1) {
  count_enqueued(launches);
  check_cuda(cudaGetLastError(), op);
}

// Runs kernel<<<shape, stream>>>(args...) and checks the launch: how the host-side code that
// the backend shares with the host emulation (sum_squares_passes, lm_head_loss_tiles) launches
// a kernel on the device. The emulation's HostLaunch (tests/cuda_emulation.h) runs it instead.
struct StreamLaunch {
  cudaStream_t stream;
  const char* op;

  template <typename Kernel, typename... Args>
  void operator()(const LaunchShape& shape, Kernel kernel, Args... args) const {
    kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream>>>(args...);
    check_launch(op);
  }
};

// Calls fn(T{}) with T = float or bf16 after the tensor's dtype.
template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  if (t.dtype == DType::f32) {
    fn(float{});
  } else if (t.dtype == DType::bf16) {
    fn(bf16{});
  } else {
    throw std::invalid_argument(std::string(op) + ": unsupported dtype " + dtype_name(t.dtype) +
                                " (f32 or bf16)");
  }
}

}  // namespace ulysses::cuda
