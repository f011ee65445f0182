// The cuDNN operation graphs behind kernels.attention: cudnn (causal, bf16 in and out, f32
// softmax statistics), apart from their execution (cudnn_attention.h). Adding a graph creates
// and finalizes every tensor and operation descriptor, which checks shapes and types; that
// needs cuDNN but no GPU. The graph itself and its engine come with GraphBuilder::build.
#pragma once

#include <cstdint>

#include "kernels/cuda/cudnn_graph.h"

namespace ulysses::cudnn {

// q, k, v, o and their gradients are [batch, seq, heads, dim] in memory. causal = false: every
// query sees every key (a block of ring attention whose keys all precede its queries,
// docs/parallelism.md "Ulysses × ring"); the graphs then have no mask and no −∞ scalar.
struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, dim;
  bool causal = true;
};

// Unique ids of the tensors the caller binds when it executes a plan.
namespace attention_uid {
enum : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,             // lse [B, Hq, T] f32
  kScale,             // host float: 1/sqrt(d)
  kNegativeInfinity,  // host float: what masked scores become
  kOne,               // host float 1 (backward)
  kDO,
  kDQ,
  kDK,
  kDV,
  kRowDot,   // backward: rowsum(dO ∘ O), [B, Hq, T] f32 memory the caller provides
  kDQAccum,  // backward, accumulating variant: dQ in f32 before the cast, zeroed by the caller
};
}  // namespace attention_uid

// O = softmax(scale · Q·Kᵀ, causal unless shape.causal is false) · V, and Stats = each row's
// log-sum-exp.
void add_attention_forward(GraphBuilder& builder, const AttentionShape& shape);

// dQ, dK, dV from dO, recomputing P = exp(scale · Q·Kᵀ − Stats) under the mask. With
// deterministic, dQ comes straight from its matmul (cuDNN then takes its deterministic
// algorithm); otherwise through the f32 accumulator and a cast, cuDNN's default.
void add_attention_backward(GraphBuilder& builder, const AttentionShape& shape, bool deterministic);

}  // namespace ulysses::cudnn
