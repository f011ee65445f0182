#include "kernels/backend.h"

#include <stdexcept>
#include <type_traits>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/op_contracts.h"
#include "kernels/op_scratch.h"

#ifdef ULYSSES_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace ulysses {

namespace {

// The very same elements: an elementwise op may write an output over its own input.
bool same_memory(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.numel() == b.numel();
}

}  // namespace

// Each front has the signature of its row in kernels/op_table.h, as its implementation has.
#define ULYSSES_CHECK_FRONT(result, name, parameters)                                    \
  static_assert(std::is_same_v<decltype(&Backend::name), result(Backend::*) parameters>, \
                "Backend::" #name " differs from its row in kernels/op_table.h");
ULYSSES_BACKEND_OPS(ULYSSES_CHECK_FRONT)
#undef ULYSSES_CHECK_FRONT

// ---- the op fronts: contract, then implementation -----------------------------------------

void Backend::require_apart(const char* op, std::initializer_list<contracts::NamedTensor> outputs,
                            std::initializer_list<contracts::NamedTensor> inputs) const {
  // Planned buffers all stand at one address: only real ones can be told apart.
  if (!memory_.planning()) contracts::require_apart(op, outputs, inputs);
}

void Backend::upload(const Tensor& dst, const void* host_src) {
  upload_impl(dst, host_src);
}

void Backend::download(void* host_dst, const Tensor& src) {
  download_impl(host_dst, src);
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  contracts::check_copy(dst, src);
  require_apart("copy", {{dst, "dst"}}, {{src, "src"}});
  copy_impl(dst, src);
}

void Backend::cast(const Tensor& dst, const Tensor& src) {
  contracts::check_cast(dst, src);
  require_apart("cast", {{dst, "dst"}}, {{src, "src"}});
  cast_impl(dst, src);
}

void Backend::fill_zero(const Tensor& dst) {
  fill_zero_impl(dst);
}

void Backend::copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                      int64_t row_bytes, int64_t rows) {
  contracts::check_copy_2d(dst_pitch, src_pitch, row_bytes, rows);
  copy_2d_impl(dst, dst_pitch, src, src_pitch, row_bytes, rows);
}

void Backend::axpy(const Tensor& y, const Tensor& x, float alpha) {
  contracts::check_axpy(kind(), y, x);
  axpy_impl(y, x, alpha);
}

void Backend::scale(const Tensor& x, float alpha) {
  contracts::check_elementwise(kind(), "scale", x);
  scale_impl(x, alpha);
}

double Backend::sum_squares(const Tensor& x) {
  contracts::check_elementwise(kind(), "sum_squares", x);
  return sum_squares_impl(x);
}

void Backend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                   float alpha, float beta) {
  contracts::check_gemm(kind(), a, trans_a, b, trans_b, c);
  require_apart("gemm", {{c, "c"}}, {{a, "a"}, {b, "b"}});
  gemm_impl(a, trans_a, b, trans_b, c, alpha, beta);
}

void Backend::bias_forward(const Tensor& out, const Tensor& bias) {
  contracts::check_bias_forward(kind(), out, bias);
  bias_forward_impl(out, bias);
}

void Backend::bias_backward(const Tensor& dbias, const Tensor& dout) {
  contracts::check_bias_backward(kind(), dbias, dout);
  require_apart("bias_backward", {{dbias, "dbias"}}, {{dout, "dout"}});
  bias_backward_impl(dbias, dout);
}

void Backend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                const Tensor& wpe, int64_t pos_offset) {
  contracts::check_embedding_forward(kind(), out, tokens, wte, wpe, pos_offset);
  require_apart("embedding_forward", {{out, "out"}},
                {{tokens, "tokens"}, {wte, "wte"}, {wpe, "wpe"}});
  embedding_forward_impl(out, tokens, wte, wpe, pos_offset);
}

void Backend::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                 const Tensor& tokens, int64_t pos_offset) {
  contracts::check_embedding_backward(kind(), dwte, dwpe, dout, tokens, pos_offset);
  require_apart("embedding_backward", {{dwte, "dwte"}, {dwpe, "dwpe"}},
                {{dout, "dout"}, {tokens, "tokens"}});
  embedding_backward_impl(dwte, dwpe, dout, tokens, pos_offset);
}

void Backend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& weight, float eps) {
  contracts::check_rmsnorm_forward(kind(), out, rstd, x, weight);
  require_apart("rmsnorm_forward", {{out, "out"}, {rstd, "rstd"}}, {{x, "x"}, {weight, "weight"}});
  rmsnorm_forward_impl(out, rstd, x, weight, eps);
}

