// The contract of each Backend op (kernels/backend.h): the ranks, element counts, row counts,
// argument ranges and dtypes that every backend requires alike, checked once by the op's
// front before the backend's implementation runs. A violation throws std::invalid_argument
// (or std::out_of_range for positions) with a message that names the op and the tensor.
// The dtype rules (kernels/op_dtypes.h) are the same for every backend except in which float
// dtypes its kernels take, the one table kernel_dtypes; the kind of the calling backend is
// each check's first argument. Only the limits of one backend's kernels (a head dim, a grid
// size) stay with that backend. Contracts read shapes and dtypes only, never tensor data: the
// planner's buffers have none (kernels/planning_backend.h).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/backend.h"
#include "kernels/tensor.h"

namespace ulysses::contracts {

// q[B, T, Hq, d] with k[B, T, Hkv, d], as attention_forward and attention_backward take them.
struct AttentionShape {
  int64_t batch, seq_len, q_heads, kv_heads, dim;
};
// Reads the shape of inputs that passed check_attention_forward or check_attention_backward.
AttentionShape attention_shape(const Tensor& q, const Tensor& k);

// Tokens of one sequence in tokens[B, T] (or [T]): its last dimension, 0 for a 0-D tensor.
int64_t sequence_length(const Tensor& tokens);

void check_copy(const Tensor& dst, const Tensor& src);
void check_cast(const Tensor& dst, const Tensor& src);
void check_copy_2d(int64_t dst_pitch, int64_t src_pitch, int64_t row_bytes, int64_t rows);
void check_axpy(BackendKind kind, const Tensor& y, const Tensor& x);
// scale and sum_squares: any shape of an element tensor x.
void check_elementwise(BackendKind kind, const char* op, const Tensor& x);
void check_gemm(BackendKind kind, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                const Tensor& c);
void check_bias_forward(BackendKind kind, const Tensor& out, const Tensor& bias);
void check_bias_backward(BackendKind kind, const Tensor& dbias, const Tensor& dout);
void check_embedding_forward(BackendKind kind, const Tensor& out, const Tensor& tokens,
                             const Tensor& wte, const Tensor& wpe, int64_t pos_offset);
void check_embedding_backward(BackendKind kind, const Tensor& dwte, const Tensor& dwpe,
                              const Tensor& dout, const Tensor& tokens, int64_t pos_offset);
void check_rmsnorm_forward(BackendKind kind, const Tensor& out, const Tensor& rstd, const Tensor& x,
                           const Tensor& weight);
void check_rmsnorm_backward(BackendKind kind, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd);
void check_layernorm_forward(BackendKind kind, const Tensor& out, const Tensor& mean,
                             const Tensor& rstd, const Tensor& x, const Tensor& weight,
                             const Tensor& bias);
void check_layernorm_backward(BackendKind kind, const Tensor& dx, const Tensor& dweight,
                              const Tensor& dbias, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void check_rope(BackendKind kind, const Tensor& x, int64_t pos_offset);
void check_swiglu_forward(BackendKind kind, const Tensor& out, const Tensor& gate,
                          const Tensor& up);
void check_swiglu_backward(BackendKind kind, const Tensor& dgate, const Tensor& dup,
                           const Tensor& dout, const Tensor& gate, const Tensor& up);
void check_gelu_forward(BackendKind kind, const Tensor& out, const Tensor& x);
void check_gelu_backward(BackendKind kind, const Tensor& dx, const Tensor& dout, const Tensor& x);
// Document starts (if any) must fit the batch and sequence length (documents_problem).
void check_attention_forward(BackendKind kind, const Tensor& out, const Tensor& lse,
                             const Tensor& q, const Tensor& k, const Tensor& v,
                             const Documents& documents);
// The positions of a block's first query and first key: both >= 0; its documents (the starts
// of the whole sequences, which reach past the block) fit the batch of q.
void check_block(int64_t q_first, int64_t k_first, const Documents& documents, const Tensor& q,
                 const char* op);
void check_attention_backward(BackendKind kind, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Documents& documents);
void check_lm_head_loss(BackendKind kind, const Tensor& hidden, const Tensor& weight,
                        const Tensor& targets, int64_t tile_rows, const Tensor& dhidden,
                        const Tensor& dweight);
void check_adamw(BackendKind kind, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const AdamWStep& step);

// Aliasing: each output must share no byte with the other outputs or with any input listed
// (empty tensors are skipped). Where an op allows an output to be an input's memory (dx and
// dout of the norm backward, say: kernels/backend.h), that input is not listed. Throws
// std::invalid_argument naming both tensors. Planned buffers share one stand-in address, so
// the fronts check only a backend whose buffers are real.
struct NamedTensor {
  const Tensor& tensor;
  const char* name;
};
void require_apart(const char* op, std::initializer_list<NamedTensor> outputs,
                   std::initializer_list<NamedTensor> inputs);

// The checks on tensor data, which each backend makes where it has the values on the host.
// Token ids come from data files (untrusted): every id must index a row of wte.
void check_token_ids(const int32_t* ids, int64_t count, int64_t vocab, const char* op);
// A loss target below the vocabulary (negative ones are not counted).
void check_target(int32_t target, int64_t row, int64_t vocab);

}  // namespace ulysses::contracts
