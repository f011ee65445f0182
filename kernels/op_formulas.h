// Arithmetic that both backends need, written once: the AdamW scalars and update (PyTorch
// semantics), the GELU (tanh approximation) and SwiGLU derivatives, and the RoPE angles. Plain C++
// that nvcc also compiles for the device (ULYSSES_HOST_DEVICE), so kernels/cpu and kernels/cuda use
// the same lines.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"

#ifdef __CUDACC__
#define ULYSSES_HOST_DEVICE __host__ __device__
#else
#define ULYSSES_HOST_DEVICE
#endif

namespace ulysses::formulas {

// The per-step scalars of AdamW, formed in double and rounded to float, as PyTorch does with
// its Python-float hyperparameters.
struct AdamWScalars {
  float decay, step_size, bias_correction2_sqrt, beta1, beta2, one_minus_beta1, one_minus_beta2,
      eps, grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWStep& step) {
  const double bias_correction1 = 1.0 - std::pow(double(step.beta1), double(step.step));
  const double bias_correction2 = 1.0 - std::pow(double(step.beta2), double(step.step));
  AdamWScalars s;
  s.decay = float(1.0 - double(step.lr) * double(step.weight_decay));
  s.step_size = float(double(step.lr) / bias_correction1);
  s.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  s.beta1 = step.beta1;
  s.beta2 = step.beta2;
  s.one_minus_beta1 = float(1.0 - double(step.beta1));
  s.one_minus_beta2 = float(1.0 - double(step.beta2));
  s.eps = step.eps;
  s.grad_scale = step.grad_scale;
  return s;
}

// One element of AdamW with decoupled weight decay.
ULYSSES_HOST_DEVICE inline void adamw_update(float& param, float grad, float& m, float& v,
                                             const AdamWScalars& s) {
  const float g = s.grad_scale * grad;
  float p = param * s.decay;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  param = p - s.step_size * (m / denom);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// GELU's tanh argument: sqrt(2/π) (x + 0.044715 x³).
ULYSSES_HOST_DEVICE inline float gelu_tanh_argument(float x) {
  return kSqrt2OverPi * (x + kGeluCubic * x * x * x);
}

// 0.5 x (1 + tanh a), given tanh a.
ULYSSES_HOST_DEVICE inline float gelu_from_tanh(float x, float tanh_a) {
  return 0.5f * x * (1.0f + tanh_a);
}

// d gelu / dx, given tanh a.
ULYSSES_HOST_DEVICE inline float gelu_derivative_from_tanh(float x, float tanh_a) {
  const float sech2 = 1.0f - tanh_a * tanh_a;
  return 0.5f * (1.0f + tanh_a) +
         0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

// SwiGLU's gradient with respect to the gate g: dout · up · silu'(g), where
// silu'(g) = s (1 + g (1 − s)) and s is the sigmoid of g (each backend has its own exp).
ULYSSES_HOST_DEVICE inline float swiglu_gate_gradient(float dout, float up, float g,
                                                      float sigmoid) {
  return dout * up * sigmoid * (1.0f + g * (1.0f - sigmoid));
}

// RoPE's frequency of pair i in a head of `dim`: theta^(−2i/d). Angles are formed in double:
// positions reach millions, where a float angle would lose whole radians.
ULYSSES_HOST_DEVICE inline double rope_frequency(double theta, int64_t i, int64_t dim) {
  return pow(theta, -2.0 * double(i) / double(dim));
}

// The angle at `position`; sign −1 turns the other way (the inverse rotation, the backward).
ULYSSES_HOST_DEVICE inline double rope_angle(double sign, int64_t position, double frequency) {
  return sign * double(position) * frequency;
}

}  // namespace ulysses::formulas
