// CpuBackend: allocation, data movement, casts, elementwise helpers, GEMM, bias and AdamW.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_ops_common.h"

namespace ulysses {
namespace {

using ops_test::make_f32;
using ops_test::random_floats;
using ops_test::read_f32;
using ops_test::relative_error;

TEST(CpuMemory, AllocationsAreAlignedAndTracked) {
  CpuBackend backend;
  for (int64_t count : {1, 3, 17, 1000}) {
    Buffer buffer = backend.alloc(MemCategory::activations, DType::f32, {count}, "test");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.tensor().data) % 64, 0u);
    EXPECT_EQ(backend.memory().current(MemCategory::activations), count * 4);
  }
  EXPECT_EQ(backend.memory().current(MemCategory::activations), 0);
  EXPECT_EQ(backend.memory().peak(MemCategory::activations), 4000);
}

TEST(CpuMemory, ZeroByteAllocationsAreDistinctPointers) {
  CpuBackend backend;
  void* first = backend.raw_alloc(0);
  void* second = backend.raw_alloc(0);
  EXPECT_NE(first, nullptr);
  EXPECT_NE(first, second);
  backend.raw_free(first);
  backend.raw_free(second);
  Buffer empty_rows = backend.alloc(MemCategory::workspace, DType::f32, {0, 8}, "empty");
  EXPECT_EQ(empty_rows.bytes(), 0u);
  EXPECT_EQ(backend.memory().current(MemCategory::workspace), 0);
}

TEST(CpuMemory, LimitIsEnforced) {
  CpuBackend backend(1000);
  Buffer fits = backend.alloc(MemCategory::params, DType::f32, {200}, "fits");
  EXPECT_THROW(backend.alloc(MemCategory::grads, DType::f32, {100}, "too much"), OutOfMemoryError);
}

TEST(CpuDataMovement, UploadCopyDownloadAndZero) {
  CpuBackend backend;
  const std::vector<float> values = random_floats(37, 1);
  Buffer a = make_f32(backend, {37}, values);
  Buffer b = backend.alloc(MemCategory::activations, DType::f32, {37}, "b");
  backend.copy(b, a);
  EXPECT_EQ(read_f32(backend, b), values);
  backend.fill_zero(b);
  for (float value : read_f32(backend, b)) EXPECT_EQ(value, 0.0f);
  Buffer wrong = backend.alloc(MemCategory::activations, DType::f32, {36}, "wrong");
  EXPECT_THROW(backend.copy(wrong, a), std::invalid_argument);
}

TEST(CpuDataMovement, Copy2dHonoursPitches) {
  CpuBackend backend;
  // 3 rows of 4 floats out of a [3, 6] source into a [3, 5] destination.
  const std::vector<float> source = random_floats(18, 2);
  std::vector<float> destination(15, -1.0f);
  backend.copy_2d(destination.data(), 5 * 4, source.data(), 6 * 4, 4 * 4, 3);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 5; ++c) {
      EXPECT_EQ(destination[r * 5 + c], c < 4 ? source[r * 6 + c] : -1.0f) << r << "," << c;
    }
  }
}

uint16_t bits_of_bf16(CpuBackend& backend, float value) {
  Buffer source = make_f32(backend, {1}, {value});
  Buffer target = backend.alloc(MemCategory::activations, DType::bf16, {1}, "bf16");
  backend.cast(target, source);
  uint16_t bits = 0;
  backend.download(&bits, target);
  return bits;
}

