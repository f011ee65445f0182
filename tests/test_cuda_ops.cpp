// Every op of the cuda backend against the cpu backend (the fp32 reference) on random inputs.
// Inputs are rounded to bf16 on the host first, so both backends see the same values and
// the differences come only from bf16 outputs and fp32 summation order. Tolerances are
// max |cuda − cpu| / max |cpu| per tensor, stated per op below. Without a usable GPU (or
// without the CUDA backend in this build) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "testing.h"

namespace ulysses {
namespace {

using testing::cuda_backend_or_reason;

// bf16 outputs carry 8 significant bits: one rounding is 2^-9 relative.
constexpr double kBf16Output = 1e-2;
// fp32 outputs of bf16 inputs: only the summation order differs.
constexpr double kF32Output = 1e-4;
// Attention and the loss chain several bf16 roundings (P, dS, dlogits).
constexpr double kAttention = 3e-2;
constexpr double kLossGrad = 3e-2;

float round_to_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

std::vector<float> random_values(size_t count, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = round_to_bf16(uniform(engine));
  return values;
}

double relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double max_error = 0.0, max_expected = 0.0;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    max_error = std::max(max_error, std::abs(double(actual[i]) - double(expected[i])));
    max_expected = std::max(max_expected, std::abs(double(expected[i])));
  }
  return max_error / std::max(max_expected, 1e-30);
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    gpu_ = cuda_backend_or_reason(reason);
    if (!gpu_) GTEST_SKIP() << reason;
    cpu_ = make_backend(BackendKind::cpu, 0);
  }

  // The same values as an f32 tensor on the cpu and a `dtype` tensor on the gpu.
  struct Pair {
    Buffer cpu, gpu;
  };
  Pair make(std::initializer_list<int64_t> dims, const std::vector<float>& values,
            DType gpu_dtype = DType::bf16) {
    Pair pair{cpu_->alloc(MemCategory::activations, DType::f32, dims, "cpu"),
              gpu_->alloc(MemCategory::activations, gpu_dtype, dims, "gpu")};
    cpu_->upload(pair.cpu, values.data());
    Buffer staging = gpu_->alloc(MemCategory::workspace, DType::f32, dims, "staging");
    gpu_->upload(staging, values.data());
    gpu_->cast(pair.gpu, staging);
    return pair;
  }
  Pair make_ids(std::initializer_list<int64_t> dims, const std::vector<int32_t>& values) {
    Pair pair{cpu_->alloc(MemCategory::activations, DType::i32, dims, "cpu ids"),
              gpu_->alloc(MemCategory::activations, DType::i32, dims, "gpu ids")};
    cpu_->upload(pair.cpu, values.data());
    gpu_->upload(pair.gpu, values.data());
    return pair;
  }
  std::vector<float> read_cpu(const Tensor& t) {
    std::vector<float> values(size_t(t.numel()));
    cpu_->download(values.data(), t);
    return values;
  }
  std::vector<float> read_gpu(const Tensor& t) {
    Buffer staging = gpu_->alloc(MemCategory::workspace, DType::f32, {t.numel()}, "staging");
    gpu_->cast(staging, t.reshape({t.numel()}));
    std::vector<float> values(size_t(t.numel()));
    gpu_->download(values.data(), staging);
    return values;
  }
  double error(const Pair& pair) { return relative_error(read_gpu(pair.gpu), read_cpu(pair.cpu)); }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaOps, CastRoundTripsBf16Values) {
  std::vector<float> values = random_values(1000, 1);
  Pair x = make({1000}, values);
  EXPECT_EQ(read_gpu(x.gpu), values);  // exact: the values are bf16 already
}

