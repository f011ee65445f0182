// Every backend op, declared once (after ggml's op list): its result, its name and its
// parameters. From this one table come the `<op>_impl` declarations of Backend and of every
// backend (ULYSSES_DECLARE_OP_IMPL), the planning backend's ops that compute nothing, the
// compile-time check that each front in kernels/backend.h has its row's signature
// (kernels/backend.cpp), and the op test's check that each op has its test rows
// (tests/test_backend_ops.cpp). The fronts themselves stay written out in kernels/backend.h,
// where each op's meaning is documented.
//
// Adding an op (docs/design.md, "Adding a backend op"): its row here; its front in
// kernels/backend.h/.cpp; its contract in kernels/op_contracts.h (the shapes and dtypes every
// backend requires, kernels/op_dtypes.h); its kernels in each backend (the compiler refuses a
// backend without them); its scratch in kernels/op_scratch.h and the planning backend if it
// allocates any; its rows in tests/test_backend_ops.cpp.
//
// Each row is OP(result, name, (parameters)).
#pragma once

#include <cstdint>

#define ULYSSES_BACKEND_OPS(OP)                                                                   \
  OP(void, upload, (const Tensor& dst, const void* host_src))                                     \
  OP(void, download, (void* host_dst, const Tensor& src))                                         \
  OP(void, copy, (const Tensor& dst, const Tensor& src))                                          \
  OP(void, cast, (const Tensor& dst, const Tensor& src))                                          \
  OP(void, fill_zero, (const Tensor& dst))                                                        \
  OP(void, copy_2d,                                                                               \
     (void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,        \
      int64_t rows))                                                                              \
  OP(void, axpy, (const Tensor& y, const Tensor& x, float alpha))                                 \
  OP(void, scale, (const Tensor& x, float alpha))                                                 \
  OP(double, sum_squares, (const Tensor& x))                                                      \
  OP(void, gemm,                                                                                  \
     (const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha, \
      float beta))                                                                                \
  OP(void, bias_forward, (const Tensor& out, const Tensor& bias))                                 \
  OP(void, bias_backward, (const Tensor& dbias, const Tensor& dout))                              \
  OP(void, embedding_forward,                                                                     \
     (const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,              \
      int64_t pos_offset))                                                                        \
  OP(void, embedding_backward,                                                                    \
     (const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,           \
      int64_t pos_offset))                                                                        \
  OP(void, rmsnorm_forward,                                                                       \
     (const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, float eps))   \
  OP(void, rmsnorm_backward,                                                                      \
     (const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,               \
      const Tensor& weight, const Tensor& rstd))                                                  \
  OP(void, layernorm_forward,                                                                     \
     (const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,                 \
      const Tensor& weight, const Tensor& bias, float eps))                                       \
  OP(void, layernorm_backward,                                                                    \
     (const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,           \
      const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd))             \
  OP(void, rope, (const Tensor& x, int64_t pos_offset, float theta, bool inverse))                \
  OP(void, swiglu_forward, (const Tensor& out, const Tensor& gate, const Tensor& up))             \
  OP(void, swiglu_backward,                                                                       \
     (const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,             \
      const Tensor& up))                                                                          \
  OP(void, gelu_forward, (const Tensor& out, const Tensor& x))                                    \
  OP(void, gelu_backward, (const Tensor& dx, const Tensor& dout, const Tensor& x))                \
  OP(void, attention_forward,                                                                     \
     (const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,    \
      const Documents& documents))                                                                \
  OP(void, attention_backward,                                                                    \
     (const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,  \
      const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,                     \
      const Documents& documents))                                                                \
  OP(void, attention_block_forward,                                                               \
     (const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,    \
      int64_t q_first, int64_t k_first, bool merge, const Documents& documents))                  \
  OP(void, attention_block_backward,                                                              \
     (const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,  \
      const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int64_t q_first,    \
      int64_t k_first, const Documents& documents))                                               \
  OP(LossResult, lm_head_loss,                                                                    \
     (const Tensor& hidden, const Tensor& weight, const Tensor& targets, int64_t tile_rows,       \
      float grad_scale, const Tensor& dhidden, const Tensor& dweight))                            \
  OP(void, adamw,                                                                                 \
     (const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,                  \
      const AdamWStep& step))

// A backend's implementation of every op, inside its class: `ULYSSES_BACKEND_OPS(
// ULYSSES_DECLARE_OP_IMPL)`. Backend declares them pure; a backend that leaves one out
// cannot be made.
#define ULYSSES_DECLARE_OP_IMPL(result, name, parameters) result name##_impl parameters override;

// The op's name as a string, for lists of the ops.
#define ULYSSES_OP_NAME(result, name, parameters) #name,
