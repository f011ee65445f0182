// CudaBackend: fused LM head + cross-entropy. Rows with a target are gathered into tiles of at
// most tile_rows rows; per tile, cuBLASLt forms the logits [tile, V] in fp32, one block per
// row finds the max, argmax and log-sum-exp and writes dlogits in the compute dtype, and two
// more GEMMs give dhidden and accumulate dweight (f32). Logits never exist for all rows at
// once. Per-row losses stay on the device and are summed on the host in row order. The tile
// loop is lm_head_loss_tiles (kernels/cuda/cuda_loss_kernels.cuh), which the host emulation
// runs too.
#include <stdexcept>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cuda_loss_kernels.cuh"

namespace ulysses {

LossResult CudaBackend::lm_head_loss_impl(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, int64_t tile_rows,
                                          float grad_scale, const Tensor& dhidden,
                                          const Tensor& dweight) {
  const char* op = "lm_head_loss";
  if (hidden.numel() / weight.shape[1] > int64_t(0x7fffffff))
    throw std::invalid_argument("lm_head_loss: more than 2^31 rows in one call");
  if (!dhidden.empty()) {
  }
  LossResult result;
  cuda::dispatch_float(hidden, op, [&](auto tag) {
    result = cuda::lm_head_loss_tiles<decltype(tag)>(*this, cuda::StreamLaunch{stream_, op}, hidden,
                                                     weight, targets, tile_rows, grad_scale,
                                                     dhidden, dweight);
  });
  return result;
}

}  // namespace ulysses