TEST_F(CudaOps, GemmAllTransposesBf16AndF32Outputs) {
  const int64_t M = 37, N = 50, K = 70;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      Pair a =
          trans_a ? make({K, M}, random_values(K * M, 2)) : make({M, K}, random_values(M * K, 2));
      Pair b =
          trans_b ? make({N, K}, random_values(N * K, 3)) : make({K, N}, random_values(K * N, 3));
      // bf16 c, overwritten; f32 c accumulated with beta = 1 (the weight-gradient case).
      Pair c16 = make({M, N}, random_values(M * N, 4));
      Pair c32 = make({M, N}, random_values(M * N, 5), DType::f32);
      cpu_->gemm(a.cpu, trans_a, b.cpu, trans_b, c16.cpu, 1.0f, 0.0f);
      gpu_->gemm(a.gpu, trans_a, b.gpu, trans_b, c16.gpu, 1.0f, 0.0f);
      cpu_->gemm(a.cpu, trans_a, b.cpu, trans_b, c32.cpu, 0.5f, 1.0f);
      gpu_->gemm(a.gpu, trans_a, b.gpu, trans_b, c32.gpu, 0.5f, 1.0f);
      EXPECT_LT(error(c16), kBf16Output) << trans_a << trans_b;
      EXPECT_LT(error(c32), kF32Output) << trans_a << trans_b;
    }
  }
}

TEST_F(CudaOps, GemmRejectsMixedInputDtypes) {
  Pair a = make({4, 4}, random_values(16, 1));
  Pair b = make({4, 4}, random_values(16, 2), DType::f32);
  EXPECT_THROW(gpu_->gemm(a.gpu, false, b.gpu, false, a.gpu, 1.0f, 0.0f), std::invalid_argument);
}

TEST_F(CudaOps, ElementwiseAndSumSquares) {
  const int64_t n = 100003;
  Pair y = make({n}, random_values(n, 1), DType::f32);
  Pair x = make({n}, random_values(n, 2), DType::f32);
  cpu_->axpy(y.cpu, x.cpu, 0.3f);
  gpu_->axpy(y.gpu, x.gpu, 0.3f);
  cpu_->scale(y.cpu, -1.5f);
  gpu_->scale(y.gpu, -1.5f);
  // nvcc contracts y + alpha * x into one FMA, the cpu rounds the product first: y may differ
  // in its last bit, so y is compared with the cpu's and the sum with y's own exact sum.
  EXPECT_LT(error(y), 1e-6);
  // A float's square is exact in double (48 of 53 bits), so the only rounding is in the
  // additions: the kernel's tree of about log2(n) levels loses at most ~17 ulps of double
  // (4e-15 relative) against the host's extended-precision sum of the same values.
  long double expected = 0.0L;
  for (float value : read_gpu(y.gpu)) expected += (long double)value * value;
  const double sum = gpu_->sum_squares(y.gpu);
  EXPECT_NEAR(sum, double(expected), 1e-12 * double(expected));
  EXPECT_EQ(gpu_->sum_squares(y.gpu), sum);  // deterministic
}

TEST_F(CudaOps, BiasForwardAndBackward) {
  const int64_t R = 300, N = 70;
  Pair out = make({R, N}, random_values(R * N, 1));
  Pair bias = make({N}, random_values(N, 2));
  cpu_->bias_forward(out.cpu, bias.cpu);
  gpu_->bias_forward(out.gpu, bias.gpu);
  EXPECT_LT(error(out), kBf16Output);
  Pair dbias = make({N}, random_values(N, 3), DType::f32);
  cpu_->bias_backward(dbias.cpu, out.cpu);
  gpu_->bias_backward(dbias.gpu, out.gpu);
  EXPECT_LT(error(dbias), 1e-3);  // out itself differs by bf16 rounding
}

