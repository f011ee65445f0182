// CpuBackend: memory, data movement, elementwise helpers, GEMM, bias and AdamW.
#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/host_memory.h"
#include "kernels/cpu/portable_gemm.h"
#include "kernels/op_formulas.h"

namespace ulysses {

void CpuBackend::set_num_threads(int threads) {
  if (threads < 1) throw std::invalid_argument("set_num_threads: threads must be >= 1");
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

bool CpuBackend::blas_uses_openmp() {
  constexpr int kOpenBlasOpenMp = 2;  // openblas_get_parallel(): 0 serial, 1 pthreads
  return openblas_get_parallel() == kOpenBlasOpenMp;
}

std::string CpuBackend::setup_warning() const {
  if (blas_uses_openmp()) return "";
  return "OpenBLAS runs its GEMMs on threads of its own, which contend with the other ops' "
         "OpenMP threads for the cores (a step up to 2x slower; docs/performance.md, "
         "\"Threads\"): install libopenblas0-openmp and build again";
}

std::string CpuBackend::setup_note() const {
  if (gemm_ == CpuGemm::portable) return "GEMMs on the portable GEMM";
  // OpenBLAS picks its kernels by CPU when it loads, or by OPENBLAS_CORETYPE: the GEMM rate and
  // the GEMMs' last bits follow them (docs/performance.md, "Threads").
  return std::string("GEMMs on OpenBLAS's ") + openblas_get_corename() + " kernels" +
         (std::getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
}

Backend::AvailableMemory CpuBackend::available_memory() const {
  return {host_available_bytes(), true, kHostMemorySource};
}

void* CpuBackend::raw_alloc(size_t bytes) {
  constexpr size_t kAlignment = 64;
  // aligned_alloc wants a multiple of the alignment; a zero-byte request still gets a
  // distinct pointer so that an empty tensor is not mistaken for a missing one.
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* pointer = std::aligned_alloc(kAlignment, rounded);
  if (!pointer)
    throw OutOfMemoryError("cpu: allocation of " + format_bytes(int64_t(bytes)) + " failed");
  return pointer;
}

void* CpuBackend::raw_alloc_zeroed(size_t bytes) {
  // A fresh private mapping reads as zero and takes memory only where it is written: the
  // gradients and moments cost nothing at startup. Its pages are transparent huge pages, on
  // 2 MiB boundaries: the first write of each 2 MiB is one page fault instead of 512, which
  // matters where faults are slow (virtual machines; docs/performance.md, "Startup").
  constexpr size_t kHugePage = size_t(2) << 20;
  if (bytes < kHugePage) return nullptr;
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const size_t length = rounded + kHugePage;  // room to start on a boundary
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    throw OutOfMemoryError("cpu: mapping " + format_bytes(int64_t(bytes)) + " failed");
  const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1);
  void* pointer = reinterpret_cast<void*>(start);
  madvise(pointer, rounded, MADV_HUGEPAGE);  // a hint: without it the pages are small
  std::lock_guard<std::mutex> lock(mappings_mutex_);
  mappings_[pointer] = {base, length};
  return pointer;
}

void CpuBackend::raw_free(void* pointer) {
  {
    std::lock_guard<std::mutex> lock(mappings_mutex_);
    auto mapping = mappings_.find(pointer);
    if (mapping != mappings_.end()) {
      munmap(mapping->second.first, mapping->second.second);
      mappings_.erase(mapping);
      return;
    }
  }
  std::free(pointer);
}

// ---- data movement -----------------------------------------------------------------------

int64_t CpuBackend::upload_async(const Tensor& dst, const void* host_src) {
  if (!separate_host_memory_) return Backend::upload_async(dst, host_src);
  deferred_uploads_.push_back({++upload_tickets_, dst, host_src});
  return upload_tickets_;
}

void CpuBackend::wait_upload(int64_t ticket) {
  while (!deferred_uploads_.empty() && deferred_uploads_.front().ticket <= ticket) {
    upload(deferred_uploads_.front().dst, deferred_uploads_.front().host_src);
    deferred_uploads_.pop_front();
  }
}

void CpuBackend::synchronize() {
  if (!deferred_uploads_.empty()) wait_upload(deferred_uploads_.back().ticket);
}

void CpuBackend::upload_impl(const Tensor& dst, const void* host_src) {
  if (dst.bytes() > 0) std::memcpy(dst.data, host_src, dst.bytes());
}

void CpuBackend::download_impl(void* host_dst, const Tensor& src) {
  if (src.bytes() > 0) std::memcpy(host_dst, src.data, src.bytes());
}

void CpuBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  if (dst.bytes() > 0 && dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
}

void CpuBackend::cast_impl(const Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (dst.dtype == src.dtype) {
    copy(dst, src);
  } else if (src.dtype == DType::f32) {
    const float* in = static_cast<const float*>(src.data);
    uint16_t* out = static_cast<uint16_t*>(dst.data);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  } else {
    const uint16_t* in = static_cast<const uint16_t*>(src.data);
    float* out = static_cast<float*>(dst.data);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  }
}

void CpuBackend::fill_zero_impl(const Tensor& dst) {
  // On every thread: on fresh memory the fill is mostly first-touch page faults, which the
  // cores take in parallel, and a gradient's fill each step is bound by memory bandwidth.
  constexpr size_t kChunk = size_t(2) << 20;
  const size_t bytes = dst.bytes();
  char* data = static_cast<char*>(dst.data);
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const size_t at = size_t(chunk) * kChunk;
    std::memset(data + at, 0, std::min(kChunk, bytes - at));
  }
}

void CpuBackend::copy_2d_impl(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                              int64_t row_bytes, int64_t rows) {
  char* out = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * dst_pitch, in + r * src_pitch, row_bytes);
}