TEST(CpuCast, F32ToBf16RoundsToNearestEven) {
  CpuBackend backend;
  EXPECT_EQ(bits_of_bf16(backend, 1.0f), 0x3F80);
  EXPECT_EQ(bits_of_bf16(backend, -2.0f), 0xC000);
  // 1 + 2^-8 lies halfway between 0x3F80 and 0x3F81: ties go to the even 0x3F80.
  EXPECT_EQ(bits_of_bf16(backend, 1.00390625f), 0x3F80);
  // 1 + 3·2^-8 lies halfway between 0x3F81 and 0x3F82: ties go to the even 0x3F82.
  EXPECT_EQ(bits_of_bf16(backend, 1.01171875f), 0x3F82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(bits_of_bf16(backend, 1.00390625f + 1.0f / (1 << 20)), 0x3F81);
  EXPECT_EQ(bits_of_bf16(backend, std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bits_of_bf16(backend, std::numeric_limits<float>::max()), 0x7F80);
  const uint16_t nan_bits = bits_of_bf16(backend, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan_bits & 0x7F80, 0x7F80);
  EXPECT_NE(nan_bits & 0x007F, 0);
}

TEST(CpuCast, Bf16ToF32IsExactAndRoundTrips) {
  CpuBackend backend;
  const std::vector<uint16_t> bits = {0x3F80, 0xC000, 0x3F81, 0x0001, 0x7F80, 0x4049};
  Buffer source = backend.alloc(MemCategory::activations, DType::bf16, {6}, "bf16");
  backend.upload(source, bits.data());
  Buffer widened = backend.alloc(MemCategory::activations, DType::f32, {6}, "f32");
  backend.cast(widened, source);
  const std::vector<float> values = read_f32(backend, widened);
  for (size_t i = 0; i < bits.size(); ++i) {
    uint32_t expected = uint32_t(bits[i]) << 16;
    uint32_t actual;
    std::memcpy(&actual, &values[i], 4);
    EXPECT_EQ(actual, expected) << i;
  }
  Buffer narrowed = backend.alloc(MemCategory::activations, DType::bf16, {6}, "back");
  backend.cast(narrowed, widened);
  std::vector<uint16_t> round_trip(6);
  backend.download(round_trip.data(), narrowed);
  EXPECT_EQ(round_trip, bits);

  Buffer ids = backend.alloc(MemCategory::activations, DType::i32, {6}, "ids");
  EXPECT_THROW(backend.cast(ids, widened), std::invalid_argument);
}

TEST(CpuElementwise, AxpyScaleSumSquares) {
  CpuBackend backend;
  const int64_t n = 200003;  // several sum_squares chunks, not a multiple of anything
  const std::vector<float> x = random_floats(size_t(n), 3);
  const std::vector<float> y = random_floats(size_t(n), 4);
  Buffer xb = make_f32(backend, {n}, x);
  Buffer yb = make_f32(backend, {n}, y);
  backend.axpy(yb, xb, 0.75f);
  backend.scale(yb, -2.0f);
  std::vector<double> expected(static_cast<size_t>(n));
  double expected_squares = 0.0;
  for (size_t i = 0; i < size_t(n); ++i) {
    expected[i] = -2.0 * (double(y[i]) + 0.75 * double(x[i]));
    expected_squares += double(x[i]) * double(x[i]);
  }
  EXPECT_LT(relative_error(read_f32(backend, yb), expected), 1e-6);
  EXPECT_NEAR(backend.sum_squares(xb), expected_squares, 1e-10 * expected_squares);

  backend.set_num_threads(1);
  const double one_thread = backend.sum_squares(xb);
  backend.set_num_threads(2);
  EXPECT_EQ(backend.sum_squares(xb), one_thread);
}

struct GemmCase {
  bool trans_a, trans_b;
  CpuGemm gemm;
};

class CpuGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuGemmTest, MatchesDoubleReference) {
  const auto [trans_a, trans_b, gemm] = GetParam();
  const int64_t m = 5, k = 7, n = 3;
  CpuBackend backend;
  backend.use_gemm(gemm);
  const std::vector<float> a = random_floats(size_t(m * k), 10);
  const std::vector<float> b = random_floats(size_t(k * n), 11);
  const std::vector<float> c = random_floats(size_t(m * n), 12);
  Buffer ab = trans_a ? make_f32(backend, {k, m}, a) : make_f32(backend, {m, k}, a);
  Buffer bb = trans_b ? make_f32(backend, {n, k}, b) : make_f32(backend, {k, n}, b);
  Buffer cb = make_f32(backend, {m, n}, c);
  backend.gemm(ab, trans_a, bb, trans_b, cb, 0.5f, 0.25f);

  std::vector<double> expected(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double a_ip = trans_a ? a[p * m + i] : a[i * k + p];
        const double b_pj = trans_b ? b[j * k + p] : b[p * n + j];
        sum += a_ip * b_pj;
      }
      expected[i * n + j] = 0.5 * sum + 0.25 * double(c[i * n + j]);
    }
  }
  EXPECT_LT(relative_error(read_f32(backend, cb), expected), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CpuGemmTest,
                         ::testing::Values(GemmCase{false, false, CpuGemm::openblas},
                                           GemmCase{false, true, CpuGemm::openblas},
                                           GemmCase{true, false, CpuGemm::openblas},
                                           GemmCase{true, true, CpuGemm::openblas},
                                           GemmCase{false, false, CpuGemm::portable},
                                           GemmCase{false, true, CpuGemm::portable},
                                           GemmCase{true, false, CpuGemm::portable},
                                           GemmCase{true, true, CpuGemm::portable}));

