// The native CUDA attention kernels, executed on the host thread by thread
// (tests/cuda_emulation.h) against causal attention in double on the same bf16 inputs: the
// tensor-core kernels (kernels/cuda/cuda_attention_mma.cuh: mma.sync, ldmatrix and cp.async
// emulated with the PTX ISA's fragment layouts and group semantics) and the FMA kernels
// (kernels/cuda/cuda_attention_kernels.cuh) that remain for other head dims. This runs the GPU
// code's indexing, fragment layouts, pipeline, tile edges, barriers and warp shuffles on every
// machine; the GPU tests (tests/test_cuda_ops.cpp) check it on the device itself.
//
// Mutation checks: each change below was made in the kernel header, this test run, and the
// change reverted; every one failed the tests named (TensorCores = the
// MatchesCausalAttentionInDouble cases of TensorCores/, Fma = of Fma/, "documents" = the cases
// with packed documents; Interface = EitherForwardFeedsEitherBackward).
//   cuda_attention_mma.cuh   a wrong fragment index: fragment_row with 8·(i % 2) instead of
//                            8·(i / 2): every TensorCores case, Interface and
//                            LdmatrixAndMmaComputeAMatrixProduct
//   cuda_attention_mma.cuh   warp_tile_pb with P's A registers 1 and 2 swapped: every
//                            TensorCores case but T1 (one key: the swapped halves are zero),
//                            Interface
//   cuda_attention_mma.cuh   stream_key_tiles (forward and dQ) without its cp_async_wait<1>
//                            (a missing cp.async.wait_group): every TensorCores case,
//                            Interface
//   cuda_attention_mma.cuh   a loop without its last __syncthreads: forward or dQ, the cases
//                            with three key tiles or more (T 130 d 64, T 200 d 128); dK/dV,
//                            four TensorCores cases and Interface; stream_key_tiles without
//                            its own: every TensorCores case, Interface. Stopped by the
//                            emulation's hazard checks (test_cuda_emulation_hazards.cpp);
//                            before them, dropping the forward's passed
//   cuda_attention_mask.cuh  an unmasked causal tile: tiles_fully_visible taking k_first <=
//                            q_first for k_last <= q_first (the diagonal tile counted wholly
//                            visible): every TensorCores case, Interface
//   cuda_attention_mask.cuh  key_visible without key >= query_start: the three documents cases
//                            (both kinds)
//   cuda_attention_mask.cuh  document_end one short (the next start − 1): TensorCores
//                            B2_T130_Hq1_Hkv1_d64_documents (a document ending one row into
//                            the next tile)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_emulation.h"
// After the emulation, which provides the device environment.
#include "kernels/backend.h"
#include "kernels/cuda/cuda_attention_kernels.cuh"
#include "kernels/cuda/cuda_attention_mma.cuh"

namespace ulysses {
namespace {

using cuda::bf16;
using cuda::emulation::launch;
using namespace cuda_attention;

// bf16 outputs: a few roundings of 2^-9 relative, as in tests/test_cuda_ops.cpp.
constexpr double kTolerance = 3e-2;
constexpr double kLseTolerance = 1e-5;

struct Shape {
  int64_t batch, seq;
  int q_heads, kv_heads, dim;
  // Packed documents (kernels/documents.h): each sequence's starts; empty: none.
  std::vector<std::vector<int64_t>> starts = {};
};

std::string describe(const Shape& s) {
  std::string text = "B " + std::to_string(s.batch) + " T " + std::to_string(s.seq) + " Hq " +
                     std::to_string(s.q_heads) + " Hkv " + std::to_string(s.kv_heads) + " d " +
                     std::to_string(s.dim);
  for (const std::vector<int64_t>& starts : s.starts) {
    text += " starts";
    for (int64_t start : starts) text += " " + std::to_string(start);
  }
  return text;
}

// The start of the document that holds query t of sequence b (0 without documents).
int64_t reference_document_start(const Shape& s, int64_t b, int64_t t) {
  return s.starts.empty() ? 0 : document_start(s.starts[size_t(b)], t);
}

std::vector<bf16> random_bf16(size_t count, uint32_t seed, float scale) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<bf16> values(count);
  for (bf16& value : values) value = __float2bfloat16_rn(normal(engine));
  return values;
}

double value(bf16 x) {
  return __bfloat162float(x);
}
double value(float x) {
  return x;
}

// max |actual − expected| / max |expected|, with the denominator at least 1: the inputs are
// O(1), and gradients that are exactly zero (a single token) get the same absolute bound.
template <typename T>
double relative_error(const std::vector<T>& actual, const std::vector<double>& expected) {
  double max_error = 0.0, max_expected = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double error = std::abs(value(actual[i]) - expected[i]);
    max_error = std::isnan(error) ? INFINITY : std::max(max_error, error);
    max_expected = std::max(max_expected, std::abs(expected[i]));
  }
  return max_error / std::max(max_expected, 1.0);
}