TEST_F(CudaOps, EmbeddingForwardAndDeterministicBackward) {
  const int64_t B = 2, T = 33, V = 17, C = 40, maxT = 64, offset = 5;
  std::vector<int32_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7) % V);
  Pair tokens = make_ids({B, T}, ids);
  Pair wte = make({V, C}, random_values(V * C, 1));
  Pair wpe = make({maxT, C}, random_values(maxT * C, 2));
  Pair out = make({B, T, C}, std::vector<float>(size_t(B * T * C)));
  cpu_->embedding_forward(out.cpu, tokens.cpu, wte.cpu, wpe.cpu, offset);
  gpu_->embedding_forward(out.gpu, tokens.gpu, wte.gpu, wpe.gpu, offset);
  EXPECT_LT(error(out), kBf16Output);

  Pair dout = make({B, T, C}, random_values(B * T * C, 3));
  Pair dwte = make({V, C}, random_values(V * C, 4), DType::f32);
  Pair dwpe = make({maxT, C}, random_values(maxT * C, 5), DType::f32);
  cpu_->embedding_backward(dwte.cpu, dwpe.cpu, dout.cpu, tokens.cpu, offset);
  gpu_->embedding_backward(dwte.gpu, dwpe.gpu, dout.gpu, tokens.gpu, offset);
  EXPECT_LT(error(dwte), kF32Output);
  EXPECT_LT(error(dwpe), kF32Output);

  std::vector<int32_t> bad = ids;
  bad[3] = int32_t(V);
  Pair bad_tokens = make_ids({B, T}, bad);
  EXPECT_THROW(gpu_->embedding_forward(out.gpu, bad_tokens.gpu, wte.gpu, wpe.gpu, offset),
               std::out_of_range);
}

TEST_F(CudaOps, RmsNormForwardAndBackward) {
  const int64_t R = 65, C = 300;
  Pair x = make({R, C}, random_values(R * C, 1, 2.0f));
  Pair w = make({C}, random_values(C, 2));
  Pair out = make({R, C}, std::vector<float>(size_t(R * C)));
  Pair rstd = make({R}, std::vector<float>(size_t(R)), DType::f32);
  cpu_->rmsnorm_forward(out.cpu, rstd.cpu, x.cpu, w.cpu, 1e-5f);
  gpu_->rmsnorm_forward(out.gpu, rstd.gpu, x.gpu, w.gpu, 1e-5f);
  EXPECT_LT(error(out), kBf16Output);
  EXPECT_LT(error(rstd), 1e-5);

  Pair dout = make({R, C}, random_values(R * C, 3));
  Pair dx = make({R, C}, random_values(R * C, 4));
  Pair dw = make({C}, random_values(C, 5), DType::f32);
  cpu_->rmsnorm_backward(dx.cpu, dw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu);
  gpu_->rmsnorm_backward(dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu);
  EXPECT_LT(error(dx), kBf16Output);
  EXPECT_LT(error(dw), 1e-4);

  // dx may be dout's buffer: the weight gradient still sees the incoming gradient.
  cpu_->rmsnorm_backward(dout.cpu, dw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu);
  gpu_->rmsnorm_backward(dout.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu);
  EXPECT_LT(error(dout), kBf16Output);
  EXPECT_LT(error(dw), 1e-4);
}