void Backend::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                               const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  contracts::check_rmsnorm_backward(kind(), dx, dweight, dout, x, weight, rstd);
  require_apart("rmsnorm_backward", {{dx, "dx"}, {dweight, "dweight"}},
                {{x, "x"}, {weight, "weight"}, {rstd, "rstd"}});
  require_apart("rmsnorm_backward", {{dweight, "dweight"}}, {{dout, "dout"}});
  rmsnorm_backward_impl(dx, dweight, dout, x, weight, rstd);
}

void Backend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& weight, const Tensor& bias,
                                float eps) {
  contracts::check_layernorm_forward(kind(), out, mean, rstd, x, weight, bias);
  require_apart("layernorm_forward", {{out, "out"}, {mean, "mean"}, {rstd, "rstd"}},
                {{x, "x"}, {weight, "weight"}, {bias, "bias"}});
  layernorm_forward_impl(out, mean, rstd, x, weight, bias, eps);
}

void Backend::layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dout, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd) {
  contracts::check_layernorm_backward(kind(), dx, dweight, dbias, dout, x, weight, mean, rstd);
  require_apart("layernorm_backward", {{dx, "dx"}, {dweight, "dweight"}, {dbias, "dbias"}},
                {{x, "x"}, {weight, "weight"}, {mean, "mean"}, {rstd, "rstd"}});
  require_apart("layernorm_backward", {{dweight, "dweight"}, {dbias, "dbias"}}, {{dout, "dout"}});
  layernorm_backward_impl(dx, dweight, dbias, dout, x, weight, mean, rstd);
}

void Backend::rope(const Tensor& x, int64_t pos_offset, float theta, bool inverse) {
  contracts::check_rope(kind(), x, pos_offset);
  rope_impl(x, pos_offset, theta, inverse);
}

void Backend::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  contracts::check_swiglu_forward(kind(), out, gate, up);
  require_apart("swiglu_forward", {{out, "out"}}, {{gate, "gate"}, {up, "up"}});
  swiglu_forward_impl(out, gate, up);
}

void Backend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                              const Tensor& gate, const Tensor& up) {
  contracts::check_swiglu_backward(kind(), dgate, dup, dout, gate, up);
  // dgate may be gate itself and dup up itself (each element is read before it is written),
  // which lets an MLP's backward overwrite its intermediates with their gradients.
  const char* op = "swiglu_backward";
  require_apart(op, {{dgate, "dgate"}, {dup, "dup"}}, {});
  if (!same_memory(dgate, gate)) require_apart(op, {{dgate, "dgate"}}, {{gate, "gate"}});
  if (!same_memory(dup, up)) require_apart(op, {{dup, "dup"}}, {{up, "up"}});
  require_apart(op, {{dgate, "dgate"}}, {{up, "up"}});
  require_apart(op, {{dup, "dup"}}, {{gate, "gate"}});
  swiglu_backward_impl(dgate, dup, dout, gate, up);
}

void Backend::gelu_forward(const Tensor& out, const Tensor& x) {
  contracts::check_gelu_forward(kind(), out, x);
  require_apart("gelu_forward", {{out, "out"}}, {{x, "x"}});
  gelu_forward_impl(out, x);
}

void Backend::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  contracts::check_gelu_backward(kind(), dx, dout, x);
  require_apart("gelu_backward", {{dx, "dx"}}, {{x, "x"}});
  gelu_backward_impl(dx, dout, x);
}

void Backend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Documents& documents) {
  contracts::check_attention_forward(kind(), out, lse, q, k, v, documents);
  require_apart("attention_forward", {{out, "out"}, {lse, "lse"}}, {{q, "q"}, {k, "k"}, {v, "v"}});
  attention_forward_impl(out, lse, q, k, v, documents);
}

void Backend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const Tensor& dout, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse,
                                 const Documents& documents) {
  contracts::check_attention_backward(kind(), dq, dk, dv, dout, q, k, v, out, lse, documents);
  require_apart("attention_backward", {{dq, "dq"}, {dk, "dk"}, {dv, "dv"}},
                {{dout, "dout"}, {q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {lse, "lse"}});
  attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, documents);
}

void Backend::attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                      const Tensor& k, const Tensor& v, int64_t q_first,
                                      int64_t k_first, bool merge, const Documents& documents) {
  contracts::check_attention_forward(kind(), out, lse, q, k, v, {});
  contracts::check_block(q_first, k_first, documents, q, "attention_block_forward");
  require_apart("attention_block_forward", {{out, "out"}, {lse, "lse"}},
                {{q, "q"}, {k, "k"}, {v, "v"}});
  attention_block_forward_impl(out, lse, q, k, v, q_first, k_first, merge, documents);
}

