// The scratch that ops allocate for themselves, beyond the tensors handed to them, written
// once for each backend: the cpu and cuda ops allocate their scratch through these
// functions, and the planning backend (kernels/planning_backend.h) calls the same functions
// without running the op, so a plan and a run charge the same bytes (docs/memory.md, "The
// planner"). Nothing here needs a device.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/tensor.h"

namespace ulysses {

class Backend;
enum class BackendKind;
// Element type of weights and activations in the forward pass: f32 on cpu, bf16 on cuda
// (fp32 master weights and optimizer state on both; docs/cuda.md).
DType compute_dtype_of(BackendKind kind);

// cuBLASLt's workspace, held by the cuda backend for its lifetime.
constexpr int64_t kCublasLtWorkspaceBytes = int64_t(32) << 20;
Buffer cublaslt_workspace(Backend& backend);

// rope: the cos/sin table of one call's positions, [2, seq_len, head_dim / 2] (both backends).
Buffer rope_table(Backend& backend, int64_t seq_len, int64_t half_dim);

// cpu attention: tiles of 64 queries and keys, head dim padded to a multiple of 16.
constexpr int64_t kCpuAttentionTile = 64;
int64_t cpu_attention_padded_dim(int64_t head_dim);
// Per thread: q, kᵀ, v and output tiles, the score tile, running max and sum.
Buffer cpu_attention_forward_scratch(Backend& backend, int threads, int64_t head_dim);
// Per thread, the larger of the two passes: eight [tile][padded dim] tiles, two score tiles
// and the lse and D values of one query tile.
Buffer cpu_attention_backward_scratch(Backend& backend, int threads, int64_t head_dim);
// attention backward, both backends (and cuDNN's): D[b, h, t] = Σ dO·O.
Buffer attention_row_dot(Backend& backend, int64_t batch, int64_t q_heads, int64_t seq_len);

// Block attention on cuda (ring attention's blocks, kernels/backend.h): a merged block's own
// out and lse before the merge, and a block's dq, dk, dv before they are added; each shaped
// (flat) as the tensors they join.
struct AttentionBlockOutputs {
  Buffer out, lse;
};
AttentionBlockOutputs attention_block_outputs(Backend& backend, const Tensor& out,
                                              const Tensor& lse);
struct AttentionBlockGradients {
  Buffer dq, dk, dv;
};
AttentionBlockGradients attention_block_gradients(Backend& backend, const Tensor& dq,
                                                  const Tensor& dk, const Tensor& dv);

// cuDNN attention: a graph's workspace is known only once cuDNN has built the plan on a
// device. The planner charges this bound instead: above it the backend gives up the
// deterministic backward for cuDNN's default (kernels/cuda/cudnn_attention.cpp).
int64_t cudnn_attention_workspace_bound(int64_t batch, int64_t q_heads, int64_t seq_len,
                                        int64_t head_dim);
// The non-deterministic cuDNN backward accumulates dQ in f32.
Buffer cudnn_dq_accumulator(Backend& backend, int64_t q_numel);
Buffer cudnn_workspace(Backend& backend, int64_t bytes, const char* what);

// The fused LM head + loss over tiles of `tile` counted rows (tile = min(loss_tile_tokens,
// counted rows)). dtype is the hidden state's; the cuda backend also uploads the counted
// rows and their targets and keeps a loss and a hit per counted row.
struct LossScratch {
  Buffer rows_and_targets, row_loss, row_correct;  // cuda only
  Buffer logits, hidden_tile, dlogits, dhidden_tile;
};
LossScratch lm_head_loss_scratch(Backend& backend, BackendKind kind, int64_t counted, int64_t tile,
                                 int64_t vocab, int64_t width, DType dtype, bool with_grad);

// memory.loss_tile_tokens: auto (docs/memory.md, "The loss tile"). On the host a tile's
// logits stay in cache at 256 rows. On the device a tile's GEMMs run faster the taller they
// are, up to about 4096 rows (measured on an H200 at 8K and 32K rows: 256-row tiles take 2.3x
// as long as 4096-row ones, 8192 rows gain 1-3% more): the tile doubles from 256 rows to 4096
// while its buffers (fp32 logits, bf16 d logits, hidden rows and their gradient) take at most
// 1/128 of the memory limit (0: no limit).
inline constexpr int64_t kHostLossTileTokens = 256;
inline constexpr int64_t kDeviceLossTileTokensMax = 4096;
int64_t device_loss_tile_tokens(int64_t vocab, int64_t width, int64_t memory_limit_bytes);

}  // namespace ulysses