// The portable GEMM's contract (kernels/cpu/portable_gemm.h), bit for bit: each element is
// alpha · (((0 + a₀b₀) + a₁b₁) + ...) + beta · c with every operation rounded to fp32, for
// every transpose, shapes that cross its blocks of rows, columns and k, and 1 to 3 threads.
TEST(CpuPortableGemm, SumsOverKInOrderWithEveryOperationRoundedForAnyThreadCount) {
  const int64_t m = 70, k = 300, n = 130;  // blocks of 32 rows, 64 columns, 128 of k
  const std::vector<float> a = random_floats(size_t(m * k), 20);
  const std::vector<float> b = random_floats(size_t(k * n), 21);
  const std::vector<float> c = random_floats(size_t(m * n), 22);
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      std::vector<float> expected(size_t(m * n));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          // volatile: the test's own build must not fuse these into an FMA either.
          volatile float sum = 0.0f;
          for (int64_t p = 0; p < k; ++p) {
            volatile float product =
                (trans_a ? a[p * m + i] : a[i * k + p]) * (trans_b ? b[j * k + p] : b[p * n + j]);
            sum = sum + product;
          }
          volatile float scaled_sum = 0.5f * sum;
          volatile float scaled_c = -2.0f * c[i * n + j];
          expected[size_t(i * n + j)] = scaled_sum + scaled_c;
        }
      }
      for (const int threads : {1, 2, 3}) {
        CpuBackend backend;
        backend.use_gemm(CpuGemm::portable);
        backend.set_num_threads(threads);
        Buffer ab = trans_a ? make_f32(backend, {k, m}, a) : make_f32(backend, {m, k}, a);
        Buffer bb = trans_b ? make_f32(backend, {n, k}, b) : make_f32(backend, {k, n}, b);
        Buffer cb = make_f32(backend, {m, n}, c);
        backend.gemm(ab, trans_a, bb, trans_b, cb, 0.5f, -2.0f);
        EXPECT_EQ(read_f32(backend, cb), expected)
            << "trans_a " << trans_a << " trans_b " << trans_b << ", " << threads << " threads";
      }
    }
  }
}

// With beta = 0, c is overwritten and never read, as in BLAS: NaN there does not leak out.
TEST(CpuPortableGemm, BetaZeroOverwritesWithoutReadingC) {
  CpuBackend backend;
  backend.use_gemm(CpuGemm::portable);
  Buffer a = make_f32(backend, {2, 3}, {1, 2, 3, 4, 5, 6});
  Buffer b = make_f32(backend, {3, 2}, {1, 0, 0, 1, 1, 1});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Buffer c = make_f32(backend, {2, 2}, {nan, nan, nan, nan});
  backend.gemm(a, false, b, false, c, 2.0f, 0.0f);
  EXPECT_EQ(read_f32(backend, c), (std::vector<float>{8, 10, 20, 22}));
}

