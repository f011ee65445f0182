// kernels.attention: cudnn — causal attention through cuDNN's fused flash-attention engines,
// built as cuDNN backend operation graphs (cudnn_graph.h). Same contract as the native kernels
// (kernels/backend.h): q[B, T, Hq, d], k/v[B, T, Hkv, d] bf16, out bf16, lse[B, Hq, T] f32 =
// log-sum-exp of the scaled scores, scale 1/sqrt(d). cuDNN's softmax statistics are exactly
// that log-sum-exp, so either implementation's lse feeds the other's backward.
// Host code: no CUDA kernels here, only graphs, plans cached per shape, and their execution.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace ulysses {

class CudnnAttention {
 public:
  // Graphs run on `stream`; workspaces come from `backend` (category attention).
  CudnnAttention(Backend& backend, cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // causal = false: every query sees every key (a ring attention block whose keys all
  // precede its queries; kernels/cuda/cudnn_attention_graphs.h).
  void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
               const Tensor& v, bool causal = true);
  void backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& lse, bool causal = true);

  // The graphs built since the last call and the host time they took, as a phrase for the log
  // ("2 cuDNN graphs in 1.40 s"); empty when none.
  std::string take_graphs_built();

 private:
  struct Graphs;  // the cuDNN handle and the plans, defined where cudnn.h is included

  Backend& backend_;
  std::unique_ptr<Graphs> graphs_;
  int graphs_built_ = 0;
  double graph_seconds_ = 0.0;
};

}  // namespace ulysses
