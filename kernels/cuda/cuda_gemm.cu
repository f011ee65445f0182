// CudaBackend::gemm through cuBLASLt: bf16 (or f32) inputs, fp32 compute, C/D bf16 or f32.
// The interface is row-major and cuBLASLt is column-major. A row-major [r, c] matrix is the
// column-major [c, r] matrix of its transpose, so c = op(a)·op(b) is computed as
// cᵀ = op(b)ᵀ·op(a)ᵀ: cuBLASLt's A is our b, its B is our a, its m and n are our n and m.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/stopwatch.h"

namespace ulysses {

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuda: ") + what +
                             " failed: " + cublasLtGetStatusString(status));
}

cudaDataType_t lt_type(DType dtype) {
  return dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The largest power of two (up to 256) dividing the address: cuBLASLt must not pick a kernel
// that assumes more alignment than the views (slices of the flat weight buffer) have.
int pointer_alignment(const void* pointer) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  int alignment = 256;
  while (alignment > 1 && address % uintptr_t(alignment) != 0) alignment /= 2;
  return alignment;
}

}  // namespace

const CudaBackend::GemmPlan& CudaBackend::gemm_plan(const GemmKey& key) {
  auto found = gemm_plans_.find(key);
  if (found != gemm_plans_.end()) return found->second;
  const Stopwatch clock;
  const auto [ab_dtype, c_dtype, alignment, trans_a, trans_b, m, n, k, lda, ldb] = key;
  const cudaDataType_t ab_type = lt_type(DType(ab_dtype));
  const cudaDataType_t c_type = lt_type(DType(c_dtype));

  GemmPlan plan;
  check_cublas(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
      "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_cublas(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
      "cublasLtMatmulDescSetAttribute(TRANSB)");
  // Stored shapes in column-major terms: our row-major b [rows_b, ldb] is [ldb, rows_b].
  const int64_t rows_b = trans_b ? n : k;
  const int64_t rows_a = trans_a ? k : m;
  check_cublas(cublasLtMatrixLayoutCreate(&plan.a, ab_type, uint64_t(ldb), uint64_t(rows_b), ldb),
               "cublasLtMatrixLayoutCreate(A)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan.b, ab_type, uint64_t(lda), uint64_t(rows_a), lda),
               "cublasLtMatrixLayoutCreate(B)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan.c, c_type, uint64_t(n), uint64_t(m), n),
               "cublasLtMatrixLayoutCreate(C)");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = gemm_workspace_.bytes();
  const uint32_t alignment_bytes = uint32_t(alignment);
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
  for (auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment_bytes,
                                                    sizeof(alignment_bytes));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                            preference, 1, &heuristic, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
    throw std::runtime_error(
        "gemm: cuBLASLt has no algorithm for m " + std::to_string(m) + ", n " + std::to_string(n) +
        ", k " + std::to_string(k) + " with " + dtype_name(DType(ab_dtype)) + " inputs and " +
        dtype_name(DType(c_dtype)) + " output at " + std::to_string(alignment) + "-byte alignment");
  }
  plan.algo = heuristic.algo;
  ++gemm_plans_built_;
  gemm_plan_seconds_ += clock.seconds();
  return gemm_plans_.emplace(key, plan).first->second;
}

void CudaBackend::gemm_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                            const Tensor& c, float alpha, float beta) {
  const int64_t m = c.shape[0], n = c.shape[1];
  const int64_t k = trans_a ? a.shape[0] : a.shape[1];
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      fill_zero(c);
    else
      scale(c, beta);
    return;
  }
  const int alignment =
      std::min({pointer_alignment(a.data), pointer_alignment(b.data), pointer_alignment(c.data)});
  const GemmKey key{int(a.dtype), int(c.dtype), alignment, trans_a, trans_b, m, n, k,
                    a.shape[1],   b.shape[1]};
  const GemmPlan& plan = gemm_plan(key);
  cuda::count_enqueued();
  check_cublas(cublasLtMatmul(lt_, plan.desc, &alpha, b.data, plan.a, a.data, plan.b, &beta, c.data,
                              plan.c, c.data, plan.c, &plan.algo, gemm_workspace_.tensor().data,
                              gemm_workspace_.bytes(), stream_),
               "cublasLtMatmul");
}

}  // namespace ulysses
