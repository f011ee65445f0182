// A thin layer over cuDNN's backend graph API (cudnn_graph.h): owned descriptors, tensors and
// operations, and an operation graph turned into an execution plan by cuDNN's heuristics.
// Host code only; used by the cuDNN attention (kernels.attention: cudnn).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace ulysses::cudnn {

// Throws std::runtime_error naming the call, cuDNN's status string and its last error message.
void check(cudnnStatus_t status, const std::string& what);

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept;
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return descriptor_; }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value);
  Descriptor& set(cudnnBackendAttributeName_t name, int64_t value);
  Descriptor& finalize(const std::string& what);

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

struct TensorSpec {
  int64_t uid;
  cudnnDataType_t dtype;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false;
  bool by_value = false;  // a host scalar passed in the variant pack
};

// Builds the tensors and operations of one graph; the graph owns every descriptor.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  const Descriptor& tensor(const TensorSpec& spec);
  // c = a · b over the last two dims (batched over the leading ones), fp32 compute.
  void matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c);
  // y: the same elements as x seen through y's dims and strides (a transposed view).
  void reshape(const Descriptor& x, const Descriptor& y);
  // y = mode(x[, b]) with fp32 math; t is BINARY_SELECT's condition; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b,
                 const Descriptor& y, const Descriptor* t = nullptr, int64_t axis = -1);
  // y = reduce(x) over the dims where y has extent 1, fp32 compute.
  void reduction(cudnnReduceTensorOp_t op, const Descriptor& x, const Descriptor& y);

  // The operation graph of every operation added so far, finalized (with the handle when there
  // is one: without, cuDNN still checks the graph, which tests use without a GPU).
  const Descriptor& finalize_graph(const std::string& what);

  // The operation graph and the first engine configuration cuDNN's heuristics (mode A, then
  // the fallback list) offer that finalizes into a plan. Throws, naming `what` and cuDNN's
  // reasons, when none does.
  struct Plan {
    Descriptor plan;
    int64_t workspace_bytes = 0;
  };
  Plan build(const std::string& what);

  size_t operation_count() const { return operations_.size(); }

 private:
  cudnnHandle_t handle_;
  std::deque<Descriptor> owned_;  // every descriptor of the graph (references stay valid)
  std::vector<cudnnBackendDescriptor_t> operations_;
};

// Runs a plan on the handle's stream with one pointer per uid (device memory, or host memory
// for by-value scalars) and a workspace of the plan's size.
void execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const std::string& what);

}  // namespace ulysses::cudnn
