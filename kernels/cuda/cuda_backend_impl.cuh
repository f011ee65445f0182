// CudaBackend: the class behind make_cuda_backend, shared by the backend's .cu files.
// Every op runs on one stream (stream()); download and synchronize wait for it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_scratch.h"

namespace ulysses {

class CudnnAttention;
class CudaTimeline;
class CudaTransfers;

class CudaBackend final : public Backend {
 public:
  // attention = cudnn throws when this build has no cuDNN.
  CudaBackend(int device, int64_t memory_limit_bytes, AttentionKernel attention);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  BackendKind kind() const override { return BackendKind::cuda; }
  DType compute_dtype() const override { return compute_dtype_of(BackendKind::cuda); }
  void set_num_threads(int threads) override;
  int64_t auto_loss_tile_tokens(int64_t vocab, int64_t width) const override {
    return device_loss_tile_tokens(vocab, width, memory().limit());
  }
  cudaStream_t stream() const { return stream_; }
  CudaTimeline& timeline() { return *timeline_; }
  int device() const { return device_; }

  void* raw_alloc(size_t bytes) override;
  void raw_free(void* pointer) override;
  void* host_staging_alloc(size_t bytes) override;
  void host_staging_free(void* pointer) override;

  // Offloaded layer inputs move between the device and pinned host memory on a side stream.
  bool host_memory_is_separate() const override { return true; }
  AvailableMemory available_memory() const override;
  int64_t transfer(const Tensor& dst, const Tensor& src) override;
  void wait_transfer(int64_t ticket) override;
  // The weights at startup: copies from pinned staging memory on the compute stream, each
  // with an event that the host waits on before it refills the memory.
  int64_t upload_async(const Tensor& dst, const void* host_src) override;
  void wait_upload(int64_t ticket) override;
  std::string take_plans_built() override;
  void synchronize() override;

 private:
  // Every op of kernels/op_table.h.
  ULYSSES_BACKEND_OPS(ULYSSES_DECLARE_OP_IMPL)

  // Attention over queries at positions q_first.. and keys at k_first.. (0 and 0: the whole
  // attention), written over out and lse, or dq, dk and dv: cuDNN's graphs where they fit the
  // block, else the native kernels (kernels/cuda/cuda_attention.cu). op names errors.
  void attention_into(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                      const Tensor& v, int64_t q_first, int64_t k_first, const Documents& documents,
                      const char* op);
  void attention_gradients_into(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse,
                                int64_t q_first, int64_t k_first, const Documents& documents,
                                const char* op);

  // dst[j] += sum over rows of parts[rows, width], column by column in row order.
  void reduce_columns(float* dst, const float* parts, int64_t rows, int64_t width);

  // A cached cuBLASLt plan for one GEMM shape, dtype combination and pointer alignment.
  struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (a/b dtype, c dtype, pointer alignment, trans_a, trans_b, m, n, k, lda, ldb)
  using GemmKey =
      std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t>;
  const GemmPlan& gemm_plan(const GemmKey& key);

  int device_ = 0;
  int64_t max_copy_pitch_ = 0;  // cudaMemcpy2DAsync's largest pitch on this device
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  Buffer gemm_workspace_;
  std::map<GemmKey, GemmPlan> gemm_plans_;
  int gemm_plans_built_ = 0;  // since take_plans_built, and the host seconds they took
  double gemm_plan_seconds_ = 0.0;
  std::deque<std::pair<int64_t, cudaEvent_t>> uploads_;  // in flight, oldest first
  int64_t upload_tickets_ = 0;
  std::unique_ptr<CudnnAttention> cudnn_attention_;  // kernels.attention: cudnn only
  std::unique_ptr<CudaTimeline> timeline_;           // the profiler's device time
  std::unique_ptr<CudaTransfers> transfers_;         // memory.offload_checkpoints
};

}  // namespace ulysses