// The build links OpenBLAS's OpenMP variant ahead of Debian's pthreads default (CMakeLists.txt),
// so GEMMs and the other cpu ops share one team of threads instead of contending for the
// cores (docs/performance.md, "Threads").
TEST(CpuGemmThreads, GemmsRunOnTheOpenMpThreadsOfTheOtherOps) {
#ifndef ULYSSES_OPENBLAS_OPENMP
  GTEST_SKIP() << "built without libopenblas0-openmp (CMake warned): the GEMMs use OpenBLAS's "
                  "own threads";
#endif
  EXPECT_TRUE(CpuBackend::blas_uses_openmp())
      << "linked against OpenBLAS's OpenMP build, but another OpenBLAS was loaded: check the "
         "run path of the executable";
  EXPECT_EQ(CpuBackend(0).setup_warning(), "");
}

// The log names the GEMM a run computes with: its rate and last bits follow OpenBLAS's kernels.
TEST(CpuGemmKernels, TheSetupNoteNamesTheKernelsTheGemmsRunOn) {
  CpuBackend backend(0);
  const std::string note = backend.setup_note();
  const std::string prefix = "GEMMs on OpenBLAS's ";
  ASSERT_EQ(note.substr(0, prefix.size()), prefix);
  const size_t kernels = note.find(" kernels", prefix.size());
  ASSERT_NE(kernels, std::string::npos) << note;
  EXPECT_GT(kernels, prefix.size()) << "no core named: " << note;
  EXPECT_EQ(note.find("(OPENBLAS_CORETYPE)") != std::string::npos,
            std::getenv("OPENBLAS_CORETYPE") != nullptr)
      << note;
  backend.use_gemm(CpuGemm::portable);
  EXPECT_EQ(backend.setup_note(), "GEMMs on the portable GEMM");
}

TEST(CpuGemmShapes, MismatchThrowsWithShapes) {
  CpuBackend backend;
  Buffer a = backend.alloc(MemCategory::activations, DType::f32, {5, 7}, "a");
  Buffer b = backend.alloc(MemCategory::activations, DType::f32, {6, 3}, "b");
  Buffer c = backend.alloc(MemCategory::activations, DType::f32, {5, 3}, "c");
  try {
    backend.gemm(a, false, b, false, c, 1.0f, 0.0f);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("[5, 7]"), std::string::npos) << message;
    EXPECT_NE(message.find("[6, 3]"), std::string::npos) << message;
  }
  Buffer wrong_c = backend.alloc(MemCategory::activations, DType::f32, {5, 4}, "c");
  Buffer b_ok = backend.alloc(MemCategory::activations, DType::f32, {7, 3}, "b");
  EXPECT_THROW(backend.gemm(a, false, b_ok, false, wrong_c, 1.0f, 0.0f), std::invalid_argument);
  Buffer flat = backend.alloc(MemCategory::activations, DType::f32, {21}, "flat");
  EXPECT_THROW(backend.gemm(flat, false, b_ok, false, c, 1.0f, 0.0f), std::invalid_argument);
}

TEST(CpuBias, ForwardAddsAndBackwardAccumulatesColumnSums) {
  CpuBackend backend;
  const int64_t rows = 9, width = 70;  // two column blocks, the second partial
  const std::vector<float> out = random_floats(size_t(rows * width), 20);
  const std::vector<float> bias = random_floats(size_t(width), 21);
  const std::vector<float> dout = random_floats(size_t(rows * width), 22);
  const std::vector<float> dbias_start = random_floats(size_t(width), 23);
  Buffer out_b = make_f32(backend, {rows, width}, out);
  Buffer bias_b = make_f32(backend, {width}, bias);
  backend.bias_forward(out_b, bias_b);
  std::vector<double> expected(out.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      expected[r * width + j] = double(out[r * width + j]) + double(bias[j]);
  EXPECT_LT(relative_error(read_f32(backend, out_b), expected), 1e-6);

  Buffer dout_b = make_f32(backend, {rows, width}, dout);
  Buffer dbias_b = make_f32(backend, {width}, dbias_start);
  backend.bias_backward(dbias_b, dout_b);
  std::vector<float> dbias = read_f32(backend, dbias_b);
  for (int64_t j = 0; j < width; ++j) dbias[j] -= dbias_start[j];
  auto loss = [&](const std::vector<double>& b) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j)
        sum += double(dout[r * width + j]) * (double(out[r * width + j]) + b[j]);
    return sum;
  };
  ops_test::expect_gradient_matches(dbias, ops_test::to_double(bias), loss, 1e-5, "dbias");
}

