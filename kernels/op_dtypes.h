// The dtype part of the ops' contracts (kernels/op_contracts.h): the words each op's rules
// are written in, and the one table of which float dtypes each backend's kernels take.
//
// An op's tensors are of three sorts. Element tensors (activations, compute-copy weights and
// their gradients) are f32 or bf16, in a dtype the backend's kernels take for that op, and
// some must share the dtype of another. Fixed tensors have a dtype the op names whatever the
// backend: statistics (lse, mean, rstd), master gradients and optimizer state are f32, token
// ids and targets i32. The fronts (kernels/backend.cpp) check these rules before any backend
// runs, so a backend's kernels read the dtypes they were given without checking them again.
#pragma once

#include <string>
#include <string_view>

#include "kernels/tensor.h"

namespace ulysses {

enum class BackendKind;

// The float dtypes a backend's kernels take for an op's element tensors.
struct KernelDTypes {
  bool f32 = false;
  bool bf16 = false;
  bool takes(DType dtype) const {
    return (dtype == DType::f32 && f32) || (dtype == DType::bf16 && bf16);
  }
  std::string names() const;  // "f32", "bf16" or "f32 or bf16"
};

// Each backend kind's kernels, in one table: the cpu backend is the fp32 reference; the cuda
// backend takes f32 and bf16, except its attention, which is bf16 only (docs/cuda.md).
KernelDTypes kernel_dtypes(BackendKind kind, std::string_view op);

namespace contracts {

// The dtype rules of one op's call, checked as they are stated; each throws
// std::invalid_argument naming the op, the tensor and what it got.
class DTypeRules {
 public:
  DTypeRules(BackendKind kind, const char* op);

  // An element tensor: non-empty, in a dtype this backend's kernels take for the op.
  const DTypeRules& element(const Tensor& t, const char* name) const;
  // An element tensor with the dtype of `other` (itself checked as an element).
  const DTypeRules& like(const Tensor& t, const char* name, const Tensor& other,
                         const char* other_name) const;
  // A non-empty tensor of the dtype the op fixes.
  const DTypeRules& fixed(const Tensor& t, const char* name, DType dtype) const;

 private:
  const char* op_;
  const char* backend_;
  KernelDTypes kernels_;
};

}  // namespace contracts

}  // namespace ulysses
