// Attention in head stages (UPipe; parallel.head_chunks = U > 1; docs/memory.md): the heads
// of each rank go through projection, all-to-all, attention and all-to-all back in U stages,
// so the full-sequence q/k/v/out of only one stage exist at a time, and nothing of them is
// kept for the backward, which recomputes each stage's projections and head-split tensors.
// Each stage projects q for its heads only (and k/v for the kv heads they read) straight into
// the all-to-all's send buffer, one block per destination rank.
#pragma once

#include "core/model/layer_parts.h"
#include "kernels/backend.h"
#include "parallel/ulysses_attention.h"

namespace ulysses {

struct StagedAttentionInputs {
  const QkvTensors& weights;
  const BlockShape& shape;
  const Tensor& norm1;  // [R, C]: the block's normalised input, which the projections read
  float rope_theta;     // 0: no RoPE (gpt2)
  // parallel.overlap: stage s+1's projections and all-to-alls are issued before stage s's
  // attention runs, and stage s's output travels back during stage s+1's attention (two
  // stages' buffers live at once).
  bool overlap = false;
};

// out[B, Tl, H, d] (overwritten stage by stage); lse[U, B, h/U, N] kept for the backward.
void staged_attention_forward(Backend& backend, UlyssesAttention& attention,
                              const StagedAttentionInputs& in, const Tensor& out,
                              const Tensor& lse);

// d(mid)[R, C] → dnorm[R, C] (overwritten) and the q/k/v weight and bias gradients
// (accumulated into grads); out and lse as the forward left them. Each stage makes the
// gradient of its heads' attention output, dresidual · o_weight[:, its columns], straight
// into the all-to-all's send buffer: the whole [R, H·d] d(out) never exists. The output
// projection's own weight gradient is the caller's.
void staged_attention_backward(Backend& backend, UlyssesAttention& attention,
                               const StagedAttentionInputs& in, const QkvTensors& grads,
                               const Tensor& out, const Tensor& lse, const Tensor& dresidual,
                               const Tensor& o_weight, const Tensor& dnorm);

}  // namespace ulysses