// PyTorch's AdamW step, in double.
void reference_adamw(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                     const std::vector<float>& grad, const AdamWStep& s) {
  const double bias1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bias2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = double(s.grad_scale) * double(grad[i]);
    p[i] *= 1.0 - double(s.lr) * double(s.weight_decay);
    m[i] = double(s.beta1) * m[i] + (1.0 - double(s.beta1)) * g;
    v[i] = double(s.beta2) * v[i] + (1.0 - double(s.beta2)) * g * g;
    const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + double(s.eps);
    p[i] -= double(s.lr) / bias1 * m[i] / denom;
  }
}

TEST(CpuAdamW, FirstStepByHand) {
  // p = 1, g = 1: m = 0.1, v = 0.05, m̂ = 1, v̂ = 1, so p = 1·(1 − lr·wd) − lr / (1 + eps).
  CpuBackend backend;
  Buffer p = make_f32(backend, {1}, {1.0f});
  Buffer g = make_f32(backend, {1}, {1.0f});
  Buffer m = make_f32(backend, {1}, {0.0f});
  Buffer v = make_f32(backend, {1}, {0.0f});
  AdamWStep step;
  step.lr = 0.01f;
  step.weight_decay = 0.1f;
  step.beta1 = 0.9f;
  step.beta2 = 0.95f;
  step.step = 1;
  backend.adamw(p, g, m, v, step);
  EXPECT_NEAR(read_f32(backend, p)[0], 0.989f, 1e-6f);
  EXPECT_NEAR(read_f32(backend, m)[0], 0.1f, 1e-7f);
  EXPECT_NEAR(read_f32(backend, v)[0], 0.05f, 1e-7f);
}

TEST(CpuAdamW, TwoStepsMatchReference) {
  CpuBackend backend;
  const size_t n = 1000;
  const std::vector<float> p0 = random_floats(n, 30);
  const std::vector<float> g1 = random_floats(n, 31);
  const std::vector<float> g2 = random_floats(n, 32, -3.0f, 3.0f);
  Buffer p = make_f32(backend, {int64_t(n)}, p0);
  Buffer m = make_f32(backend, {int64_t(n)}, std::vector<float>(n, 0.0f));
  Buffer v = make_f32(backend, {int64_t(n)}, std::vector<float>(n, 0.0f));
  std::vector<double> p_ref = ops_test::to_double(p0), m_ref(n, 0.0), v_ref(n, 0.0);

  AdamWStep step;
  step.lr = 3e-3f;
  step.beta1 = 0.9f;
  step.beta2 = 0.95f;
  step.eps = 1e-8f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  for (int t = 1; t <= 2; ++t) {
    step.step = t;
    const std::vector<float>& grad = t == 1 ? g1 : g2;
    Buffer g = make_f32(backend, {int64_t(n)}, grad);
    backend.adamw(p, g, m, v, step);
    reference_adamw(p_ref, m_ref, v_ref, grad, step);
  }
  // Compare the change of p, not p itself, so that an error in the update is not hidden
  // by the size of the parameter.
  const std::vector<float> p_final = read_f32(backend, p);
  std::vector<float> change(n);
  std::vector<double> change_ref(n);
  for (size_t i = 0; i < n; ++i) {
    change[i] = p_final[i] - p0[i];
    change_ref[i] = p_ref[i] - double(p0[i]);
  }
  EXPECT_LT(relative_error(change, change_ref), 1e-4);
  EXPECT_LT(relative_error(read_f32(backend, m), m_ref), 1e-6);
  EXPECT_LT(relative_error(read_f32(backend, v), v_ref), 1e-6);
}

}  // namespace
}  // namespace ulysses
