// The one attention schedule of a block (docs/design.md, "One attention schedule"), forward
// and backward. The heads each rank attends to go through projection, all-to-all, attention
// and all-to-all back in U stages (parallel.head_chunks; U = 1 is one stage of all of them).
// Stage s covers, for every rank p, the q heads [stage_q_first(p, s), + stage_q_heads()) and
// the kv heads they read (parallel/ulysses_attention.h). Each stage projects q, k and v of
// those heads straight into the all-to-all's send buffer, one block per destination rank, so
// no copy of q/k/v in this rank's token layout is ever made.
//
// With one stage the forward keeps the stage's q, k, v and out in the head layout for the
// backward; with more it keeps only each stage's lse, and the backward recomputes a stage's
// projections and exchanges (UPipe; docs/memory.md). With one rank a projection's one block
// is the head layout already and nothing is exchanged; with one rank and one stage the
// attention also writes the block's output in place.
//
// parallel.overlap: every all-to-all is waited for where its output is first needed: stage
// s+1's projections travel during stage s's attention, stage s's output during stage s+1's,
// the first stage's d(out) during the output projection's weight gradient, and dq, dk, dv
// each until its projection's backward. Without it each is waited for as soon as it is
// issued: the same ops on the same data, so the same bits.
#pragma once

#include "core/model/layer_parts.h"
#include "kernels/backend.h"
#include "parallel/ulysses_attention.h"

namespace ulysses {

struct AttentionInputs {
  const QkvTensors& weights;
  const BlockShape& shape;
  const Tensor& norm1;  // [R, C]: the block's normalised input, which the projections read
  float rope_theta;     // 0: no RoPE (gpt2)
  bool overlap;         // parallel.overlap
};

// A stage's tensors in the head layout [B, N, n, d] (n: the stage's q or kv heads).
struct StageHeads {
  Buffer q, k, v, out;
};

// What the forward keeps for the backward.
struct KeptAttention {
  Buffer lse;        // [U, B, h/U, N] f32: every stage's log-sum-exp
  StageHeads heads;  // one stage only: its q, k, v and out (out empty where written in place)
};

// The output projection, whose weight the backward reads per stage and whose gradients it
// accumulates: weight [C, H·d], weight_grad like it, bias_grad [C] or empty.
struct OutputProjection {
  const Tensor& weight;
  const Tensor& weight_grad;
  const Tensor& bias_grad;
};

// out[B, Tl, H, d] = attention of this rank's tokens (written stage by stage); fills kept.
void attention_forward(Backend& backend, UlyssesAttention& attention, const AttentionInputs& in,
                       const Tensor& out, KeptAttention& kept);

// dresidual[R, C] = d(mid), the gradient of the attention's projected output, into dnorm
// (d norm1, overwritten) and the q/k/v and output projections' weight and bias gradients
// (accumulated). out is what the forward wrote; kept is spent. Each stage makes the gradient
// of its heads' attention output, dresidual · o_weight[:, their columns], straight into the
// all-to-all's send buffer.
void attention_backward(Backend& backend, UlyssesAttention& attention, const AttentionInputs& in,
                        const QkvTensors& grads, const OutputProjection& output, const Tensor& out,
                        KeptAttention& kept, const Tensor& dresidual, const Tensor& dnorm);

}  // namespace ulysses