struct Expected {
  std::vector<double> out, lse, dq, dk, dv;
};

// Causal softmax(q·kᵀ/√d)·v, each query seeing only its own document's keys, and its gradients
// for the loss Σ dout ∘ out, in double.
Expected reference(const Shape& s, const std::vector<bf16>& q, const std::vector<bf16>& k,
                   const std::vector<bf16>& v, const std::vector<bf16>& dout) {
  const int64_t T = s.seq, d = s.dim, group = s.q_heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(double(d));
  Expected e{std::vector<double>(q.size()), std::vector<double>(size_t(s.batch * s.q_heads * T)),
             std::vector<double>(q.size()), std::vector<double>(k.size()),
             std::vector<double>(k.size())};
  auto q_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * s.q_heads + h) * d; };
  auto kv_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * s.kv_heads + h) * d; };
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t first = reference_document_start(s, b, i);
        std::vector<double> scores(size_t(i + 1), -INFINITY);
        double max_score = -INFINITY;
        for (int64_t j = first; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += value(q[q_at(b, i, h) + c]) * value(k[kv_at(b, j, kv) + c]);
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (double score : scores) sum += std::exp(score - max_score);
        const double lse = max_score + std::log(sum);
        e.lse[size_t((b * s.q_heads + h) * T + i)] = lse;
        double row_dot = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = first; j <= i; ++j)
            o += std::exp(scores[j] - lse) * value(v[kv_at(b, j, kv) + c]);
          e.out[q_at(b, i, h) + c] = o;
          row_dot += o * value(dout[q_at(b, i, h) + c]);
        }
        for (int64_t j = first; j <= i; ++j) {
          const double p = std::exp(scores[j] - lse);
          double dp = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dp += value(dout[q_at(b, i, h) + c]) * value(v[kv_at(b, j, kv) + c]);
          const double ds = p * (dp - row_dot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            e.dq[q_at(b, i, h) + c] += ds * value(k[kv_at(b, j, kv) + c]);
            e.dk[kv_at(b, j, kv) + c] += ds * value(q[q_at(b, i, h) + c]);
            e.dv[kv_at(b, j, kv) + c] += p * value(dout[q_at(b, i, h) + c]);
          }
        }
      }
    }
  return e;
}

enum class Kernels { fma, tensor_cores };

struct Inputs {
  Shape shape;
  std::vector<bf16> q, k, v, dout;
};

Inputs random_inputs(const Shape& s) {
  const size_t q_count = size_t(s.batch * s.seq * s.q_heads * s.dim);
  const size_t kv_count = size_t(s.batch * s.seq * s.kv_heads * s.dim);
  return {s, random_bf16(q_count, 1, 1.5f), random_bf16(kv_count, 2, 1.5f),
          random_bf16(kv_count, 3, 1.0f), random_bf16(q_count, 4, 1.0f)};
}

// Everything left unwritten is NaN, so that it fails the comparison.
struct Outputs {
  std::vector<bf16> out, dq, dk, dv;
  std::vector<float> lse;
  explicit Outputs(const Shape& s) {
    const bf16 nan = __float2bfloat16_rn(NAN);
    const size_t q_count = size_t(s.batch * s.seq * s.q_heads * s.dim);
    const size_t kv_count = size_t(s.batch * s.seq * s.kv_heads * s.dim);
    out.assign(q_count, nan);
    dq.assign(q_count, nan);
    dk.assign(kv_count, nan);
    dv.assign(kv_count, nan);
    lse.assign(size_t(s.batch * s.q_heads * s.seq), NAN);
  }
};

AttentionDims dims_of(const Shape& s) {
  return {s.seq, s.q_heads, s.kv_heads, s.dim, float(1.0 / std::sqrt(double(s.dim)))};
}

