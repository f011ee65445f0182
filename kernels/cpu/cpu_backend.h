// The fp32 reference backend: OpenBLAS (or the portable GEMM) for GEMMs, OpenMP loops for
// everything else.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "kernels/backend.h"
#include "kernels/op_scratch.h"

namespace ulysses {

// Which GEMM the cpu backend runs (docs/design.md, "Bits that do not depend on the machine").
enum class CpuGemm {
  openblas,  // fast; its last bits depend on the kernels OpenBLAS picks for the CPU
  portable,  // kernels/cpu/portable_gemm.h: the same bits on every x86-64 machine, slower
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int64_t memory_limit_bytes = 0) : Backend(memory_limit_bytes) {}

  // Makes offloaded layer inputs move out and back as on a device backend (docs/memory.md),
  // so that schedule is run and tested on machines without a GPU; and staged uploads land
  // only when waited for (wait_upload, synchronize), the latest a copy engine may read the
  // host memory, so that a caller refilling it too early is seen.
  void treat_host_memory_as_separate() { separate_host_memory_ = true; }
  bool host_memory_is_separate() const override { return separate_host_memory_; }
  // The GEMMs of every op (gemm, and the LM head inside lm_head_loss); OpenBLAS unless set.
  void use_gemm(CpuGemm gemm) { gemm_ = gemm; }
  CpuGemm gemm_kind() const { return gemm_; }
  int64_t upload_async(const Tensor& dst, const void* host_src) override;
  void wait_upload(int64_t ticket) override;

  std::string name() const override { return "cpu"; }
  BackendKind kind() const override { return BackendKind::cpu; }
  DType compute_dtype() const override { return compute_dtype_of(BackendKind::cpu); }
  void set_num_threads(int threads) override;
  // Whether OpenBLAS runs its GEMMs on the OpenMP threads of the other cpu ops, rather than
  // on a pool of its own that contends with them (docs/performance.md, "Threads").
  static bool blas_uses_openmp();
  std::string setup_warning() const override;
  AvailableMemory available_memory() const override;
  std::string setup_note() const override;

  void* raw_alloc(size_t bytes) override;
  void* raw_alloc_zeroed(size_t bytes) override;
  void raw_free(void* pointer) override;
  void synchronize() override;

 private:
  // Attention's backward over one block: dq, dk, dv overwritten, or added to (accumulate).
  void block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                      const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, int64_t q_first, int64_t k_first,
                      const Documents& documents, bool accumulate);
  // Every op of kernels/op_table.h.
  ULYSSES_BACKEND_OPS(ULYSSES_DECLARE_OP_IMPL)

  // Row-major c[m, n] = alpha · op(a) op(b) + beta · c through the chosen GEMM.
  void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) const;

  bool separate_host_memory_ = false;
  CpuGemm gemm_ = CpuGemm::openblas;
  struct DeferredUpload {
    int64_t ticket;
    Tensor dst;
    const void* host_src;
  };
  std::deque<DeferredUpload> deferred_uploads_;  // oldest first
  // raw_alloc_zeroed's mappings: where each starts, and its base and length for munmap.
  std::mutex mappings_mutex_;
  std::unordered_map<void*, std::pair<void*, size_t>> mappings_;
  int64_t upload_tickets_ = 0;
};

}  // namespace ulysses
