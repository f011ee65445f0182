#include "kernels/op_dtypes.h"

#include <stdexcept>

#include "kernels/backend.h"

namespace ulysses {

std::string KernelDTypes::names() const {
  if (f32 && bf16) return "f32 or bf16";
  return f32 ? "f32" : "bf16";
}

KernelDTypes kernel_dtypes(BackendKind kind, std::string_view op) {
  if (kind == BackendKind::cpu) return {.f32 = true, .bf16 = false};
  if (op.starts_with("attention")) return {.f32 = false, .bf16 = true};
  return {.f32 = true, .bf16 = true};
}

namespace contracts {

namespace {

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype)) + " " + t.shape_string();
}

}  // namespace

DTypeRules::DTypeRules(BackendKind kind, const char* op)
    : op_(op),
      backend_(kind == BackendKind::cpu ? "cpu" : "cuda"),
      kernels_(kernel_dtypes(kind, op)) {}

const DTypeRules& DTypeRules::element(const Tensor& t, const char* name) const {
  if (!kernels_.takes(t.dtype) || t.data == nullptr)
    throw std::invalid_argument(std::string(op_) + ": " + name + " must be a non-empty " +
                                kernels_.names() + " tensor on the " + backend_ + " backend (got " +
                                describe(t) + ")");
  return *this;
}

const DTypeRules& DTypeRules::like(const Tensor& t, const char* name, const Tensor& other,
                                   const char* other_name) const {
  if (t.dtype != other.dtype)
    throw std::invalid_argument(std::string(op_) + ": " + name + " (" + describe(t) +
                                ") must have the dtype of " + other_name + " (" + describe(other) +
                                ")");
  return element(t, name);
}

const DTypeRules& DTypeRules::fixed(const Tensor& t, const char* name, DType dtype) const {
  if (t.dtype != dtype || t.data == nullptr)
    throw std::invalid_argument(std::string(op_) + ": " + name + " must be a non-empty " +
                                dtype_name(dtype) + " tensor (got " + describe(t) + ")");
  return *this;
}

}  // namespace contracts

}  // namespace ulysses