// ---- elementwise -------------------------------------------------------------------------

void CpuBackend::axpy_impl(const Tensor& y, const Tensor& x, float alpha) {
  float* out = y.f32();
  const float* in = x.f32();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += alpha * in[i];
}

void CpuBackend::scale_impl(const Tensor& x, float alpha) {
  float* data = x.f32();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) data[i] *= alpha;
}

double CpuBackend::sum_squares_impl(const Tensor& x) {
  const float* data = x.f32();
  const int64_t n = x.numel();
  // Fixed chunks summed in chunk order: the result does not depend on the thread count.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double sum = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) sum += double(data[i]) * double(data[i]);
    partial[size_t(c)] = sum;
  }
  double total = 0.0;
  for (double value : partial) total += value;
  return total;
}

// ---- GEMM --------------------------------------------------------------------------------

void CpuBackend::gemm_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                           const Tensor& c, float alpha, float beta) {
  const int64_t m = c.shape[0], n = c.shape[1];
  const int64_t k = trans_a ? a.shape[0] : a.shape[1];
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale(c, beta);
    if (beta == 0.0f) fill_zero(c);
    return;
  }
  sgemm(trans_a, trans_b, m, n, k, alpha, a.f32(), a.shape[1], b.f32(), b.shape[1], beta, c.f32(),
        n);
}

void CpuBackend::sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc) const {
  if (gemm_ == CpuGemm::portable) {
    cpu::portable_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
}

void CpuBackend::bias_forward_impl(const Tensor& out, const Tensor& bias) {
  const int64_t width = bias.numel();
  const int64_t rows = out.numel() / width;
  float* o = out.f32();
  const float* b = bias.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = o + r * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) row[j] += b[j];
  }
}

void CpuBackend::bias_backward_impl(const Tensor& dbias, const Tensor& dout) {
  const int64_t width = dbias.numel();
  const int64_t rows = dout.numel() / width;
  const float* g = dout.f32();
  cpu::add_column_sums(dbias.f32(), width, rows,
                       [&](int64_t r, int64_t j) { return g[r * width + j]; });
}

// ---- optimizer ---------------------------------------------------------------------------

void CpuBackend::adamw_impl(const Tensor& param, const Tensor& grad, const Tensor& m,
                            const Tensor& v, const AdamWStep& step) {
  const int64_t n = param.numel();
  const formulas::AdamWScalars scalars = formulas::adamw_scalars(step);
  float* p = param.f32();
  const float* g = grad.f32();
  float* m_state = m.f32();
  float* v_state = v.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    formulas::adamw_update(p[i], g[i], m_state[i], v_state[i], scalars);
}

}  // namespace ulysses
