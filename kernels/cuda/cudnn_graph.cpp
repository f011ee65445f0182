#include "kernels/cuda/cudnn_graph.h"

#include <stdexcept>
#include <utility>

namespace ulysses::cudnn {

void check(cudnnStatus_t status, const std::string& what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char message[1024] = "";
  cudnnGetLastErrorString(message, sizeof message);
  throw std::runtime_error(what + ": " + cudnnGetErrorString(status) +
                           (message[0] ? std::string(" (") + message + ")" : std::string()));
}

// ---- Descriptor ----------------------------------------------------------------------------

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  check(cudnnBackendCreateDescriptor(type, &descriptor_), "cudnnBackendCreateDescriptor");
}

Descriptor::~Descriptor() {
  if (descriptor_) cudnnBackendDestroyDescriptor(descriptor_);
}

Descriptor::Descriptor(Descriptor&& other) noexcept
    : descriptor_(std::exchange(other.descriptor_, nullptr)) {}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (descriptor_) cudnnBackendDestroyDescriptor(descriptor_);
    descriptor_ = std::exchange(other.descriptor_, nullptr);
  }
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  check(cudnnBackendSetAttribute(descriptor_, name, type, count, values),
        "cudnnBackendSetAttribute(" + std::to_string(int(name)) + ")");
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, const Descriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, int64_t value) {
  return set(name, CUDNN_TYPE_INT64, 1, &value);
}

Descriptor& Descriptor::finalize(const std::string& what) {
  check(cudnnBackendFinalize(descriptor_), what);
  return *this;
}

// ---- GraphBuilder --------------------------------------------------------------------------

namespace {

// Alignment cuDNN may assume for every non-virtual tensor: the tracking allocator's buffers
// and their 16-byte aligned views.
constexpr int64_t kByteAlignment = 16;

}  // namespace

const Descriptor& GraphBuilder::tensor(const TensorSpec& spec) {
  Descriptor& d = owned_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t rank = int64_t(spec.dims.size());
  const int64_t alignment = kByteAlignment;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.dtype)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, spec.dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, spec.strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, spec.uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment);
  if (spec.is_virtual) {
    const bool yes = true;
    d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  if (spec.by_value) {
    const bool yes = true;
    d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  return d.finalize("cuDNN tensor " + std::to_string(spec.uid));
}

void GraphBuilder::matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c) {
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const double padding = 0.0;
  Descriptor& desc = owned_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  desc.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding)
      .finalize("cuDNN matmul");
  Descriptor& op = owned_.emplace_back(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
      .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
      .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
      .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, desc)
      .finalize("cuDNN matmul operation");
  operations_.push_back(op.get());
}

void GraphBuilder::reshape(const Descriptor& x, const Descriptor& y) {
  Descriptor& op = owned_.emplace_back(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
      .set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)
      .finalize("cuDNN reshape operation");
  operations_.push_back(op.get());
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b,
                             const Descriptor& y, const Descriptor* t, int64_t axis) {
  // Comparisons compute in booleans; everything else in float.
  const cudnnDataType_t math =
      mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
  const float one = 1.0f;
  Descriptor& desc = owned_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  desc.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) desc.set(CUDNN_ATTR_POINTWISE_AXIS, axis);
  desc.finalize("cuDNN pointwise " + std::to_string(int(mode)));
  Descriptor& op = owned_.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
  if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  op.finalize("cuDNN pointwise operation " + std::to_string(int(mode)));
  operations_.push_back(op.get());
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce, const Descriptor& x,
                             const Descriptor& y) {
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const bool deterministic = false;  // as cudnn-frontend sets it for attention's reductions
  Descriptor& desc = owned_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  desc.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic)
      .finalize("cuDNN reduction");
  Descriptor& op = owned_.emplace_back(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc)
      .finalize("cuDNN reduction operation");
  operations_.push_back(op.get());
}

namespace {

// cuDNN's last error message after a failed call, as "; <status> <message>".
std::string refusal(cudnnStatus_t status) {
  char message[512] = "";
  cudnnGetLastErrorString(message, sizeof message);
  return std::string("; ") + cudnnGetErrorString(status) + (message[0] ? " " : "") + message;
}

}  // namespace

const Descriptor& GraphBuilder::finalize_graph(const std::string& what) {
  Descriptor& graph = owned_.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (handle_) graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  graph
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           int64_t(operations_.size()), operations_.data())
      .finalize(what + ": operation graph");
  return graph;
}

GraphBuilder::Plan GraphBuilder::build(const std::string& what) {
  const Descriptor& graph = finalize_graph(what);
  std::string refusals;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    cudnnStatus_t status = cudnnBackendFinalize(heuristics.get());
    int64_t count = 0;
    if (status == CUDNN_STATUS_SUCCESS)
      status = cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; status == CUDNN_STATUS_SUCCESS && i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t returned = 0;
    if (status == CUDNN_STATUS_SUCCESS && count > 0)
      status =
          cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data());
    if (status != CUDNN_STATUS_SUCCESS) {
      refusals += refusal(status);
      continue;
    }
    for (int64_t i = 0; i < returned; ++i) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[size_t(i)]);
      status = cudnnBackendFinalize(plan.get());
      if (status != CUDNN_STATUS_SUCCESS) {
        refusals += refusal(status);
        continue;
      }
      Plan result;
      int64_t got = 0;
      check(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &got, &result.workspace_bytes),
            what + ": workspace size");
      result.plan = std::move(plan);
      return result;
    }
  }
  throw std::runtime_error(what + ": cuDNN " + std::to_string(cudnnGetVersion()) +
                           " has no engine for this graph on this GPU" + refusals +
                           "; use kernels.attention: native");
}

void execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const std::string& what) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize(what + ": variant pack");
  check(cudnnBackendExecute(handle, plan.get(), pack.get()), what + ": cudnnBackendExecute");
}

}  // namespace ulysses::cudnn
