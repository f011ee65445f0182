#include "kernels/op_scratch.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/backend.h"

namespace ulysses {

DType compute_dtype_of(BackendKind kind) {
  return kind == BackendKind::cuda ? DType::bf16 : DType::f32;
}

Buffer cublaslt_workspace(Backend& backend) {
  return backend.alloc(MemCategory::workspace, DType::i32, {kCublasLtWorkspaceBytes / 4},
                       "cuBLASLt workspace");
}

Buffer rope_table(Backend& backend, int64_t seq_len, int64_t half_dim) {
  return backend.alloc(MemCategory::workspace, DType::f32, {2, seq_len, half_dim},
                       "rope cos/sin table");
}

int64_t cpu_attention_padded_dim(int64_t head_dim) {
  constexpr int64_t kDimPad = 16;
  return (head_dim + kDimPad - 1) / kDimPad * kDimPad;
}

AttentionBlockOutputs attention_block_outputs(Backend& backend, const Tensor& out,
                                              const Tensor& lse) {
  return {backend.alloc(MemCategory::attention, out.dtype, {out.numel()}, "attention block out"),
          backend.alloc(MemCategory::attention, lse.dtype, {lse.numel()}, "attention block lse")};
}

AttentionBlockGradients attention_block_gradients(Backend& backend, const Tensor& dq,
                                                  const Tensor& dk, const Tensor& dv) {
  return {backend.alloc(MemCategory::attention, dq.dtype, {dq.numel()}, "attention block dq"),
          backend.alloc(MemCategory::attention, dk.dtype, {dk.numel()}, "attention block dk"),
          backend.alloc(MemCategory::attention, dv.dtype, {dv.numel()}, "attention block dv")};
}

Buffer cpu_attention_forward_scratch(Backend& backend, int threads, int64_t head_dim) {
  const int64_t tile = kCpuAttentionTile, pdim = cpu_attention_padded_dim(head_dim);
  const int64_t per_thread = 4 * tile * pdim + tile * tile + 2 * tile;
  return backend.alloc(MemCategory::attention, DType::f32, {threads, per_thread},
                       "attention_forward scratch");
}

Buffer cpu_attention_backward_scratch(Backend& backend, int threads, int64_t head_dim) {
  const int64_t tile = kCpuAttentionTile, pdim = cpu_attention_padded_dim(head_dim);
  const int64_t per_thread = 8 * tile * pdim + 2 * tile * tile + 2 * tile;
  return backend.alloc(MemCategory::attention, DType::f32, {threads, per_thread},
                       "attention_backward scratch");
}

Buffer attention_row_dot(Backend& backend, int64_t batch, int64_t q_heads, int64_t seq_len) {
  return backend.alloc(MemCategory::attention, DType::f32, {batch, q_heads, seq_len},
                       "attention_backward dO·O");
}

int64_t cudnn_attention_workspace_bound(int64_t batch, int64_t q_heads, int64_t seq_len,
                                        int64_t head_dim) {
  return std::max<int64_t>(int64_t(256) << 20, 4 * batch * q_heads * seq_len * head_dim * 4);
}

Buffer cudnn_dq_accumulator(Backend& backend, int64_t q_numel) {
  return backend.alloc(MemCategory::attention, DType::f32, {q_numel},
                       "cuDNN attention dQ accumulator");
}

Buffer cudnn_workspace(Backend& backend, int64_t bytes, const char* what) {
  return backend.alloc(MemCategory::workspace, DType::i32, {(bytes + 3) / 4}, what);
}

int64_t device_loss_tile_tokens(int64_t vocab, int64_t width, int64_t memory_limit_bytes) {
  const int64_t bf16_bytes = 2;
  const int64_t bytes_per_row = vocab * (4 + bf16_bytes) + 2 * width * bf16_bytes;
  int64_t tile = kHostLossTileTokens;
  while (tile < kDeviceLossTileTokensMax &&
         (memory_limit_bytes == 0 || 2 * tile * bytes_per_row <= memory_limit_bytes / 128))
    tile *= 2;
  return tile;
}

LossScratch lm_head_loss_scratch(Backend& backend, BackendKind kind, int64_t counted, int64_t tile,
                                 int64_t vocab, int64_t width, DType dtype, bool with_grad) {
  LossScratch s;
  const bool cuda = kind == BackendKind::cuda;
  if (cuda) {
    s.rows_and_targets =
        backend.alloc(MemCategory::workspace, DType::i32, {2 * counted}, "lm_head_loss rows");
    s.row_loss =
        backend.alloc(MemCategory::workspace, DType::f32, {counted}, "lm_head_loss row losses");
    s.row_correct = backend.alloc(MemCategory::workspace, DType::i32, {counted},
                                  "lm_head_loss row argmax hits");
  }
  s.logits =
      backend.alloc(MemCategory::workspace, DType::f32, {tile, vocab}, "lm_head_loss logits");
  s.hidden_tile =
      backend.alloc(MemCategory::workspace, dtype, {tile, width}, "lm_head_loss hidden");
  if (with_grad) {
    if (cuda)
      s.dlogits =
          backend.alloc(MemCategory::workspace, dtype, {tile, vocab}, "lm_head_loss dlogits");
    s.dhidden_tile =
        backend.alloc(MemCategory::workspace, dtype, {tile, width}, "lm_head_loss dhidden");
  }
  return s;
}

}  // namespace ulysses
