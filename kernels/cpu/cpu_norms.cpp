// CpuBackend: RMSNorm and LayerNorm over rows of width C. Row statistics are accumulated in
// double; weight/bias gradients are reduced per column in row order (deterministic).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace ulysses {

void CpuBackend::rmsnorm_forward_impl(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                      const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;

  const float* in = x.f32();
  const float* w = weight.f32();
  float* o = out.f32();
  float* rs = rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < width; ++j) sum_sq += double(row[j]) * double(row[j]);
    const float row_rstd = float(1.0 / std::sqrt(sum_sq / double(width) + double(eps)));
    rs[r] = row_rstd;
    float* out_row = o + r * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out_row[j] = row[j] * row_rstd * w[j];
  }
}

void CpuBackend::rmsnorm_backward_impl(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                       const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;

  const float* in = x.f32();
  const float* w = weight.f32();
  const float* g = dout.f32();
  const float* rs = rstd.f32();
  float* dxp = dx.f32();
  // Weight gradients first, so that dx may be the same buffer as dout.
  cpu::add_column_sums(dweight.f32(), width, rows, [&](int64_t r, int64_t j) {
    return double(g[r * width + j]) * double(in[r * width + j]) * double(rs[r]);
  });
  // out_j = x_j r w_j with r = (mean(x²) + eps)^(-1/2), dr/dx_j = -r³ x_j / C, so
  // dx_j = r w_j g_j - (r³ / C) x_j Σ_i g_i w_i x_i.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    const float* grow = g + r * width;
    double dot = 0.0;
    for (int64_t j = 0; j < width; ++j) dot += double(grow[j]) * double(w[j]) * double(row[j]);
    const double row_rstd = rs[r];
    const float coefficient = float(row_rstd * row_rstd * row_rstd * dot / double(width));
    const float row_rstd_f = rs[r];
    float* dx_row = dxp + r * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j)
      dx_row[j] += row_rstd_f * w[j] * grow[j] - coefficient * row[j];
  }
}

void CpuBackend::layernorm_forward_impl(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        float eps) {
  const char* op = "layernorm_forward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;

  const float* in = x.f32();
  const float* w = weight.f32();
  const float* b = bias.f32();
  float* o = out.f32();
  float* mu = mean.f32();
  float* rs = rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    double sum = 0.0;
    for (int64_t j = 0; j < width; ++j) sum += row[j];
    const double row_mean = sum / double(width);
    double sum_sq = 0.0;
    for (int64_t j = 0; j < width; ++j) {
      const double centered = double(row[j]) - row_mean;
      sum_sq += centered * centered;
    }
    const float row_rstd = float(1.0 / std::sqrt(sum_sq / double(width) + double(eps)));
    const float row_mean_f = float(row_mean);
    mu[r] = row_mean_f;
    rs[r] = row_rstd;
    float* out_row = o + r * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out_row[j] = (row[j] - row_mean_f) * row_rstd * w[j] + b[j];
  }
}

void CpuBackend::layernorm_backward_impl(const Tensor& dx, const Tensor& dweight,
                                         const Tensor& dbias, const Tensor& dout, const Tensor& x,
                                         const Tensor& weight, const Tensor& mean,
                                         const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = x.numel() / width;

  const float* in = x.f32();
  const float* w = weight.f32();
  const float* g = dout.f32();
  const float* mu = mean.f32();
  const float* rs = rstd.f32();
  float* dxp = dx.f32();
  // Weight and bias gradients first, so that dx may be the same buffer as dout.
  cpu::add_column_sums(dweight.f32(), width, rows, [&](int64_t r, int64_t j) {
    return double(g[r * width + j]) * (double(in[r * width + j]) - double(mu[r])) * double(rs[r]);
  });
  cpu::add_column_sums(dbias.f32(), width, rows,
                       [&](int64_t r, int64_t j) { return double(g[r * width + j]); });
  // With x̂ = (x - mean) r and ĝ = g w: dx = r (ĝ - mean(ĝ) - x̂ mean(ĝ x̂)).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    const float* grow = g + r * width;
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int64_t j = 0; j < width; ++j) {
      const double g_hat = double(grow[j]) * double(w[j]);
      sum_g += g_hat;
      sum_g_xhat += g_hat * (double(row[j]) - double(mu[r])) * double(rs[r]);
    }
    const float mean_g = float(sum_g / double(width));
    const float mean_g_xhat = float(sum_g_xhat / double(width));
    const float row_mean = mu[r], row_rstd = rs[r];
    float* dx_row = dxp + r * width;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) {
      const float xhat = (row[j] - row_mean) * row_rstd;
      dx_row[j] += row_rstd * (grow[j] * w[j] - mean_g - xhat * mean_g_xhat);
    }
  }
}

}  // namespace ulysses