// The documents as the kernels take them (kernels/cuda/cuda_attention_mask.cuh); words holds
// the array the mask points into.
AttentionMask mask_of(const Shape& s, std::vector<int32_t>& words) {
  words = document_mask_words(Documents{s.starts});
  return attention_mask_at(words.empty() ? nullptr : words.data());
}

// The forward kernels with the launch shapes of kernels/cuda/cuda_attention.cu.
template <int kDim>
void run_forward(Kernels kernels, const Inputs& in, Outputs& o) {
  const AttentionDims dims = dims_of(in.shape);
  std::vector<int32_t> words;
  const AttentionMask mask = mask_of(in.shape, words);
  if (kernels == Kernels::tensor_cores)
    launch(attention_forward_mma_launch(dims, in.shape.batch), [&] {
      attention_forward_mma_kernel<kDim>(o.out.data(), o.lse.data(), in.q.data(), in.k.data(),
                                         in.v.data(), dims, mask);
    });
  else
    launch(attention_forward_launch(dims, in.shape.batch), [&] {
      attention_forward_kernel<kDim>(o.out.data(), o.lse.data(), in.q.data(), in.k.data(),
                                     in.v.data(), dims, mask);
    });
}

// The backward kernels on o.out and o.lse (the GPU backward reads its own bf16 out, as here).
template <int kDim>
void run_backward(Kernels kernels, const Inputs& in, Outputs& o) {
  const Shape& s = in.shape;
  const AttentionDims dims = dims_of(s);
  std::vector<int32_t> words;
  const AttentionMask mask = mask_of(s, words);
  std::vector<float> row_dot(o.lse.size(), NAN);
  const int64_t rows = s.batch * s.seq * s.q_heads;
  launch(attention_row_dot_launch(rows), [&] {
    attention_row_dot_kernel(row_dot.data(), in.dout.data(), o.out.data(), dims, rows);
  });
  if (kernels == Kernels::tensor_cores) {
    launch(attention_dq_mma_launch(dims, s.batch), [&] {
      attention_dq_mma_kernel<kDim>(o.dq.data(), in.dout.data(), in.q.data(), in.k.data(),
                                    in.v.data(), o.lse.data(), row_dot.data(), dims, mask);
    });
    launch(attention_dkv_mma_launch(dims, s.batch), [&] {
      attention_dkv_mma_kernel<kDim>(o.dk.data(), o.dv.data(), in.dout.data(), in.q.data(),
                                     in.k.data(), in.v.data(), o.lse.data(), row_dot.data(), dims,
                                     mask);
    });
  } else {
    launch(attention_dq_launch(dims, s.batch), [&] {
      attention_dq_kernel<kDim>(o.dq.data(), in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                                o.lse.data(), row_dot.data(), dims, mask);
    });
    launch(attention_dkv_launch(dims, s.batch), [&] {
      attention_dkv_kernel<kDim>(o.dk.data(), o.dv.data(), in.dout.data(), in.q.data(), in.k.data(),
                                 in.v.data(), o.lse.data(), row_dot.data(), dims, mask);
    });
  }
}

void forward(Kernels kernels, const Inputs& in, Outputs& o) {
  if (kernel_dim(in.shape.dim) == 64)
    run_forward<64>(kernels, in, o);
  else
    run_forward<128>(kernels, in, o);
}
void backward(Kernels kernels, const Inputs& in, Outputs& o) {
  if (kernel_dim(in.shape.dim) == 64)
    run_backward<64>(kernels, in, o);
  else
    run_backward<128>(kernels, in, o);
}

void expect_matches(const Outputs& o, const Expected& e, const std::string& what) {
  EXPECT_LT(relative_error(o.out, e.out), kTolerance) << what;
  EXPECT_LT(relative_error(o.lse, e.lse), kLseTolerance) << what;
  EXPECT_LT(relative_error(o.dq, e.dq), kTolerance) << what;
  EXPECT_LT(relative_error(o.dk, e.dk), kTolerance) << what;
  EXPECT_LT(relative_error(o.dv, e.dv), kTolerance) << what;
}

struct Case {
  Kernels kernels;
  Shape shape;
};

class EmulatedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(EmulatedAttention, MatchesCausalAttentionInDouble) {
  const Case c = GetParam();
  const Inputs in = random_inputs(c.shape);
  if (c.kernels == Kernels::tensor_cores) {
    // The inputs are as the backend's buffers: the tensor-core kernels take them.
    ASSERT_TRUE(
        mma_attention_fits(c.shape.dim, in.q.data(), in.k.data(), in.v.data(), in.dout.data()));
  }
  Outputs o(c.shape);
  forward(c.kernels, in, o);
  backward(c.kernels, in, o);
  // The kernels take rowsum(dout ∘ out) from their bf16 out, the reference from its exact one:
  // within the tolerance.
  expect_matches(o, reference(c.shape, in.q, in.k, in.v, in.dout), describe(c.shape));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Shape& s = info.param.shape;
  return "B" + std::to_string(s.batch) + "_T" + std::to_string(s.seq) + "_Hq" +
         std::to_string(s.q_heads) + "_Hkv" + std::to_string(s.kv_heads) + "_d" +
         std::to_string(s.dim) + (s.starts.empty() ? "" : "_documents");
}

// Both kernel widths (64, 128) and head dims below them (zero-filled columns), one token,
// sequences that are not a multiple of the 64-row tile and four key tiles (the double buffer
// reused), B > 1, GQA groups of 1, 2 and 3. Packed documents: a query tile that skips key
// tile 0 (start 70), a document across the tile edge whose warps see none of a tile (start
// 40: rows 40–63 see nothing of keys 0–39), a start at the tile edge 64 and a one-token
// document at the end, a document ending one row into the next tile (start 65), GQA.
// Small: each mma is two warp barriers here.
INSTANTIATE_TEST_SUITE_P(
    TensorCores, EmulatedAttention,
    ::testing::Values(Case{Kernels::tensor_cores, {1, 1, 1, 1, 8}},
                      Case{Kernels::tensor_cores, {2, 130, 2, 1, 64}},
                      Case{Kernels::tensor_cores, {1, 70, 2, 2, 40}},
                      Case{Kernels::tensor_cores, {1, 65, 3, 1, 72}},
                      Case{Kernels::tensor_cores, {1, 200, 1, 1, 128}},
                      Case{Kernels::tensor_cores, {1, 150, 2, 1, 16, {{0, 40, 70, 149}}}},
                      Case{Kernels::tensor_cores, {2, 130, 1, 1, 64, {{0, 64, 129}, {0, 5, 65}}}}),
    case_name);

// The FMA kernels run the head dims that are not multiples of 8.
INSTANTIATE_TEST_SUITE_P(Fma, EmulatedAttention,
                         ::testing::Values(Case{Kernels::fma, {1, 1, 1, 1, 2}},
                                           Case{Kernels::fma, {2, 130, 2, 1, 42}},
                                           Case{Kernels::fma, {1, 65, 3, 1, 74}},
                                           Case{Kernels::fma, {1, 130, 2, 1, 42, {{0, 40, 70}}}}),
                         case_name);

// Same interface, same lse: either kind's forward feeds the other's backward (as cuDNN's
// feeds both), and the two lse agree to fp32 rounding.
TEST(EmulatedAttentionInterface, EitherForwardFeedsEitherBackward) {
  const Shape s{1, 70, 2, 1, 64};
  const Inputs in = random_inputs(s);
  const Expected e = reference(s, in.q, in.k, in.v, in.dout);
  Outputs fma_forward(s), mma_forward(s);
  forward(Kernels::fma, in, fma_forward);
  forward(Kernels::tensor_cores, in, mma_forward);
  EXPECT_LT(relative_error(mma_forward.lse,
                           std::vector<double>(fma_forward.lse.begin(), fma_forward.lse.end())),
            kLseTolerance);
  backward(Kernels::tensor_cores, in, fma_forward);
  expect_matches(fma_forward, e, "fma forward, tensor-core backward");
  backward(Kernels::fma, in, mma_forward);
  expect_matches(mma_forward, e, "tensor-core forward, fma backward");
}

// The log line (kernels/backend.h) names the kernels this rule picks.
TEST(EmulatedAttentionInterface, TheLogSaysWhichKernelsRun) {
  for (int dim = 1; dim <= 2 * kMaxHeadDim; ++dim)
    EXPECT_EQ(native_attention_kernels(dim).find("tensor cores") != std::string::npos,
              mma_head_dim(dim))
        << dim;
}

