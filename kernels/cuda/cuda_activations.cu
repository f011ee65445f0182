// CudaBackend: token/position embedding, rotary position embedding, SwiGLU and GELU.
//
// Embedding backward is deterministic without atomics: the token ids are sorted on the host
// (a stable counting sort; ids are downloaded anyway to be validated), and one block per
// distinct id adds its rows of dout in token order into that id's row of dwte.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend_impl.cuh"

namespace ulysses {

using cuda::bf16;
using cuda::check_launch;
using cuda::from_float;
using cuda::kThreads;
using cuda::to_float;

namespace {

// Token ids come from data files (untrusted): every id must index a row of wte.
std::vector<int32_t> checked_token_ids(CudaBackend& backend, const Tensor& tokens, int64_t vocab,
                                       const char* op) {
  std::vector<int32_t> ids(size_t(tokens.numel()));
  backend.download(ids.data(), tokens);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw std::out_of_range(std::string(op) + ": token id " + std::to_string(ids[i]) +
                              " at index " + std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  }
  return ids;
}

void check_positions(const Tensor& wpe, int64_t pos_offset, int64_t seq_len, const char* op) {
  if (pos_offset < 0 || pos_offset + seq_len > wpe.shape[0])
    throw std::out_of_range(std::string(op) + ": positions [" + std::to_string(pos_offset) + ", " +
                            std::to_string(pos_offset + seq_len) + ") exceed wpe " +
                            wpe.shape_string());
}

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

}  // namespace

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                    const Tensor& wpe, int64_t pos_offset) {
  const char* op = "embedding_forward";
  cuda::require_float(wte, op, "wte");
  cuda::require_same_dtype(out, wte, op, "out", "wte");
  cuda::require_dtype(tokens, DType::i32, op, "tokens");
  cuda::require_ndim(wte, 2, op, "wte");
  const int64_t vocab = wte.shape[0], width = wte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = tokens.shape[tokens.ndim - 1];
  cuda::require_numel(out, n * width, op, "out");
  const bool with_positions = !wpe.empty();
  if (with_positions) {
    cuda::require_same_dtype(wpe, wte, op, "wpe", "wte");
    cuda::require_ndim(wpe, 2, op, "wpe");
    if (wpe.shape[1] != width)
      throw std::invalid_argument(std::string(op) + ": wpe " + wpe.shape_string() + " and wte " +
                                  wte.shape_string() + " differ in width");
    check_positions(wpe, pos_offset, seq_len, op);
  }
  checked_token_ids(*this, tokens, vocab, op);
  if (n == 0) return;
  cuda::dispatch_float(wte, op, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<<<cuda::blocks_for(n * width), kThreads, 0, stream_>>>(
        static_cast<T*>(out.data), tokens.i32(), static_cast<const T*>(wte.data),
        with_positions ? static_cast<const T*>(wpe.data) : nullptr, n, width, seq_len, pos_offset);
  });
  check_launch(op);
}

void CudaBackend::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                     const Tensor& tokens, int64_t pos_offset) {
  const char* op = "embedding_backward";
  cuda::require_dtype(dwte, DType::f32, op, "dwte");
  cuda::require_float(dout, op, "dout");
  cuda::require_dtype(tokens, DType::i32, op, "tokens");
  cuda::require_ndim(dwte, 2, op, "dwte");
  const int64_t vocab = dwte.shape[0], width = dwte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = tokens.shape[tokens.ndim - 1];
  cuda::require_numel(dout, n * width, op, "dout");
  const bool with_positions = !dwpe.empty();
  if (with_positions) {
    cuda::require_dtype(dwpe, DType::f32, op, "dwpe");
    cuda::require_ndim(dwpe, 2, op, "dwpe");
    if (dwpe.shape[1] != width)
      throw std::invalid_argument(std::string(op) + ": dwpe " + dwpe.shape_string() + " and dwte " +
                                  dwte.shape_string() + " differ in width");
    check_positions(dwpe, pos_offset, seq_len, op);
  }
  if (n > int64_t(0x7fffffff))
    throw std::invalid_argument(std::string(op) + ": more than 2^31 tokens in one call");
  const std::vector<int32_t> ids = checked_token_ids(*this, tokens, vocab, op);
  if (n == 0) return;

  // Stable counting sort by id: order lists token indices grouped by id, in token order.
  std::vector<int32_t> count(size_t(vocab) + 1, 0);
  for (int32_t id : ids) ++count[size_t(id) + 1];
  for (int64_t v = 0; v < vocab; ++v) count[size_t(v) + 1] += count[size_t(v)];
  std::vector<int32_t> plan;  // order[n], then starts[segments + 1], then segment_ids[segments]
  plan.resize(size_t(n));
  {
    std::vector<int32_t> next(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n; ++i) plan[size_t(next[size_t(ids[size_t(i)])]++)] = int32_t(i);
  }
  std::vector<int32_t> segment_ids;
  for (int64_t v = 0; v < vocab; ++v) {
    if (count[size_t(v) + 1] > count[size_t(v)]) {
      plan.push_back(count[size_t(v)]);
      segment_ids.push_back(int32_t(v));
    }
  }
  plan.push_back(int32_t(n));
  const int64_t segments = int64_t(segment_ids.size());
  plan.insert(plan.end(), segment_ids.begin(), segment_ids.end());
  Buffer device_plan = alloc(MemCategory::workspace, DType::i32, {int64_t(plan.size())},
                             "embedding_backward token order");
  upload(device_plan, plan.data());
  const int32_t* order = device_plan.i32();
  const int32_t* starts = order + n;
  const int32_t* device_segment_ids = starts + segments + 1;

  cuda::dispatch_float(dout, op, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dout.data);
    embedding_backward_kernel<<<unsigned(segments), kThreads, 0, stream_>>>(
        dwte.f32(), g, order, starts, device_segment_ids, width);
    if (with_positions)
      position_backward_kernel<<<cuda::blocks_for(seq_len * width), kThreads, 0, stream_>>>(
          dwpe.f32(), g, n / seq_len, seq_len, width, pos_offset);
  });
  check_launch(op);
}

