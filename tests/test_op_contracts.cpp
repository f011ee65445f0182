// The op fronts check each op's contract once for every backend (kernels/op_contracts.h): the
// cpu backend, the planner and the CUDA kernels run on the host (tests/emulated_cuda_backend.h)
// refuse the same shapes, dtypes and overlapping outputs with the same message, so a plan is
// made only of calls a run would accept.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/planning_backend.h"
#include "tests/emulated_cuda_backend.h"

namespace ulysses {
namespace {

// What the backend says of a call it refuses, or "(no error)".
std::string refusal(Backend& backend, const std::function<void(Backend&)>& call) {
  try {
    call(backend);
  } catch (const std::invalid_argument& error) {
    return std::string(error.what());
  }
  return std::string("(no error)");
}

// The op fronts check each op's contract once for every backend (kernels/op_contracts.h):
// the planner and the emulation reject the shapes the cpu backend rejects, with its message.
TEST(OpContracts, EveryBackendRejectsTheSameShapesWithTheSameMessage) {
  CpuBackend cpu;
  PlanningBackend planner(BackendKind::cuda, AttentionKernel::native, 1);
  std::unique_ptr<Backend> emulated = make_emulated_cuda_backend();
  auto f32 = [](Backend& backend, std::initializer_list<int64_t> dims) {
    return backend.alloc(MemCategory::activations, DType::f32, dims, "contract test");
  };
  const std::vector<std::function<void(Backend&)>> calls = {
      [&](Backend& backend) {
        Buffer a = f32(backend, {5, 7}), b = f32(backend, {6, 3}), c = f32(backend, {5, 3});
        backend.gemm(a, false, b, false, c, 1.0f, 0.0f);
      },
      [&](Backend& backend) {
        Buffer x = f32(backend, {4, 6}), weight = f32(backend, {6}), out = f32(backend, {4, 6});
        Buffer rstd = f32(backend, {3});
        backend.rmsnorm_forward(out, rstd, x, weight, 1e-5f);
      },
      [&](Backend& backend) {
        Buffer x = f32(backend, {1, 2, 1, 5});
        backend.rope(x, 0, 10000.0f, false);
      },
      [&](Backend& backend) {
        Buffer q = f32(backend, {1, 4, 3, 8}), k = f32(backend, {1, 4, 2, 8});
        Buffer out = f32(backend, {1, 4, 3, 8}), lse = f32(backend, {1, 3, 4});
        backend.attention_forward(out, lse, q, k, k);
      },
  };
  for (const auto& call : calls) {
    const std::string expected = refusal(cpu, call);
    EXPECT_NE(expected, "(no error)");
    EXPECT_EQ(refusal(planner, call), expected);
    EXPECT_EQ(refusal(*emulated, call), expected);
  }
}

// The dtype rules are the contract's too (kernels/op_dtypes.h): every backend of a kind
// refuses the same call with the same message, planned or real, and the kinds differ only in
// the float dtypes their kernels take (kernel_dtypes).
TEST(OpContracts, EveryBackendOfAKindRejectsTheSameDtypesWithTheSameMessage) {
  CpuBackend cpu;
  PlanningBackend cpu_planner(BackendKind::cpu, AttentionKernel::native, 1);
  PlanningBackend cuda_planner(BackendKind::cuda, AttentionKernel::native, 1);
  std::unique_ptr<Backend> emulated = make_emulated_cuda_backend();
  auto make = [](Backend& backend, DType dtype, std::initializer_list<int64_t> dims) {
    Buffer buffer = backend.alloc(MemCategory::activations, dtype, dims, "dtype test");
    if (!backend.memory().planning()) backend.fill_zero(buffer);
    return buffer;
  };
  struct Case {
    std::function<void(Backend&)> call;
    std::string cpu, cuda;  // the message of each kind
  };
  const DType f32 = DType::f32, bf16 = DType::bf16, i32 = DType::i32;
  const std::vector<Case> cases = {
      {[&](Backend& b) {
         Buffer a = make(b, bf16, {2, 3}), w = make(b, bf16, {3, 4}), c = make(b, bf16, {2, 4});
         b.gemm(a, false, w, false, c, 1.0f, 0.0f);
       },
       "gemm: a must be a non-empty f32 tensor on the cpu backend (got bf16 [2, 3])", "(no error)"},
      {[&](Backend& b) {
         Buffer a = make(b, f32, {2, 3}), w = make(b, bf16, {3, 4}), c = make(b, f32, {2, 4});
         b.gemm(a, false, w, false, c, 1.0f, 0.0f);
       },
       "gemm: b (bf16 [3, 4]) must have the dtype of a (f32 [2, 3])",
       "gemm: b (bf16 [3, 4]) must have the dtype of a (f32 [2, 3])"},
      {[&](Backend& b) {
         Buffer a = make(b, f32, {2, 3}), w = make(b, f32, {3, 4}), c = make(b, bf16, {2, 4});
         b.gemm(a, false, w, false, c, 1.0f, 0.0f);
       },
       "gemm: c must be a non-empty f32 tensor on the cpu backend (got bf16 [2, 4])",
       "gemm: f32 inputs a f32 [2, 3] and b f32 [3, 4] need an f32 c (got bf16 [2, 4])"},
      {[&](Backend& b) {
         Buffer x = make(b, f32, {4, 6}), w = make(b, f32, {6}), out = make(b, f32, {4, 6});
         Buffer rstd = make(b, bf16, {4});
         b.rmsnorm_forward(out, rstd, x, w, 1e-5f);
       },
       "rmsnorm_forward: rstd must be a non-empty f32 tensor (got bf16 [4])",
       "rmsnorm_forward: rstd must be a non-empty f32 tensor (got bf16 [4])"},
      {[&](Backend& b) {
         Buffer out = make(b, f32, {1, 3, 4}), tokens = make(b, f32, {1, 3});
         Buffer wte = make(b, f32, {5, 4});
         b.embedding_forward(out, tokens, wte, Tensor(), 0);
       },
       "embedding_forward: tokens must be a non-empty i32 tensor (got f32 [1, 3])",
       "embedding_forward: tokens must be a non-empty i32 tensor (got f32 [1, 3])"},
      {[&](Backend& b) {
         Buffer y = make(b, bf16, {8}), x = make(b, f32, {8});
         b.axpy(y, x, 1.0f);
       },
       "axpy: y must be a non-empty f32 tensor on the cpu backend (got bf16 [8])",
       "axpy: y bf16 [8] is bf16 but x f32 [8] is f32 (supported: same dtypes, or f32 y with "
       "bf16 x)"},
      {[&](Backend& b) {
         Buffer x = make(b, i32, {8});
         b.sum_squares(x);
       },
       "sum_squares: x must be a non-empty f32 tensor on the cpu backend (got i32 [8])",
       "sum_squares: x must be a non-empty f32 or bf16 tensor on the cuda backend (got i32 [8])"},
      {[&](Backend& b) {
         Buffer q = make(b, f32, {1, 4, 2, 8}), out = make(b, f32, {1, 4, 2, 8});
         Buffer lse = make(b, f32, {1, 2, 4});
         b.attention_forward(out, lse, q, q, q);
       },
       "(no error)",
       "attention_forward: q must be a non-empty bf16 tensor on the cuda backend (got f32 [1, 4, "
       "2, 8])"},
      {[&](Backend& b) {
         Buffer p = make(b, f32, {8}), g = make(b, f32, {8}), m = make(b, bf16, {8});
         Buffer v = make(b, f32, {8});
         b.adamw(p, g, m, v, AdamWStep{});
       },
       "adamw: m must be a non-empty f32 tensor (got bf16 [8])",
       "adamw: m must be a non-empty f32 tensor (got bf16 [8])"},
  };
  for (const Case& each : cases) {
    EXPECT_EQ(refusal(cpu, each.call), each.cpu);
    EXPECT_EQ(refusal(cpu_planner, each.call), each.cpu);
    EXPECT_EQ(refusal(cuda_planner, each.call), each.cuda);
    EXPECT_EQ(refusal(*emulated, each.call), each.cuda);
  }
}

// Outputs that the op needs apart from its inputs are refused when they share memory, by
// every backend with real buffers, with one message; what the interface allows (dx on dout
// in the norm backward) still runs.
TEST(OpContracts, OutputsThatShareMemoryWithTheirInputsAreRefused) {
  CpuBackend cpu;
  std::unique_ptr<Backend> emulated = make_emulated_cuda_backend();
  for (Backend* backend : {static_cast<Backend*>(&cpu), emulated.get()}) {
    SCOPED_TRACE(backend->name());
    Buffer a = backend->alloc(MemCategory::activations, DType::f32, {4, 4}, "a");
    Buffer b = backend->alloc(MemCategory::activations, DType::f32, {4, 4}, "b");
    backend->fill_zero(a);
    backend->fill_zero(b);
    try {
      backend->gemm(a, false, b, false, a.tensor(), 1.0f, 0.0f);
      ADD_FAILURE() << "gemm wrote c over a";
    } catch (const std::invalid_argument& error) {
      EXPECT_STREQ(error.what(),
                   "gemm: c [4, 4] shares memory with a [4, 4]; the op needs them apart");
    }
    // A view that overlaps only in part is refused too: lse over the first bytes of q, in
    // tensors of the dtypes attention takes, so that only the overlap is wrong.
    const DType element = backend->kind() == BackendKind::cpu ? DType::f32 : DType::bf16;
    Buffer out = backend->alloc(MemCategory::activations, element, {1, 4, 1, 4}, "out");
    Buffer qkv = backend->alloc(MemCategory::activations, element, {1, 4, 1, 4}, "qkv");
    try {
      backend->attention_forward(out, Tensor(qkv.tensor().data, DType::f32, {1, 1, 4}), qkv, qkv,
                                 qkv);
      ADD_FAILURE() << "attention wrote lse over q";
    } catch (const std::invalid_argument& error) {
      EXPECT_STREQ(error.what(),
                   "attention_forward: lse [1, 1, 4] shares memory with q [1, 4, 1, 4]; the op "
                   "needs them apart");
    }
    Buffer x = backend->alloc(MemCategory::activations, DType::f32, {4, 4}, "x");
    Buffer weight = backend->alloc(MemCategory::activations, DType::f32, {4}, "weight");
    Buffer rstd = backend->alloc(MemCategory::activations, DType::f32, {4}, "rstd");
    Buffer dweight = backend->alloc(MemCategory::activations, DType::f32, {4}, "dweight");
    for (Buffer* buffer : {&x, &weight, &rstd, &dweight}) backend->fill_zero(*buffer);
    EXPECT_NO_THROW(backend->rmsnorm_backward(a, dweight, a, x, weight, rstd));
    EXPECT_THROW(backend->rmsnorm_backward(x, dweight, a, x, weight, rstd), std::invalid_argument);
  }
}

}  // namespace
}  // namespace ulysses
