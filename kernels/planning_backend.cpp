#include "kernels/planning_backend.h"

#include <algorithm>
#include <stdexcept>

namespace ulysses {

PlanningBackend::PlanningBackend(BackendKind kind, AttentionKernel attention, int cpu_threads)
    : ComputeFreeBackend(0),
      kind_(kind),
      attention_(attention),
      threads_(std::max(1, cpu_threads)) {
  if (attention == AttentionKernel::cudnn && kind != BackendKind::cuda)
    throw std::invalid_argument("kernels.attention: cudnn needs device: cuda");
  memory().set_planning(true);
  if (kind_ == BackendKind::cuda) cublaslt_workspace_ = cublaslt_workspace(*this);
}

std::string PlanningBackend::name() const {
  return kind_ == BackendKind::cuda ? "cuda (planned)" : "cpu (planned)";
}

void* PlanningBackend::raw_alloc(size_t bytes) {
  throw std::logic_error("planning backend asked for " + std::to_string(bytes) +
                         " real bytes: it only plans");
}

void PlanningBackend::raw_free(void*) {}

void PlanningBackend::rope_impl(const Tensor& x, int64_t, float, bool) {
  if (x.numel() > 0) rope_table(*this, x.dim(1), x.dim(3) / 2);
}

int64_t PlanningBackend::cudnn_bound(const Tensor& q) const {
  return cudnn_attention_workspace_bound(q.dim(0), q.dim(2), q.dim(1), q.dim(3));
}

void PlanningBackend::attention_forward_impl(const Tensor&, const Tensor&, const Tensor& q,
                                             const Tensor&, const Tensor&, const Documents&) {
  if (q.numel() == 0) return;
  if (kind_ == BackendKind::cpu) {
    cpu_attention_forward_scratch(*this, threads_, q.dim(3));
  } else if (cudnn()) {
    used_workspace_bound_ = true;
    cudnn_workspace(*this, cudnn_bound(q), "cuDNN attention forward (bound)");
  }
}

void PlanningBackend::attention_backward_impl(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor& q, const Tensor&,
                                              const Tensor&, const Tensor&, const Tensor&,
                                              const Documents&) {
  if (q.numel() == 0) return;
  const Buffer row_dot = attention_row_dot(*this, q.dim(0), q.dim(2), q.dim(1));
  if (kind_ == BackendKind::cpu) {
    cpu_attention_backward_scratch(*this, threads_, q.dim(3));
  } else if (cudnn()) {
    // Which backward cuDNN takes is known only on a device: both are charged.
    used_workspace_bound_ = true;
    const Buffer dq_accum = cudnn_dq_accumulator(*this, q.numel());
    cudnn_workspace(*this, cudnn_bound(q), "cuDNN attention backward (bound)");
  }
}

// Block attention: the whole attention's scratch, and on cuda the block's own results
// (kernels/op_scratch.h), held while it runs.
void PlanningBackend::attention_block_forward_impl(const Tensor& out, const Tensor& lse,
                                                   const Tensor& q, const Tensor& k,
                                                   const Tensor& v, int64_t, int64_t, bool merge,
                                                   const Documents&) {
  if (kind_ == BackendKind::cpu || !merge || q.numel() == 0)
    return attention_forward_impl(out, lse, q, k, v, {});
  const AttentionBlockOutputs block = attention_block_outputs(*this, out, lse);
  attention_forward_impl(out, lse, q, k, v, {});
}

void PlanningBackend::attention_block_backward_impl(const Tensor& dq, const Tensor& dk,
                                                    const Tensor& dv, const Tensor& dout,
                                                    const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const Tensor& out,
                                                    const Tensor& lse, int64_t, int64_t,
                                                    const Documents&) {
  if (kind_ == BackendKind::cpu || q.numel() == 0)
    return attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, {});
  const AttentionBlockGradients block = attention_block_gradients(*this, dq, dk, dv);
  attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, {});
}

LossResult PlanningBackend::lm_head_loss_impl(const Tensor& hidden, const Tensor& weight,
                                              const Tensor&, int64_t tile_rows, float,
                                              const Tensor& dhidden, const Tensor&) {
  const int64_t vocab = weight.dim(0), width = weight.dim(1);
  LossResult result;
  result.count = hidden.numel() / width;
  if (result.count == 0) return result;
  const int64_t tile = std::min(tile_rows, result.count);
  lm_head_loss_scratch(*this, kind_, result.count, tile, vocab, width, hidden.dtype,
                       !dhidden.empty());
  return result;
}

}  // namespace ulysses