TEST_F(CudaOps, LayerNormForwardAndBackward) {
  const int64_t R = 70, C = 96;
  Pair x = make({R, C}, random_values(R * C, 1, 2.0f));
  Pair w = make({C}, random_values(C, 2));
  Pair b = make({C}, random_values(C, 3));
  Pair out = make({R, C}, std::vector<float>(size_t(R * C)));
  Pair mean = make({R}, std::vector<float>(size_t(R)), DType::f32);
  Pair rstd = make({R}, std::vector<float>(size_t(R)), DType::f32);
  cpu_->layernorm_forward(out.cpu, mean.cpu, rstd.cpu, x.cpu, w.cpu, b.cpu, 1e-5f);
  gpu_->layernorm_forward(out.gpu, mean.gpu, rstd.gpu, x.gpu, w.gpu, b.gpu, 1e-5f);
  EXPECT_LT(error(out), kBf16Output);
  EXPECT_LT(error(mean), 1e-5);
  EXPECT_LT(error(rstd), 1e-5);

  Pair dout = make({R, C}, random_values(R * C, 4));
  Pair dx = make({R, C}, std::vector<float>(size_t(R * C)));
  Pair dw = make({C}, std::vector<float>(size_t(C)), DType::f32);
  Pair db = make({C}, std::vector<float>(size_t(C)), DType::f32);
  cpu_->layernorm_backward(dx.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, mean.cpu, rstd.cpu);
  gpu_->layernorm_backward(dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu);
  EXPECT_LT(error(dx), kBf16Output);
  EXPECT_LT(error(dw), 1e-4);
  EXPECT_LT(error(db), 1e-5);

  // dx may be dout's buffer.
  cpu_->layernorm_backward(dout.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, mean.cpu, rstd.cpu);
  gpu_->layernorm_backward(dout.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu);
  EXPECT_LT(error(dout), kBf16Output);
  EXPECT_LT(error(dw), 1e-4);
  EXPECT_LT(error(db), 1e-5);
}

TEST_F(CudaOps, RopeAtPositionsInTheMillions) {
  const int64_t B = 2, T = 20, H = 3, d = 64;
  for (int64_t offset : {int64_t(0), int64_t(3'000'000)}) {
    Pair x = make({B, T, H, d}, random_values(B * T * H * d, 1));
    cpu_->rope(x.cpu, offset, 500000.0f, false);
    gpu_->rope(x.gpu, offset, 500000.0f, false);
    EXPECT_LT(error(x), kBf16Output) << offset;
    cpu_->rope(x.cpu, offset, 500000.0f, true);
    gpu_->rope(x.gpu, offset, 500000.0f, true);
    EXPECT_LT(error(x), kBf16Output) << offset;
  }
}

TEST_F(CudaOps, SwigluAndGeluWithAliasedGradients) {
  const int64_t n = 5000;
  Pair gate = make({n}, random_values(n, 1, 4.0f));
  Pair up = make({n}, random_values(n, 2, 2.0f));
  Pair out = make({n}, std::vector<float>(size_t(n)));
  cpu_->swiglu_forward(out.cpu, gate.cpu, up.cpu);
  gpu_->swiglu_forward(out.gpu, gate.gpu, up.gpu);
  EXPECT_LT(error(out), kBf16Output);
  // dout is the memory of dup, as in the model.
  Pair dgate = make({n}, std::vector<float>(size_t(n)));
  Pair dup = make({n}, random_values(n, 3));
  cpu_->swiglu_backward(dgate.cpu, dup.cpu, dup.cpu, gate.cpu, up.cpu);
  gpu_->swiglu_backward(dgate.gpu, dup.gpu, dup.gpu, gate.gpu, up.gpu);
  EXPECT_LT(error(dgate), kBf16Output);
  EXPECT_LT(error(dup), kBf16Output);

  cpu_->gelu_forward(out.cpu, gate.cpu);
  gpu_->gelu_forward(out.gpu, gate.gpu);
  EXPECT_LT(error(out), kBf16Output);
  Pair dx = make({n}, random_values(n, 4));
  cpu_->gelu_backward(dx.cpu, dx.cpu, gate.cpu);
  gpu_->gelu_backward(dx.gpu, dx.gpu, gate.gpu);
  EXPECT_LT(error(dx), kBf16Output);
}

// kernels.attention: native (the hand-written kernels) or cudnn (cuDNN's fused engines), by
// head dim. Both are held to the same tolerances and to determinism.
class CudaAttention : public CudaOps,
                      public ::testing::WithParamInterface<std::tuple<int64_t, AttentionKernel>> {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (!IsSkipped() && std::get<1>(GetParam()) != AttentionKernel::native)
      gpu_ = make_backend(BackendKind::cuda, 0, std::get<1>(GetParam()));
  }
};

