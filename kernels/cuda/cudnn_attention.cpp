#include "kernels/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_enqueued.h"
#include "kernels/cuda/cudnn_attention_graphs.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/op_scratch.h"
#include "kernels/stopwatch.h"

namespace ulysses {

namespace {

using cudnn::AttentionShape;
using cudnn::GraphBuilder;
using namespace cudnn::attention_uid;

void require_supported(const Tensor& q, const Tensor& k, std::initializer_list<const Tensor*> all,
                       const char* op) {
  const int64_t dim = q.shape[3];
  if (dim % 8 != 0 || dim > 128)
    throw std::invalid_argument(std::string(op) + ": kernels.attention: cudnn needs a head dim " +
                                "that is a multiple of 8 and at most 128, got " +
                                std::to_string(dim) + "; use kernels.attention: native");
  if (q.shape[1] < 2)
    throw std::invalid_argument(std::string(op) +
                                ": kernels.attention: cudnn needs at least 2 tokens per sequence");
  for (const Tensor* t : all)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
      throw std::invalid_argument(std::string(op) +
                                  ": kernels.attention: cudnn needs 16-byte aligned tensors");
}

// The deterministic backward keeps dP in its workspace on some GPUs (O(T²)); above this it
// gives way to cuDNN's default, so that attention memory stays O(T·d).
int64_t deterministic_workspace_limit(const AttentionShape& s) {
  return cudnn_attention_workspace_bound(s.batch, s.q_heads, s.seq, s.dim);
}

AttentionShape dims_of(const Tensor& q, const Tensor& k, bool causal) {
  return {q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], causal};
}

}  // namespace

struct CudnnAttention::Graphs {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  static Key key(const AttentionShape& d) {
    return {d.batch, d.seq, d.q_heads, d.kv_heads, d.dim, d.causal};
  }

  cudnnHandle_t handle = nullptr;
  std::map<Key, GraphBuilder::Plan> forward, backward;
  std::map<Key, bool> backward_deterministic;
};

CudnnAttention::CudnnAttention(Backend& backend, cudaStream_t stream)
    : backend_(backend), graphs_(std::make_unique<Graphs>()) {
  // The graphs are the ones cudnn-frontend builds for runtimes from 9.16 on; older ones need
  // other masks and workarounds.
  const size_t version = cudnnGetVersion();
  if (version < size_t(kCudnnAttentionMinimumVersion))
    throw std::runtime_error(
        "kernels.attention: cudnn needs cuDNN 9.16 or newer at run time, "
        "but the loaded library is " +
        std::to_string(version) + "; use kernels.attention: native");
  cudnn::check(cudnnCreate(&graphs_->handle), "kernels.attention: cudnn: cudnnCreate");
  const cudnnStatus_t status = cudnnSetStream(graphs_->handle, stream);
  if (status != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(graphs_->handle);
    cudnn::check(status, "cudnnSetStream");
  }
}

CudnnAttention::~CudnnAttention() {
  // Plans go before the handle they were made with.
  graphs_->forward.clear();
  graphs_->backward.clear();
  cudnnDestroy(graphs_->handle);
}

std::string CudnnAttention::take_graphs_built() {
  std::string built;
  if (graphs_built_ > 0) {
    char text[96];
    std::snprintf(text, sizeof text, "%d cuDNN graphs in %.2f s", graphs_built_, graph_seconds_);
    built = text;
  }
  graphs_built_ = 0;
  graph_seconds_ = 0.0;
  return built;
}

