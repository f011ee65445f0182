// The graphs are the composite ones cudnn-frontend lowers causal bf16 SDPA to on cuDNN 9.x
// below 9.21 (its CompositeSDPANode / CompositeSDPABackwardNode): matmul, pointwise and
// reduction operations that cuDNN's fused flash-attention engines recognise as one kernel.
// Only the ops, tensor types and layouts that pattern needs appear here; the rest (bias,
// dropout, padding, paging) is left out.
#include "kernels/cuda/cudnn_attention_graphs.h"

#include <string>
#include <utility>
#include <vector>

namespace ulysses::cudnn {

using namespace attention_uid;

namespace {

// Virtual tensors are numbered from here.
constexpr int64_t kFirstVirtual = 100;

// The tensors of one graph. q, k, v, o and their gradients are [B, T, H, d] in memory,
// described to cuDNN as [B, H, T, d] with strides (T·H·d, d, H·d, 1).
class AttentionGraph {
 public:
  AttentionGraph(GraphBuilder& builder_in, const AttentionShape& dims)
      : builder(builder_in), dims_(dims) {}

  // [B, heads, T, d] in the caller's BSHD memory.
  const Descriptor& rows(int64_t uid, int64_t heads) {
    return tensor(uid, CUDNN_DATA_BFLOAT16, {dims_.batch, heads, dims_.seq, dims_.dim},
                  bshd_strides(heads), false);
  }
  // The same memory as [B, heads, d, T]: K or V transposed, by strides.
  const Descriptor& rows_transposed(int64_t uid, int64_t heads) {
    const std::vector<int64_t> s = bshd_strides(heads);
    return tensor(uid, CUDNN_DATA_BFLOAT16, {dims_.batch, heads, dims_.dim, dims_.seq},
                  {s[0], s[1], 1, s[2]}, false);
  }
  // Scores-shaped [B, Hq, T, T], packed.
  const Descriptor& scores(cudnnDataType_t dtype) {
    const int64_t t = dims_.seq, h = dims_.q_heads;
    return tensor(next_virtual(), dtype, {dims_.batch, h, t, t}, {h * t * t, t * t, t, 1}, true);
  }
  // Scores transposed: [B, Hq, T_kv, T_q] viewing packed [B, Hq, T_q, T_kv].
  const Descriptor& scores_transposed(cudnnDataType_t dtype) {
    const int64_t t = dims_.seq, h = dims_.q_heads;
    return tensor(next_virtual(), dtype, {dims_.batch, h, t, t}, {h * t * t, t * t, 1, t}, true);
  }
  // One value per query row, [B, Hq, T, 1] packed (the layout of lse).
  const Descriptor& per_row(int64_t uid, bool is_virtual) {
    const int64_t t = dims_.seq, h = dims_.q_heads;
    return tensor(is_virtual ? next_virtual() : uid, CUDNN_DATA_FLOAT, {dims_.batch, h, t, 1},
                  {h * t, t, 1, 1}, is_virtual);
  }
  // [B, Hq, T, d] packed BHSD (per-q-head gradients before the GQA reduction, dQ in f32).
  const Descriptor& heads_packed(int64_t uid, cudnnDataType_t dtype, bool is_virtual) {
    const int64_t t = dims_.seq, h = dims_.q_heads, d = dims_.dim;
    return tensor(is_virtual ? next_virtual() : uid, dtype, {dims_.batch, h, t, d},
                  {h * t * d, t * d, d, 1}, is_virtual);
  }
  const Descriptor& scalar(int64_t uid) {
    return builder.tensor({uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true});
  }
  const Descriptor& like(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                         cudnnDataType_t dtype) {
    return tensor(next_virtual(), dtype, dims, strides, true);
  }

  // scale · Q·Kᵀ, [B, Hq, T, T] f32.
  const Descriptor& scaled_scores(const Descriptor& q, const Descriptor& k_t,
                                  const Descriptor& scale) {
    const Descriptor& s = scores(CUDNN_DATA_FLOAT);
    builder.matmul(q, k_t, s);
    const Descriptor& scaled = scores(CUDNN_DATA_FLOAT);
    builder.pointwise(CUDNN_POINTWISE_MUL, s, &scale, scaled);
    return scaled;
  }

  // scores masked causally: position (row, col) with row < col becomes −∞.
  const Descriptor& causal_mask(const Descriptor& scores_in, const Descriptor& negative_infinity) {
    const Descriptor& row = scores(CUDNN_DATA_INT32);
    builder.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores_in, nullptr, row, nullptr, 2);
    const Descriptor& col = scores(CUDNN_DATA_INT32);
    builder.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores_in, nullptr, col, nullptr, 3);
    const Descriptor& keep = scores(CUDNN_DATA_BOOLEAN);
    builder.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep);
    const Descriptor& masked = scores(CUDNN_DATA_FLOAT);
    builder.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores_in, &negative_infinity, masked, &keep);
    return masked;
  }

  GraphBuilder& builder;

 private:
  std::vector<int64_t> bshd_strides(int64_t heads) const {
    return {dims_.seq * heads * dims_.dim, dims_.dim, heads * dims_.dim, 1};
  }
  const Descriptor& tensor(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims,
                           std::vector<int64_t> strides, bool is_virtual) {
    return builder.tensor({uid, dtype, std::move(dims), std::move(strides), is_virtual, false});
  }
  int64_t next_virtual() { return next_virtual_++; }

  AttentionShape dims_;
  int64_t next_virtual_ = kFirstVirtual;
};

}  // namespace