// T = 150 is not a multiple of the 64-row tiles; 4 q heads share 2 kv heads (GQA).
TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  const int64_t B = 2, T = 150, Hq = 4, Hkv = 2, d = std::get<0>(GetParam());
  Pair q = make({B, T, Hq, d}, random_values(B * T * Hq * d, 1, 2.0f));
  Pair k = make({B, T, Hkv, d}, random_values(B * T * Hkv * d, 2, 2.0f));
  Pair v = make({B, T, Hkv, d}, random_values(B * T * Hkv * d, 3));
  Pair out = make({B, T, Hq, d}, std::vector<float>(size_t(B * T * Hq * d)));
  Pair lse = make({B, Hq, T}, std::vector<float>(size_t(B * Hq * T)), DType::f32);
  cpu_->attention_forward(out.cpu, lse.cpu, q.cpu, k.cpu, v.cpu);
  gpu_->attention_forward(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu);
  EXPECT_LT(error(out), kAttention);
  EXPECT_LT(error(lse), 1e-3);

  // Both backends' backward read the gpu's (bf16) out, so only the backward differs.
  Pair out_used = make({B, T, Hq, d}, read_gpu(out.gpu));
  Pair lse_used = make({B, Hq, T}, read_gpu(lse.gpu), DType::f32);
  Pair dout = make({B, T, Hq, d}, random_values(B * T * Hq * d, 4));
  Pair dq = make({B, T, Hq, d}, std::vector<float>(size_t(B * T * Hq * d)));
  Pair dk = make({B, T, Hkv, d}, std::vector<float>(size_t(B * T * Hkv * d)));
  Pair dv = make({B, T, Hkv, d}, std::vector<float>(size_t(B * T * Hkv * d)));
  cpu_->attention_backward(dq.cpu, dk.cpu, dv.cpu, dout.cpu, q.cpu, k.cpu, v.cpu, out_used.cpu,
                           lse_used.cpu);
  gpu_->attention_backward(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_used.gpu,
                           lse_used.gpu);
  EXPECT_LT(error(dq), kAttention);
  EXPECT_LT(error(dk), kAttention);
  EXPECT_LT(error(dv), kAttention);

  // Deterministic: a second backward gives the same bits.
  std::vector<float> first = read_gpu(dk.gpu);
  gpu_->attention_backward(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_used.gpu,
                           lse_used.gpu);
  EXPECT_EQ(read_gpu(dk.gpu), first);
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndHeadDims, CudaAttention,
    ::testing::Combine(::testing::Values(int64_t(64), int64_t(96), int64_t(128)),
                       ::testing::Values(AttentionKernel::native, AttentionKernel::cudnn)),
    [](const ::testing::TestParamInfo<std::tuple<int64_t, AttentionKernel>>& info) {
      return std::string(std::get<1>(info.param) == AttentionKernel::cudnn ? "cudnn" : "native") +
             "_d" + std::to_string(std::get<0>(info.param));
    });

TEST_F(CudaOps, LmHeadLossOverTiles) {
  const int64_t R = 50, C = 64, V = 1000, tile = 16;
  Pair hidden = make({R, C}, random_values(R * C, 1, 2.0f));
  Pair weight = make({V, C}, random_values(V * C, 2, 0.5f));
  std::vector<int32_t> targets(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) targets[size_t(r)] = r % 7 == 3 ? -1 : int32_t((r * 37) % V);
  Pair target_ids = make_ids({R}, targets);
  Pair dhidden = make({R, C}, random_values(R * C, 3));
  Pair dweight = make({V, C}, random_values(V * C, 4), DType::f32);
  const float grad_scale = 0.02f;
  LossResult expected = cpu_->lm_head_loss(hidden.cpu, weight.cpu, target_ids.cpu, tile, grad_scale,
                                           dhidden.cpu, dweight.cpu);
  LossResult actual = gpu_->lm_head_loss(hidden.gpu, weight.gpu, target_ids.gpu, tile, grad_scale,
                                         dhidden.gpu, dweight.gpu);
  EXPECT_EQ(actual.count, expected.count);
  EXPECT_NEAR(actual.loss_sum, expected.loss_sum, 1e-3 * std::abs(expected.loss_sum));
  EXPECT_NEAR(double(actual.correct), double(expected.correct), 2.0);  // near-ties may flip
  EXPECT_LT(error(dhidden), kLossGrad);
  EXPECT_LT(error(dweight), kLossGrad);

  LossResult eval =
      gpu_->lm_head_loss(hidden.gpu, weight.gpu, target_ids.gpu, tile, 1.0f, Tensor(), Tensor());
  EXPECT_EQ(eval.loss_sum, actual.loss_sum);
}

