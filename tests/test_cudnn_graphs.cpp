// The cuDNN attention graphs (kernels.attention: cudnn) without a GPU: every tensor and
// operation descriptor of the forward and backward graphs finalizes, and so does each whole
// operation graph (without a handle), which is where cuDNN checks that dims, strides and types
// fit together. Whether an engine takes the graph needs a GPU: tests/test_cuda_ops.cpp and
// tests/test_cuda_training.cpp check that there.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cudnn_attention_graphs.h"

namespace ulysses::cudnn {
namespace {

struct Case {
  const char* name;
  AttentionShape shape;
};

const Case kCases[] = {
    {"one head per kv head", {2, 150, 4, 4, 64}},
    {"GQA 4 on 2", {2, 150, 4, 2, 128}},
    {"GQA 8 on 1, one sequence", {1, 4096, 8, 1, 96}},
};

TEST(CudnnAttentionGraphs, ForwardOperationsFinalize) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    GraphBuilder builder(nullptr);
    ASSERT_NO_THROW(add_attention_forward(builder, c.shape));
    // Q·Kᵀ, scale, the causal mask (2 indices, compare, select), the softmax with its
    // statistics (max, sub, exp, sum, log, add, div), ·V.
    EXPECT_EQ(builder.operation_count(), 14u);
    EXPECT_NO_THROW(builder.finalize_graph("forward"));
  }
}

TEST(CudnnAttentionGraphs, BackwardOperationsFinalizeInBothVariants) {
  for (const Case& c : kCases) {
    for (bool deterministic : {true, false}) {
      SCOPED_TRACE(std::string(c.name) + (deterministic ? ", deterministic" : ", accumulating"));
      GraphBuilder builder(nullptr);
      ASSERT_NO_THROW(add_attention_backward(builder, c.shape, deterministic));
      // rowsum(dO∘O) 3, P 8, dV 2, dS 4, dK 2, K view 1, dQ 1 (+ the cast when accumulating),
      // and per-q-head dK and dV summed over each kv head's group under GQA.
      const size_t grouped = c.shape.q_heads != c.shape.kv_heads ? 2 : 0;
      EXPECT_EQ(builder.operation_count(), 21u + (deterministic ? 0 : 1) + grouped);
      EXPECT_NO_THROW(builder.finalize_graph("backward"));
    }
  }
}

// A block of ring attention whose keys all precede its queries: the same graphs without the
// causal mask's four operations (2 indices, compare, select).
TEST(CudnnAttentionGraphs, WithoutTheCausalMaskBothGraphsFinalize) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    AttentionShape shape = c.shape;
    shape.causal = false;
    GraphBuilder forward(nullptr);
    ASSERT_NO_THROW(add_attention_forward(forward, shape));
    EXPECT_EQ(forward.operation_count(), 10u);
    EXPECT_NO_THROW(forward.finalize_graph("forward"));
    GraphBuilder backward(nullptr);
    ASSERT_NO_THROW(add_attention_backward(backward, shape, true));
    const size_t grouped = shape.q_heads != shape.kv_heads ? 2 : 0;
    EXPECT_EQ(backward.operation_count(), 17u + grouped);
    EXPECT_NO_THROW(backward.finalize_graph("backward"));
  }
}

}  // namespace
}  // namespace ulysses::cudnn