// ---- RoPE --------------------------------------------------------------------------------

namespace {

// cos/sin of sign · pos · theta^(−2i/d), formed in double because positions reach millions
// (a float angle would lose whole radians there).
__global__ void rope_table_kernel(float* cos_table, float* sin_table, int64_t seq_len, int64_t half,
                                  int64_t dim, int64_t pos_offset, double theta, double sign) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < seq_len * half;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half, i = idx % half;
    const double frequency = pow(theta, -2.0 * double(i) / double(dim));
    const double angle = sign * double(pos_offset + t) * frequency;
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

}  // namespace

void CudaBackend::rope(const Tensor& x, int64_t pos_offset, float theta, bool inverse) {
  const char* op = "rope";
  cuda::require_float(x, op, "x");
  cuda::require_ndim(x, 4, op, "x");
  const int64_t batch = x.shape[0], seq_len = x.shape[1], heads = x.shape[2], dim = x.shape[3];
  if (dim % 2 != 0)
    throw std::invalid_argument("rope: head dim " + std::to_string(dim) + " is odd");
  if (pos_offset < 0) throw std::invalid_argument("rope: negative pos_offset");
  const int64_t half = dim / 2;
  if (x.numel() == 0) return;
  Buffer table = rope_table(*this, seq_len, half);
  float* cos_table = table.f32();
  float* sin_table = cos_table + seq_len * half;
  rope_table_kernel<<<cuda::blocks_for(seq_len * half), kThreads, 0, stream_>>>(
      cos_table, sin_table, seq_len, half, dim, pos_offset, double(theta), inverse ? -1.0 : 1.0);
  check_launch(op);
  const int64_t rows = batch * seq_len * heads;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    rope_apply_kernel<<<cuda::blocks_for(rows * half), kThreads, 0, stream_>>>(
        static_cast<T*>(x.data), cos_table, sin_table, rows, seq_len, heads, half);
  });
  check_launch(op);
}

// ---- SwiGLU and GELU ---------------------------------------------------------------------

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

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
    dgate[i] = from_float<T>(grad_out * u * s * (1.0f + g * (1.0f - s)));
  }
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]);
    out[i] = from_float<T>(0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]), grad_out = to_float(dout[i]);
    const float tanh_a = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float sech2 = 1.0f - tanh_a * tanh_a;
    const float local = 0.5f * (1.0f + tanh_a) +
                        0.5f * v * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = from_float<T>(grad_out * local);
  }
}

}  // namespace

void CudaBackend::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  cuda::require_float(gate, op, "gate");
  cuda::require_same_dtype(out, gate, op, "out", "gate");
  cuda::require_same_dtype(up, gate, op, "up", "gate");
  const int64_t n = out.numel();
  cuda::require_numel(gate, n, op, "gate");
  cuda::require_numel(up, n, op, "up");
  if (n == 0) return;
  cuda::dispatch_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
        static_cast<T*>(out.data), static_cast<const T*>(gate.data), static_cast<const T*>(up.data),
        n);
  });
  check_launch(op);
}

void CudaBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                  const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  cuda::require_float(gate, op, "gate");
  cuda::require_same_dtype(dgate, gate, op, "dgate", "gate");
  cuda::require_same_dtype(dup, gate, op, "dup", "gate");
  cuda::require_same_dtype(dout, gate, op, "dout", "gate");
  cuda::require_same_dtype(up, gate, op, "up", "gate");
  const int64_t n = dout.numel();
  cuda::require_numel(dgate, n, op, "dgate");
  cuda::require_numel(dup, n, op, "dup");
  cuda::require_numel(gate, n, op, "gate");
  cuda::require_numel(up, n, op, "up");
  if (n == 0) return;
  cuda::dispatch_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
        static_cast<T*>(dgate.data), static_cast<T*>(dup.data), static_cast<const T*>(dout.data),
        static_cast<const T*>(gate.data), static_cast<const T*>(up.data), n);
  });
  check_launch(op);
}

void CudaBackend::gelu_forward(const Tensor& out, const Tensor& x) {
  const char* op = "gelu_forward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(out, x, op, "out", "x");
  const int64_t n = x.numel();
  cuda::require_numel(out, n, op, "out");
  if (n == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
        static_cast<T*>(out.data), static_cast<const T*>(x.data), n);
  });
  check_launch(op);
}

void CudaBackend::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "gelu_backward";
  cuda::require_float(x, op, "x");
  cuda::require_same_dtype(dx, x, op, "dx", "x");
  cuda::require_same_dtype(dout, x, op, "dout", "x");
  const int64_t n = x.numel();
  cuda::require_numel(dx, n, op, "dx");
  cuda::require_numel(dout, n, op, "dout");
  if (n == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
        static_cast<T*>(dx.data), static_cast<const T*>(dout.data), static_cast<const T*>(x.data),
        n);
  });
  check_launch(op);
}

}  // namespace ulysses
