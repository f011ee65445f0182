// CudaBackend: token/position embedding, rotary position embedding, SwiGLU and GELU.
//
// Embedding backward is deterministic without atomics: the token ids are sorted on the host
// (a stable counting sort; ids are downloaded anyway to be validated), and one block per
// distinct id adds its rows of dout in token order into that id's row of dwte.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_activations_kernels.cuh"
#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/op_contracts.h"

namespace ulysses {

using cuda::check_launch;
using cuda::LaunchShape;

namespace {

// The token ids, downloaded to be checked (kernels/op_contracts.h).
std::vector<int32_t> checked_token_ids(CudaBackend& backend, const Tensor& tokens, int64_t vocab,
                                       const char* op) {
  std::vector<int32_t> ids(size_t(tokens.numel()));
  backend.download(ids.data(), tokens);
  contracts::check_token_ids(ids.data(), int64_t(ids.size()), vocab, op);
  return ids;
}

}  // namespace

void CudaBackend::embedding_forward_impl(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                         const Tensor& wpe, int64_t pos_offset) {
  const char* op = "embedding_forward";
  const int64_t vocab = wte.shape[0], width = wte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = contracts::sequence_length(tokens);
  const bool with_positions = !wpe.empty();
  checked_token_ids(*this, tokens, vocab, op);
  if (n == 0) return;
  cuda::dispatch_float(wte, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n * width);
    cuda::embedding_forward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(out.data), tokens.i32(), static_cast<const T*>(wte.data),
        with_positions ? static_cast<const T*>(wpe.data) : nullptr, n, width, seq_len, pos_offset);
  });
  check_launch(op);
}

void CudaBackend::embedding_backward_impl(const Tensor& dwte, const Tensor& dwpe,
                                          const Tensor& dout, const Tensor& tokens,
                                          int64_t pos_offset) {
  const char* op = "embedding_backward";
  const int64_t vocab = dwte.shape[0], width = dwte.shape[1];
  const int64_t n = tokens.numel();
  const int64_t seq_len = contracts::sequence_length(tokens);
  const bool with_positions = !dwpe.empty();
  if (n > int64_t(0x7fffffff))
    throw std::invalid_argument(std::string(op) + ": more than 2^31 tokens in one call");
  const std::vector<int32_t> ids = checked_token_ids(*this, tokens, vocab, op);
  if (n == 0) return;

  const cuda::EmbeddingBackwardPlan plan = cuda::embedding_backward_plan(ids, vocab);
  const int64_t segments = plan.segments;
  Buffer device_plan = alloc(MemCategory::workspace, DType::i32, {int64_t(plan.data.size())},
                             "embedding_backward token order");
  upload(device_plan, plan.data.data());
  const int32_t* order = device_plan.i32();
  const int32_t* starts = order + n;
  const int32_t* device_segment_ids = starts + segments + 1;

  cuda::dispatch_float(dout, op, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dout.data);
    const LaunchShape segment_shape = cuda::block_per_row_launch(segments);
    cuda::embedding_backward_kernel<<<segment_shape.grid, segment_shape.threads,
                                      segment_shape.shared_bytes, stream_>>>(
        dwte.f32(), g, order, starts, device_segment_ids, width);
    if (with_positions) {
      const LaunchShape shape = cuda::elementwise_launch(seq_len * width);
      cuda::position_backward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
          dwpe.f32(), g, n / seq_len, seq_len, width, pos_offset);
    }
  });
  check_launch(op, with_positions ? 2 : 1);
}

// ---- RoPE --------------------------------------------------------------------------------

void CudaBackend::rope_impl(const Tensor& x, int64_t pos_offset, float theta, bool inverse) {
  const char* op = "rope";
  const int64_t batch = x.shape[0], seq_len = x.shape[1], heads = x.shape[2], dim = x.shape[3];
  const int64_t half = dim / 2;
  if (x.numel() == 0) return;
  Buffer table = rope_table(*this, seq_len, half);
  float* cos_table = table.f32();
  float* sin_table = cos_table + seq_len * half;
  const LaunchShape shape = cuda::elementwise_launch(seq_len * half);
  cuda::rope_table_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
      cos_table, sin_table, seq_len, half, dim, pos_offset, double(theta), inverse ? -1.0 : 1.0);
  check_launch(op);
  const int64_t rows = batch * seq_len * heads;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(rows * half);
    cuda::rope_apply_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(x.data), cos_table, sin_table, rows, seq_len, heads, half);
  });
  check_launch(op);
}

// ---- SwiGLU and GELU ---------------------------------------------------------------------

void CudaBackend::swiglu_forward_impl(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::dispatch_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n);
    cuda::swiglu_forward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(out.data), static_cast<const T*>(gate.data), static_cast<const T*>(up.data),
        n);
  });
  check_launch(op);
}

void CudaBackend::swiglu_backward_impl(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                       const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  const int64_t n = dout.numel();
  if (n == 0) return;
  cuda::dispatch_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n);
    cuda::swiglu_backward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(dgate.data), static_cast<T*>(dup.data), static_cast<const T*>(dout.data),
        static_cast<const T*>(gate.data), static_cast<const T*>(up.data), n);
  });
  check_launch(op);
}

void CudaBackend::gelu_forward_impl(const Tensor& out, const Tensor& x) {
  const char* op = "gelu_forward";
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n);
    cuda::gelu_forward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(out.data), static_cast<const T*>(x.data), n);
  });
  check_launch(op);
}

void CudaBackend::gelu_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "gelu_backward";
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::dispatch_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const LaunchShape shape = cuda::elementwise_launch(n);
    cuda::gelu_backward_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<T*>(dx.data), static_cast<const T*>(dout.data), static_cast<const T*>(x.data),
        n);
  });
  check_launch(op);
}

}  // namespace ulysses