void add_attention_forward(GraphBuilder& builder, const AttentionShape& dims) {
  AttentionGraph g(builder, dims);
  const Descriptor& q = g.rows(kQ, dims.q_heads);
  const Descriptor& k_t = g.rows_transposed(kK, dims.kv_heads);
  const Descriptor& v = g.rows(kV, dims.kv_heads);
  const Descriptor& o = g.rows(kO, dims.q_heads);
  const Descriptor& scale = g.scalar(kScale);

  const Descriptor& scores = g.scaled_scores(q, k_t, scale);
  const Descriptor& masked =
      dims.causal ? g.causal_mask(scores, g.scalar(kNegativeInfinity)) : scores;

  const Descriptor& row_max = g.per_row(0, true);
  g.builder.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  const Descriptor& shifted = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_SUB, masked, &row_max, shifted);
  const Descriptor& exps = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, exps);
  const Descriptor& row_sum = g.per_row(0, true);
  g.builder.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, row_sum);
  const Descriptor& log_sum = g.per_row(0, true);
  g.builder.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum);
  const Descriptor& stats = g.per_row(kStats, false);
  g.builder.pointwise(CUDNN_POINTWISE_ADD, row_max, &log_sum, stats);
  // The second matmul takes P in the I/O type, as the fused engine requires.
  const Descriptor& p = g.scores(CUDNN_DATA_BFLOAT16);
  g.builder.pointwise(CUDNN_POINTWISE_DIV, exps, &row_sum, p);
  g.builder.matmul(p, v, o);
}

void add_attention_backward(GraphBuilder& builder, const AttentionShape& dims, bool deterministic) {
  AttentionGraph g(builder, dims);
  const int64_t b = dims.batch, hq = dims.q_heads, hkv = dims.kv_heads, t = dims.seq, d = dims.dim;
  const bool grouped = hq != hkv;
  const Descriptor& q = g.rows(kQ, hq);
  const Descriptor& k_t = g.rows_transposed(kK, hkv);
  const Descriptor& v_t = g.rows_transposed(kV, hkv);
  const Descriptor& o = g.rows(kO, hq);
  const Descriptor& d_o = g.rows(kDO, hq);
  const Descriptor& dq = g.rows(kDQ, hq);
  const Descriptor& dk = g.rows(kDK, hkv);
  const Descriptor& dv = g.rows(kDV, hkv);
  const Descriptor& stats = g.per_row(kStats, false);
  const Descriptor& scale = g.scalar(kScale);
  const Descriptor& one = g.scalar(kOne);

  // rowsum(dO ∘ O), kept in memory the caller provides.
  const Descriptor& products =
      g.like({b, hq, t, d}, {hq * t * d, t * d, hq * d, 1}, CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, products);
  const Descriptor& summed = g.per_row(0, true);
  g.builder.reduction(CUDNN_REDUCE_TENSOR_ADD, products, summed);
  const Descriptor& row_dot = g.per_row(kRowDot, false);
  g.builder.pointwise(CUDNN_POINTWISE_MUL, summed, &one, row_dot);

  // P, masked after the log-sum-exp is taken off and before the exponential.
  const Descriptor& shifted = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_SUB, g.scaled_scores(q, k_t, scale), &stats, shifted);
  const Descriptor& masked =
      dims.causal ? g.causal_mask(shifted, g.scalar(kNegativeInfinity)) : shifted;
  const Descriptor& p = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p);

  // dV = Pᵀ·dO; with GQA per q head first, then summed over each kv head's group.
  const Descriptor& p_t = g.scores_transposed(CUDNN_DATA_BFLOAT16);
  g.builder.reshape(p, p_t);
  const auto head_gradient = [&](const Descriptor& a, const Descriptor& b_operand,
                                 const Descriptor& out) {
    if (!grouped) return g.builder.matmul(a, b_operand, out);
    const Descriptor& full = g.heads_packed(0, CUDNN_DATA_BFLOAT16, true);
    g.builder.matmul(a, b_operand, full);
    g.builder.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  head_gradient(p_t, d_o, dv);

  // dS = scale · P ∘ (dO·Vᵀ − rowsum(dO ∘ O)).
  const Descriptor& dp = g.scores(CUDNN_DATA_FLOAT);
  g.builder.matmul(d_o, v_t, dp);
  const Descriptor& centered = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_SUB, dp, &row_dot, centered);
  const Descriptor& weighted = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_MUL, centered, &p, weighted);
  const Descriptor& ds = g.scores(CUDNN_DATA_FLOAT);
  g.builder.pointwise(CUDNN_POINTWISE_MUL, weighted, &scale, ds);

  // dK = dSᵀ·Q.
  const Descriptor& ds_t = g.scores_transposed(CUDNN_DATA_BFLOAT16);
  g.builder.reshape(ds, ds_t);
  head_gradient(ds_t, q, dk);

  // dQ = dS·K, K seen again in its own layout.
  const int64_t kv_row = hkv * d;
  const Descriptor& k = g.like({b, hkv, t, d}, {t * kv_row, d, kv_row, 1}, CUDNN_DATA_FLOAT);
  g.builder.reshape(k_t, k);
  if (deterministic) {
    g.builder.matmul(ds, k, dq);
  } else {
    const Descriptor& accumulated = g.heads_packed(kDQAccum, CUDNN_DATA_FLOAT, false);
    g.builder.matmul(ds, k, accumulated);
    g.builder.pointwise(CUDNN_POINTWISE_IDENTITY, accumulated, nullptr, dq);
  }
}

}  // namespace ulysses::cudnn
