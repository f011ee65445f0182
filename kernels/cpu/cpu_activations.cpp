// CpuBackend: token/position embedding, rotary position embedding, SwiGLU and GELU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/op_contracts.h"
#include "kernels/op_formulas.h"
#include "kernels/op_scratch.h"

namespace ulysses {

void CpuBackend::embedding_forward_impl(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                        const Tensor& wpe, int64_t pos_offset) {
  const char* op = "embedding_forward";
  const int64_t vocab = wte.shape[0], width = wte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = contracts::sequence_length(tokens);
  const bool with_positions = !wpe.empty();
  contracts::check_token_ids(tokens.i32(), n, vocab, op);

  const int32_t* ids = tokens.i32();
  const float* token_table = wte.f32();
  const float* position_table = with_positions ? wpe.f32() : nullptr;
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* token_row = token_table + int64_t(ids[i]) * width;
    float* out_row = o + i * width;
    if (with_positions) {
      const float* position_row = position_table + (pos_offset + i % seq_len) * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) out_row[j] = token_row[j] + position_row[j];
    } else {
      std::copy(token_row, token_row + width, out_row);
    }
  }
}

void CpuBackend::embedding_backward_impl(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                         const Tensor& tokens, int64_t pos_offset) {
  const char* op = "embedding_backward";
  const int64_t vocab = dwte.shape[0], width = dwte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = contracts::sequence_length(tokens);
  const bool with_positions = !dwpe.empty();
  contracts::check_token_ids(tokens.i32(), n, vocab, op);

  const int32_t* ids = tokens.i32();
  const float* g = dout.f32();
  float* token_grad = dwte.f32();
  // Threads own blocks of columns and visit tokens in order, so repeated tokens add up
  // without races and always in the same order.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (width + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t j0 = block * kBlock;
    const int64_t count = std::min(kBlock, width - j0);
    for (int64_t i = 0; i < n; ++i) {
      float* grad_row = token_grad + int64_t(ids[i]) * width + j0;
      const float* g_row = g + i * width + j0;
      for (int64_t j = 0; j < count; ++j) grad_row[j] += g_row[j];
    }
  }
  if (!with_positions) return;
  const int64_t batch = n / seq_len;
  float* position_grad = dwpe.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < seq_len; ++t) {
    float* grad_row = position_grad + (pos_offset + t) * width;
    for (int64_t b = 0; b < batch; ++b) {
      const float* g_row = g + (b * seq_len + t) * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) grad_row[j] += g_row[j];
    }
  }
}

void CpuBackend::rope_impl(const Tensor& x, int64_t pos_offset, float theta, bool inverse) {
  const char* op = "rope";
  const int64_t batch = x.shape[0], seq_len = x.shape[1], heads = x.shape[2], dim = x.shape[3];
  const int64_t half = dim / 2;

  // cos/sin of pos·theta^(-2i/d) for the T positions of this call; the angle is formed in
  // double because positions reach millions.
  Buffer table = rope_table(*this, seq_len, half);
  float* cos_table = table.f32();
  float* sin_table = cos_table + seq_len * half;
  const double sign = inverse ? -1.0 : 1.0;
  std::vector<double> frequency(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    frequency[size_t(i)] = formulas::rope_frequency(double(theta), i, dim);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = formulas::rope_angle(sign, pos_offset + t, frequency[size_t(i)]);
      cos_table[t * half + i] = float(std::cos(angle));
      sin_table[t * half + i] = float(std::sin(angle));
    }
  }

  float* data = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < batch * seq_len; ++bt) {
    const int64_t t = bt % seq_len;
    const float* cos_row = cos_table + t * half;
    const float* sin_row = sin_table + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* first = data + (bt * heads + h) * dim;
      float* second = first + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = first[i], b = second[i];
        first[i] = a * cos_row[i] - b * sin_row[i];
        second[i] = b * cos_row[i] + a * sin_row[i];
      }
    }
  }
}

void CpuBackend::swiglu_forward_impl(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  const int64_t n = out.numel();
  float* o = out.f32();
  const float* g = gate.f32();
  const float* u = up.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float sigmoid = 1.0f / (1.0f + cpu::fast_exp(-g[i]));
    o[i] = g[i] * sigmoid * u[i];
  }
}

void CpuBackend::swiglu_backward_impl(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                      const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  const int64_t n = dout.numel();
  float* dg = dgate.f32();
  float* du = dup.f32();
  const float* go = dout.f32();
  const float* g = gate.f32();
  const float* u = up.f32();
  // silu(g) = g s(g), silu'(g) = s(g) (1 + g (1 - s(g))).
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // Every input is read before either output is written: dout may be the memory of dgate
    // or dup, and dgate and dup may be gate and up themselves.
    const float gate_in = g[i], up_in = u[i], grad_out = go[i];
    const float sigmoid = 1.0f / (1.0f + cpu::fast_exp(-gate_in));
    const float silu = gate_in * sigmoid;
    du[i] = grad_out * silu;
    dg[i] = formulas::swiglu_gate_gradient(grad_out, up_in, gate_in, sigmoid);
  }
}

void CpuBackend::gelu_forward_impl(const Tensor& out, const Tensor& x) {
  const int64_t n = x.numel();
  float* o = out.f32();
  const float* in = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    o[i] = formulas::gelu_from_tanh(in[i], std::tanh(formulas::gelu_tanh_argument(in[i])));
  }
}

void CpuBackend::gelu_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const int64_t n = x.numel();
  float* d = dx.f32();
  const float* g = dout.f32();
  const float* in = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float tanh_a = std::tanh(formulas::gelu_tanh_argument(in[i]));
    d[i] = g[i] * formulas::gelu_derivative_from_tanh(in[i], tanh_a);
  }
}

}  // namespace ulysses
