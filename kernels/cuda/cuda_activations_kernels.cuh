// Embedding, RoPE, SwiGLU and GELU kernels (launched by cuda_activations.cu), apart from their
// launches so that the host emulation can run them too (tests/test_backend_ops.cpp). All are
// grid-stride loops (elementwise_launch) except the embedding backward, one block per distinct
// token id (block_per_row_launch of the segments of embedding_backward_plan).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/op_formulas.h"

namespace ulysses::cuda {

// Token indices grouped by id, in token order (a stable counting sort), for the embedding
// backward: order[n], then starts[segments + 1], then segment_ids[segments] in one array, so
// that one upload carries it. Segment s covers order[starts[s] .. starts[s + 1]).
struct EmbeddingBackwardPlan {
  std::vector<int32_t> data;
  int64_t segments = 0;
};

inline EmbeddingBackwardPlan embedding_backward_plan(const std::vector<int32_t>& ids,
                                                     int64_t vocab) {
  const int64_t n = int64_t(ids.size());
  std::vector<int32_t> count(size_t(vocab) + 1, 0);
  for (int32_t id : ids) ++count[size_t(id) + 1];
  for (int64_t v = 0; v < vocab; ++v) count[size_t(v) + 1] += count[size_t(v)];
  EmbeddingBackwardPlan plan;
  plan.data.resize(size_t(n));
  std::vector<int32_t> next(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < n; ++i) plan.data[size_t(next[size_t(ids[size_t(i)])]++)] = int32_t(i);
  std::vector<int32_t> segment_ids;
  for (int64_t v = 0; v < vocab; ++v) {
    if (count[size_t(v) + 1] > count[size_t(v)]) {
      plan.data.push_back(count[size_t(v)]);
      segment_ids.push_back(int32_t(v));
    }
  }
  plan.data.push_back(int32_t(n));
  plan.segments = int64_t(segment_ids.size());
  plan.data.insert(plan.data.end(), segment_ids.begin(), segment_ids.end());
  return plan;
}

// Each header user gets its own copy (internal linkage): the kernels are not relocatable.
namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* wte, const T* wpe,
                                         int64_t n, int64_t width, int64_t seq_len,
                                         int64_t pos_offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * width;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / width, j = i % width;
    float value = to_float(wte[int64_t(ids[token]) * width + j]);
    if (wpe) value += to_float(wpe[(pos_offset + token % seq_len) * width + j]);
    out[i] = from_float<T>(value);
  }
}

// One block per distinct token id: segment s covers order[starts[s] .. starts[s + 1]).
template <typename T>
__global__ void embedding_backward_kernel(float* dwte, const T* dout, const int32_t* order,
                                          const int32_t* starts, const int32_t* segment_ids,
                                          int64_t width) {
  const int segment = blockIdx.x;
  const int begin = starts[segment], end = starts[segment + 1];
  float* grad_row = dwte + int64_t(segment_ids[segment]) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    float sum = 0.0f;
    for (int s = begin; s < end; ++s) sum += to_float(dout[int64_t(order[s]) * width + j]);
    grad_row[j] += sum;
  }
}

template <typename T>
__global__ void position_backward_kernel(float* dwpe, const T* dout, int64_t batch, int64_t seq_len,
                                         int64_t width, int64_t pos_offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < seq_len * width;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, j = i % width;
    float sum = 0.0f;
    for (int64_t b = 0; b < batch; ++b) sum += to_float(dout[(b * seq_len + t) * width + j]);
    dwpe[(pos_offset + t) * width + j] += sum;
  }
}

// cos/sin of the RoPE angles (kernels/op_formulas.h) at positions pos_offset + t.
__global__ void rope_table_kernel(float* cos_table, float* sin_table, int64_t seq_len, int64_t half,
                                  int64_t dim, int64_t pos_offset, double theta, double sign) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < seq_len * half;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half, i = idx % half;
    const double angle =
        formulas::rope_angle(sign, pos_offset + t, formulas::rope_frequency(theta, i, dim));
    double sine, cosine;
    sincos(angle, &sine, &cosine);
    cos_table[idx] = float(cosine);
    sin_table[idx] = float(sine);
  }
}

template <typename T>
__global__ void rope_apply_kernel(T* x, const float* cos_table, const float* sin_table,
                                  int64_t rows, int64_t seq_len, int64_t heads, int64_t half) {
  // rows = B·T·H (one head vector each); element (row, i) rotates the pair (i, i + half).
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * half;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / half, i = idx % half;
    const int64_t t = (row / heads) % seq_len;
    T* first = x + row * 2 * half;
    const float a = to_float(first[i]), b = to_float(first[i + half]);
    const float c = cos_table[t * half + i], s = sin_table[t * half + i];
    first[i] = from_float<T>(a * c - b * s);
    first[i + half] = from_float<T>(b * c + a * s);
  }
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + __expf(-x));
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]);
    out[i] = from_float<T>(g * sigmoid(g) * to_float(up[i]));
  }
}

// silu(g) = g s(g), silu'(g) = s(g) (1 + g (1 − s(g))). Every input is read before either
// output is written, since dout may be the memory of dgate or dup.
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]), u = to_float(up[i]), grad_out = to_float(dout[i]);
    const float s = sigmoid(g);
    dup[i] = from_float<T>(grad_out * g * s);
    dgate[i] = from_float<T>(formulas::swiglu_gate_gradient(grad_out, u, g, s));
  }
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]);
    out[i] = from_float<T>(formulas::gelu_from_tanh(v, tanhf(formulas::gelu_tanh_argument(v))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]), grad_out = to_float(dout[i]);
    const float tanh_a = tanhf(formulas::gelu_tanh_argument(v));
    dx[i] = from_float<T>(grad_out * formulas::gelu_derivative_from_tanh(v, tanh_a));
  }
}

}  // namespace

}  // namespace ulysses::cuda