TEST_F(CudaOps, AdamWMatchesCpu) {
  const int64_t n = 4097;
  Pair p = make({n}, random_values(n, 1), DType::f32);
  Pair g = make({n}, random_values(n, 2), DType::f32);
  Pair m = make({n}, random_values(n, 3, 0.1f), DType::f32);
  Pair v = make({n}, std::vector<float>(size_t(n), 0.01f), DType::f32);
  AdamWStep step;
  step.lr = 1e-2f;
  step.weight_decay = 0.1f;
  step.step = 3;
  step.grad_scale = 0.7f;
  for (int i = 0; i < 3; ++i) {
    cpu_->adamw(p.cpu, g.cpu, m.cpu, v.cpu, step);
    gpu_->adamw(p.gpu, g.gpu, m.gpu, v.gpu, step);
    ++step.step;
  }
  EXPECT_LT(error(p), 1e-6);
  EXPECT_LT(error(m), 1e-6);
  EXPECT_LT(error(v), 1e-6);
}

TEST_F(CudaOps, TooLargeAllocationNamesTheCategories) {
  const int64_t limit = gpu_->memory().limit();
  ASSERT_GT(limit, 0);  // an automatic limit: the device's free memory
  EXPECT_THROW(gpu_->alloc(MemCategory::activations, DType::f32, {limit / 4 + 1024}, "too big"),
               OutOfMemoryError);
}

// The device track (docs/profiling.md): phases as the stream ran them, nested as the host
// opened them, and each at least as long as the gemms it enqueued take on the device.
TEST_F(CudaOps, TraceHasTheDeviceStreamsSpans) {
  const int64_t n = 1024;
  Pair a = make({n, n}, random_values(n * n, 1));
  Pair c = make({n, n}, random_values(n * n, 2));
  Profiler& profiler = gpu_->profiler();
  profiler.set_device_timing(true);
  profiler.set_trace(true);
  profiler.reset_origin();
  {
    Profiler::Scope outer(profiler, "outer");
    for (int i = 0; i < 4; ++i) {
      Profiler::Scope inner(profiler, "inner");
      gpu_->gemm(a.gpu, false, a.gpu, true, c.gpu, 1.0f, 0.0f);
    }
  }
  const std::vector<TraceSpan> spans = profiler.take_trace();
  profiler.set_trace(false);
  std::vector<TraceSpan> device;
  for (const TraceSpan& span : spans)
    if (span.track == Profiler::kDeviceTrack) device.push_back(span);
  ASSERT_EQ(device.size(), 5u);
  const TraceSpan& outer = device.back();
  EXPECT_EQ(outer.name, "outer");
  double previous_end = 0.0;
  for (size_t i = 0; i + 1 < device.size(); ++i) {
    EXPECT_EQ(device[i].name, "inner");
    EXPECT_GT(device[i].duration_us, 0.0);
    EXPECT_GE(device[i].begin_us, previous_end);
    previous_end = device[i].begin_us + device[i].duration_us;
    EXPECT_GE(device[i].begin_us, outer.begin_us);
    EXPECT_LE(previous_end, outer.begin_us + outer.duration_us + 1e-3);
  }
}

}  // namespace
}  // namespace ulysses
