// CudaBackend: RMSNorm and LayerNorm over rows of width C. One block per row with fp32
// statistics; weight and bias gradients go through the deterministic column sums.
#include <cstdio>

#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cuda_column_sums.cuh"
#include "kernels/cuda/cuda_norms_kernels.cuh"

namespace ulysses {

using cuda::check_launch;
using cuda::LaunchShape;

namespace {

// Rows go to blockIdx.x, which allows 2^31 − 1 of them.
void check_rows(int64_t rows, const char* op) {
  if (rows > int64_t(0x7fffffff))
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) +
                                " rows exceed one launch");
}

}  // namespace

void CudaBackend::rmsnorm_forward_impl(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                       const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;
  check_rows(rows, op);
  if (rows == 0) return;
  const LaunchShape row = cuda::block_per_row_launch(rows);
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cuda::rmsnorm_forward_kernel<<<row.grid, row.threads, row.shared_bytes, stream_>>>(
        static_cast<T*>(out.data), rstd.f32(), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), width, eps);
  });
  check_launch(op);
}

void CudaBackend::rmsnorm_backward_impl(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                        const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;
  check_rows(rows, op);
  if (rows == 0) return;
  const LaunchShape row = cuda::block_per_row_launch(rows);
  const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
  Buffer parts = alloc(MemCategory::workspace, DType::f32, {chunks.chunks, width},
                       "rmsnorm_backward partial sums");
  const LaunchShape columns = cuda::column_partials_launch(width, chunks);
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    // Column sums first, so that dx may be the same buffer as dout (as on the cpu).
    cuda::column_partials_kernel<cuda::ColumnTerm::times_rms_input, T>
        <<<columns.grid, columns.threads, columns.shared_bytes, stream_>>>(
            parts.f32(), static_cast<const T*>(dout.data), static_cast<const T*>(x.data), nullptr,
            rstd.f32(), rows, width, chunks.rows_per_chunk);
    cuda::rmsnorm_backward_kernel<<<row.grid, row.threads, row.shared_bytes, stream_>>>(
        static_cast<T*>(dx.data), static_cast<const T*>(dout.data), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), rstd.f32(), width);
  });
  check_launch(op, 2);
  reduce_columns(dweight.f32(), parts.f32(), chunks.chunks, width);
}

void CudaBackend::layernorm_forward_impl(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                         const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         float eps) {
  const char* op = "layernorm_forward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;
  check_rows(rows, op);
  if (rows == 0) return;
  const LaunchShape row = cuda::block_per_row_launch(rows);
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cuda::layernorm_forward_kernel<<<row.grid, row.threads, row.shared_bytes, stream_>>>(
        static_cast<T*>(out.data), mean.f32(), rstd.f32(), static_cast<const T*>(x.data),
        static_cast<const T*>(weight.data), static_cast<const T*>(bias.data), width, eps);
  });
  check_launch(op);
}

void CudaBackend::layernorm_backward_impl(const Tensor& dx, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& dout, const Tensor& x,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;
  check_rows(rows, op);
  if (rows == 0) return;
  const LaunchShape row = cuda::block_per_row_launch(rows);
  const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
  Buffer parts = alloc(MemCategory::workspace, DType::f32, {2, chunks.chunks, width},
                       "layernorm_backward partial sums");
  float* weight_parts = parts.f32();
  float* bias_parts = weight_parts + chunks.chunks * width;
  const LaunchShape columns = cuda::column_partials_launch(width, chunks);
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dout.data);
    const T* in = static_cast<const T*>(x.data);
    // Column sums first, so that dx may be the same buffer as dout (as on the cpu).
    cuda::column_partials_kernel<cuda::ColumnTerm::times_normed_input, T>
        <<<columns.grid, columns.threads, columns.shared_bytes, stream_>>>(
            weight_parts, g, in, mean.f32(), rstd.f32(), rows, width, chunks.rows_per_chunk);
    cuda::column_partials_kernel<cuda::ColumnTerm::value, T>
        <<<columns.grid, columns.threads, columns.shared_bytes, stream_>>>(
            bias_parts, g, nullptr, nullptr, nullptr, rows, width, chunks.rows_per_chunk);
    cuda::layernorm_backward_kernel<<<row.grid, row.threads, row.shared_bytes, stream_>>>(
        static_cast<T*>(dx.data), g, in, static_cast<const T*>(weight.data), mean.f32(), rstd.f32(),
        width);
  });
  check_launch(op, 3);
  reduce_columns(dweight.f32(), weight_parts, chunks.chunks, width);
  reduce_columns(dbias.f32(), bias_parts, chunks.chunks, width);
}

}  // namespace ulysses
