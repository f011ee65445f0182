// A backend that runs nothing and allocates nothing: every buffer is charged to its category
// (planning mode, kernels/memory.h) and every op charges the scratch the real backend of
// that kind would allocate (kernels/op_scratch.h). The trainer's own step, run on it, gives
// the per-category peak of a real step on any machine, a cuda plan included (docs/memory.md,
// "The planner"). The ops' fronts check their contracts as on any backend
// (kernels/op_contracts.h), so a plan is made only of calls that a run would accept.
#pragma once

#include <string>

#include "kernels/backend.h"
#include "kernels/op_scratch.h"

namespace ulysses {

// Every op computing nothing and returning its result type's zero: the base of the planning
// backend, which overrides the ops whose scratch it charges.
class ComputeFreeBackend : public Backend {
 public:
  using Backend::Backend;

 protected:
#define ULYSSES_OP_COMPUTING_NOTHING(result, name, parameters) \
  result name##_impl parameters override {                     \
    return result();                                           \
  }
  ULYSSES_BACKEND_OPS(ULYSSES_OP_COMPUTING_NOTHING)
#undef ULYSSES_OP_COMPUTING_NOTHING
};

class PlanningBackend final : public ComputeFreeBackend {
 public:
  // attention: kernels.attention (cudnn on cuda only). cpu_threads sizes the cpu
  // attention's per-thread tiles, as omp_get_max_threads() does in a run.
  PlanningBackend(BackendKind kind, AttentionKernel attention, int cpu_threads);

  std::string name() const override;
  BackendKind kind() const override { return kind_; }
  DType compute_dtype() const override { return compute_dtype_of(kind_); }
  void set_num_threads(int threads) override { threads_ = threads; }
  int64_t auto_loss_tile_tokens(int64_t vocab, int64_t width) const override {
    return kind_ == BackendKind::cuda ? device_loss_tile_tokens(vocab, width, memory().limit())
                                      : Backend::auto_loss_tile_tokens(vocab, width);
  }
  // Whether a cuDNN workspace was charged at its bound (docs/memory.md, "The planner").
  bool used_workspace_bound() const { return used_workspace_bound_; }

  // As the planned backend: on cuda offloaded layer inputs move, and two stay on the device.
  bool host_memory_is_separate() const override { return kind_ == BackendKind::cuda; }
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* pointer) override;
  void synchronize() override {}

 private:
  // The ops that charge scratch (kernels/op_scratch.h); the rest compute nothing.
  void rope_impl(const Tensor& x, int64_t pos_offset, float theta, bool inverse) override;
  void attention_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                              const Tensor& k, const Tensor& v,
                              const Documents& documents) override;
  void attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               const Documents& documents) override;
  void attention_block_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                                    const Tensor& k, const Tensor& v, int64_t q_first,
                                    int64_t k_first, bool merge,
                                    const Documents& documents) override;
  void attention_block_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                     const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     int64_t q_first, int64_t k_first,
                                     const Documents& documents) override;
  // Every row is counted (the planned micro-batch has a target everywhere), which is the
  // largest the loss tiles get.
  LossResult lm_head_loss_impl(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                               int64_t tile_rows, float grad_scale, const Tensor& dhidden,
                               const Tensor& dweight) override;

  bool cudnn() const { return kind_ == BackendKind::cuda && attention_ == AttentionKernel::cudnn; }
  int64_t cudnn_bound(const Tensor& q) const;

  BackendKind kind_;
  AttentionKernel attention_;
  int threads_;
  bool used_workspace_bound_ = false;
  Buffer cublaslt_workspace_;  // held by the cuda backend for its lifetime
};

}  // namespace ulysses