// The emulated instructions agree with each other as the PTX ISA has them: a 16×16 A and a
// 16×16 B (two n-tiles) loaded from shared memory by ldmatrix (B both ways: [n][k] rows
// plain, [k][n] rows transposed), multiplied by mma, give A·B in the accumulator layout.
TEST(EmulatedTensorCores, LdmatrixAndMmaComputeAMatrixProduct) {
  constexpr int kStride = 24;                 // bf16 per row: 16-byte aligned rows
  std::vector<float> a(16 * 16), b(16 * 16);  // row-major A[m][k], B[k][n]
  std::mt19937 engine(5);
  std::uniform_int_distribution<int> small(-8, 8);  // exact in bf16 and in fp32 sums
  for (float& x : a) x = float(small(engine));
  for (float& x : b) x = float(small(engine));
  std::vector<float> product(16 * 16, 0.0f), plain(16 * 16, NAN), transposed(16 * 16, NAN);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 16; ++k) product[m * 16 + n] += a[m * 16 + k] * b[k * 16 + n];

  launch(dim3(1), 32, 3 * 16 * kStride * sizeof(bf16), [&] {
    bf16* a_tile = reinterpret_cast<bf16*>(cuda::dynamic_shared_memory());
    bf16* bt_tile = a_tile + 16 * kStride;  // Bᵀ: [n][k]
    bf16* b_tile = bt_tile + 16 * kStride;  // B: [k][n]
    const int lane = int(threadIdx.x);
    if (lane == 0)
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          a_tile[r * kStride + c] = __float2bfloat16_rn(a[r * 16 + c]);
          bt_tile[r * kStride + c] = __float2bfloat16_rn(b[c * 16 + r]);
          b_tile[r * kStride + c] = __float2bfloat16_rn(b[r * 16 + c]);
        }
    __syncthreads();
    uint32_t a_frag[4], b_plain[4], b_trans[4];
    cuda::ldmatrix_x4(a_frag, a_tile + (lane % 8 + lane / 8 % 2 * 8) * kStride + lane / 16 * 8);
    cuda::ldmatrix_x4(b_plain, bt_tile + (lane % 8 + lane / 16 * 8) * kStride + lane / 8 % 2 * 8);
    cuda::ldmatrix_x4_trans(b_trans,
                            b_tile + (lane % 8 + lane / 8 % 2 * 8) * kStride + lane / 16 * 8);
    float d_plain[2][4] = {}, d_trans[2][4] = {};
    for (int n = 0; n < 2; ++n) {
      cuda::mma_m16n8k16(d_plain[n], a_frag, b_plain + 2 * n);
      cuda::mma_m16n8k16(d_trans[n], a_frag, b_trans + 2 * n);
    }
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) {
        const int index = fragment_row(lane, i) * 16 + fragment_column(lane, n, i);
        plain[size_t(index)] = d_plain[n][i];
        transposed[size_t(index)] = d_trans[n][i];
      }
  });
  for (int i = 0; i < 16 * 16; ++i) {
    ASSERT_EQ(plain[i], product[i]) << "ldmatrix, element " << i;
    ASSERT_EQ(transposed[i], product[i]) << "ldmatrix .trans, element " << i;
  }
}

// cp.async: a copy lands when a wait retires its group, not before; wait_group N leaves the
// N newest groups in flight; a copy of nothing (inside false) writes zeros.
TEST(EmulatedTensorCores, CpAsyncLandsOnlyWhenItsGroupIsWaitedFor) {
  alignas(16) const float source[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> seen;
  launch(dim3(1), 1, 3 * 16, [&] {
    float* shared = reinterpret_cast<float*>(cuda::dynamic_shared_memory());
    cuda::cp_async_16(shared, source, true);
    cuda::cp_async_commit();
    cuda::cp_async_16(shared + 4, source + 4, true);
    cuda::cp_async_16(shared + 8, source, false);
    cuda::cp_async_commit();
    seen.assign(shared, shared + 12);  // nothing landed
    cuda::cp_async_wait<1>();          // the first group only
    seen.insert(seen.end(), shared, shared + 12);
    cuda::cp_async_wait<0>();
    seen.insert(seen.end(), shared, shared + 12);
  });
  ASSERT_EQ(seen.size(), 36u);
  for (int i = 0; i < 12; ++i) EXPECT_TRUE(std::isnan(seen[i])) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(seen[12 + i], source[i]);
  for (int i = 4; i < 12; ++i) EXPECT_TRUE(std::isnan(seen[12 + i])) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(seen[24 + i], source[i]);
  for (int i = 8; i < 12; ++i) EXPECT_EQ(seen[24 + i], 0.0f);
}

}  // namespace
}  // namespace ulysses