void Backend::attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       int64_t q_first, int64_t k_first,
                                       const Documents& documents) {
  contracts::check_attention_backward(kind(), dq, dk, dv, dout, q, k, v, out, lse, {});
  contracts::check_block(q_first, k_first, documents, q, "attention_block_backward");
  require_apart("attention_block_backward", {{dq, "dq"}, {dk, "dk"}, {dv, "dv"}},
                {{dout, "dout"}, {q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {lse, "lse"}});
  attention_block_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, q_first, k_first, documents);
}

LossResult Backend::lm_head_loss(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                 int64_t tile_rows, float grad_scale, const Tensor& dhidden,
                                 const Tensor& dweight) {
  contracts::check_lm_head_loss(kind(), hidden, weight, targets, tile_rows, dhidden, dweight);
  require_apart("lm_head_loss", {{dhidden, "dhidden"}, {dweight, "dweight"}},
                {{hidden, "hidden"}, {weight, "weight"}, {targets, "targets"}});
  return lm_head_loss_impl(hidden, weight, targets, tile_rows, grad_scale, dhidden, dweight);
}

void Backend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const AdamWStep& step) {
  contracts::check_adamw(kind(), param, grad, m, v, step);
  require_apart("adamw", {{param, "param"}, {m, "m"}, {v, "v"}}, {{grad, "grad"}});
  adamw_impl(param, grad, m, v, step);
}

int64_t Backend::auto_loss_tile_tokens(int64_t, int64_t) const {
  return kHostLossTileTokens;
}

bool cuda_backend_compiled() {
#ifdef ULYSSES_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int64_t cudnn_loaded_version() {
#ifdef ULYSSES_WITH_CUDA
  return cuda_cudnn_version();
#else
  return 0;
#endif
}

AttentionChoice choose_attention(AttentionKernel setting, BackendKind device, int head_dim,
                                 int64_t cudnn_version, bool documents) {
  if (setting != AttentionKernel::automatic)
    return {setting, "kernels.attention: " +
                         std::string(setting == AttentionKernel::cudnn ? "cudnn" : "native") +
                         " as set"};
  const std::string prefix = "kernels.attention: auto: ";
  if (device != BackendKind::cuda)
    return {AttentionKernel::native, prefix + "the cpu backend has one attention"};
  if (cudnn_version == 0) return {AttentionKernel::native, prefix + "this build has no cuDNN"};
  if (documents)
    return {AttentionKernel::native,
            prefix + "packed documents or padding need the native kernels' document mask"};
  const std::string version = std::to_string(cudnn_version / 10000) + "." +
                              std::to_string(cudnn_version / 100 % 100) + "." +
                              std::to_string(cudnn_version % 100);
  if (cudnn_version < kCudnnAttentionMinimumVersion)
    return {AttentionKernel::native,
            prefix + "the loaded cuDNN is " + version + ", older than the 9.16 its graphs need"};
  if (head_dim % 8 != 0 || head_dim > 128)
    return {AttentionKernel::native, prefix +
                                         "cuDNN needs a head dim that is a multiple of 8 "
                                         "and at most 128, this model's is " +
                                         std::to_string(head_dim)};
  return {AttentionKernel::cudnn,
          prefix + "cuDNN " + version + " fits head dim " + std::to_string(head_dim)};
}

std::string native_attention_kernels(int head_dim) {
  if (head_dim % 8 == 0 && head_dim >= 8 && head_dim <= 128)
    return "tensor cores (mma.sync m16n8k16, FlashAttention-2 tiling) for head dim " +
           std::to_string(head_dim);
  return "FMA units for head dim " + std::to_string(head_dim) +
         " (the tensor-core kernels need a multiple of 8, at most 128)";
}

int cuda_devices_visible() {
#ifdef ULYSSES_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(BackendKind device, int64_t memory_limit_bytes,
                                      AttentionKernel attention) {
  if (attention == AttentionKernel::automatic)
    throw std::invalid_argument(
        "make_backend: kernels.attention: auto must be resolved first (choose_attention)");
  if (device == BackendKind::cpu) {
    if (attention != AttentionKernel::native)
      throw std::invalid_argument("kernels.attention: cudnn needs device: cuda");
    return std::make_unique<CpuBackend>(memory_limit_bytes);
  }
#ifdef ULYSSES_WITH_CUDA
  return make_cuda_backend(memory_limit_bytes, attention);
#else
  throw DeviceUnavailableError(
      "device: cuda was asked for, but this build has no CUDA backend (nvcc was not found "
      "when it was configured); use device: cpu or rebuild on a machine with the CUDA "
      "toolkit");
#endif
}

}  // namespace ulysses