void CudnnAttention::forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, bool causal) {
  require_supported(q, k, {&out, &lse, &q, &k, &v}, "attention_forward");
  const AttentionShape dims = dims_of(q, k, causal);
  const Graphs::Key key = Graphs::key(dims);
  auto found = graphs_->forward.find(key);
  if (found == graphs_->forward.end()) {
    const Stopwatch clock;
    GraphBuilder builder(graphs_->handle);
    cudnn::add_attention_forward(builder, dims);
    found = graphs_->forward.emplace(key, builder.build("kernels.attention: cudnn forward")).first;
    ++graphs_built_;
    graph_seconds_ += clock.seconds();
  }
  const GraphBuilder::Plan& plan = found->second;

  float scale = float(1.0 / std::sqrt(double(dims.dim)));
  float negative_infinity = -std::numeric_limits<float>::infinity();
  Buffer workspace = cudnn_workspace(backend_, plan.workspace_bytes, "cuDNN attention forward");
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> pointers = {q.data, k.data, v.data, out.data, lse.data, &scale};
  if (causal) {  // the −∞ scalar exists only in the masked graph
    uids.push_back(kNegativeInfinity);
    pointers.push_back(&negative_infinity);
  }
  cuda::count_enqueued();
  cudnn::execute(graphs_->handle, plan.plan, uids, pointers, workspace.tensor().data,
                 "kernels.attention: cudnn forward");
}

void CudnnAttention::backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal) {
  require_supported(q, k, {&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse}, "attention_backward");
  const AttentionShape dims = dims_of(q, k, causal);
  const Graphs::Key key = Graphs::key(dims);
  auto found = graphs_->backward.find(key);
  if (found == graphs_->backward.end()) {
    const Stopwatch clock;
    // The deterministic algorithm where cuDNN has one for this GPU, else its default.
    auto plan_for = [&](bool deterministic) {
      GraphBuilder builder(graphs_->handle);
      cudnn::add_attention_backward(builder, dims, deterministic);
      return builder.build(std::string("kernels.attention: cudnn backward (") +
                           (deterministic ? "deterministic" : "accumulating dQ") + ")");
    };
    bool deterministic = true;
    GraphBuilder::Plan plan;
    std::string why;
    try {
      plan = plan_for(true);
      if (plan.workspace_bytes > deterministic_workspace_limit(dims)) {
        deterministic = false;
        why = "the deterministic plan wants " + std::to_string(plan.workspace_bytes) +
              " bytes of workspace";
      }
    } catch (const std::runtime_error& refused) {
      deterministic = false;
      why = refused.what();
    }
    if (!deterministic) {
      try {
        plan = plan_for(false);
      } catch (const std::runtime_error& also_refused) {
        throw std::runtime_error(why + "; and " + also_refused.what());
      }
    }
    graphs_->backward_deterministic[key] = deterministic;
    found = graphs_->backward.emplace(key, std::move(plan)).first;
    ++graphs_built_;
    graph_seconds_ += clock.seconds();
  }
  const GraphBuilder::Plan& plan = found->second;
  const bool deterministic = graphs_->backward_deterministic[key];

  float scale = float(1.0 / std::sqrt(double(dims.dim)));
  float negative_infinity = -std::numeric_limits<float>::infinity();
  float one = 1.0f;
  Buffer row_dot = attention_row_dot(backend_, dims.batch, dims.q_heads, dims.seq);
  Buffer dq_accum;
  if (!deterministic) {
    dq_accum = cudnn_dq_accumulator(backend_, q.numel());
    backend_.fill_zero(dq_accum);  // cudnn-frontend zeroes it only before cuDNN 9.6; be sure
  }
  Buffer workspace = cudnn_workspace(backend_, plan.workspace_bytes, "cuDNN attention backward");
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kDQ, kDK, kDV, kStats, kScale, kOne, kRowDot};
  std::vector<void*> pointers = {q.data,    k.data,  v.data,  out.data,
                                 dout.data, dq.data, dk.data, dv.data,
                                 lse.data,  &scale,  &one,    row_dot.tensor().data};
  if (causal) {
    uids.push_back(kNegativeInfinity);
    pointers.push_back(&negative_infinity);
  }
  if (!deterministic) {
    uids.push_back(kDQAccum);
    pointers.push_back(dq_accum.tensor().data);
  }
  cuda::count_enqueued();
  cudnn::execute(graphs_->handle, plan.plan, uids, pointers, workspace.tensor().data,
                 "kernels.attention: cudnn backward");
}

}  // namespace ulysses
