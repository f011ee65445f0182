// Ulysses attention under mpiexec: on every rank of an SP group, forward and backward on this
// rank's slice of the sequence must give that slice of the single-rank attention over the
// whole sequence, for plain, split-GQA and replicated-GQA heads, with the analytic all-to-all
// volume and no buffer left behind.
#include "parallel/ulysses_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

using testing::MpiTest;

struct Case {
  int sp;
  int heads;
  int kv_heads;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "sp" + std::to_string(info.param.sp) + "_heads" + std::to_string(info.param.heads) +
         "_kv" + std::to_string(info.param.kv_heads);
}

// Uniform values in [-1, 1) from a fixed seed: identical on every rank.
std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = float(generator()) / 4294967296.0f * 2.0f - 1.0f;
  return values;
}

// Tokens [begin, begin + Tl) of every sequence of x[B, N, H, d] as [B, Tl, H, d].
std::vector<float> token_slice(const std::vector<float>& x, int64_t B, int64_t N, int64_t row,
                               int64_t begin, int64_t Tl) {
  std::vector<float> slice(static_cast<size_t>(B * Tl * row));
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(x.begin() + (b * N + begin) * row, Tl * row, slice.begin() + b * Tl * row);
  return slice;
}

// The schedule core/model/layers.cpp runs, with every exchange waited for as it is issued.
void forward(UlyssesAttention& attention, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& out, AttentionState& state) {
  using Input = UlyssesAttention::Input;
  attention.check_forward(q, k, v, out);
  state = AttentionState();
  for (const auto& [x, input] :
       {std::pair{q, Input::q}, std::pair{k, Input::k}, std::pair{v, Input::v}}) {
    HeadExchange exchange = attention.start_input(x, input, state);
    attention.finish(exchange);
  }
  attention.finish_forward(out, state);
}

void backward(UlyssesAttention& attention, const Tensor& dout, const AttentionState& state,
              const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  using Input = UlyssesAttention::Input;
  attention.check_backward(dout, state, dq, dk, dv);
  AttentionGradients grads;
  HeadExchange dout_exchange = attention.start_backward(dout, grads);
  attention.finish(dout_exchange);
  attention.compute_backward(state, grads, dq, dk, dv);
  for (const auto& [target, input] :
       {std::pair{dq, Input::q}, std::pair{dk, Input::k}, std::pair{dv, Input::v}}) {
    HeadExchange exchange = attention.start_gradient(input, grads, target);
    attention.finish(exchange);
  }
}

// max |actual - expected| / max |expected|
double relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::fabs(double(actual[i]) - double(expected[i])));
    scale = std::max(scale, std::fabs(double(expected[i])));
  }
  return worst / scale;
}

class UlyssesAttentionTest : public MpiTest, public ::testing::WithParamInterface<Case> {};

TEST_P(UlyssesAttentionTest, SlicesMatchSingleRankAttention) {
  const Case c = GetParam();
  if (c.sp > world().size() || world().size() % c.sp != 0)
    GTEST_SKIP() << "sp " << c.sp << " does not divide " << world().size() << " ranks";
  Mesh mesh = make_mesh(world(), c.sp);
  Comm& sp_comm = *mesh.sp;
  CpuBackend backend;
  backend.set_num_threads(1);

  const int64_t B = 2, Tl = 5, P = c.sp, N = P * Tl, H = c.heads, Hkv = c.kv_heads, d = 8;
  const int64_t q_row = H * d, kv_row = Hkv * d;
  // Each SP group gets its own sequence, so a mix-up between groups would show.
  const uint32_t seed = 1000u * uint32_t(mesh.dp_rank + 1);
  std::vector<float> q = random_values(B * N * q_row, seed + 1);
  std::vector<float> k = random_values(B * N * kv_row, seed + 2);
  std::vector<float> v = random_values(B * N * kv_row, seed + 3);
  std::vector<float> dout = random_values(B * N * q_row, seed + 4);

  // The reference: single-rank attention over the whole sequence.
  std::vector<float> out_ref(q.size()), lse_ref(static_cast<size_t>(B * H * N));
  std::vector<float> dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
  {
    Tensor q_all(q.data(), DType::f32, {B, N, H, d}), k_all(k.data(), DType::f32, {B, N, Hkv, d});
    Tensor v_all(v.data(), DType::f32, {B, N, Hkv, d});
    Tensor out_all(out_ref.data(), DType::f32, {B, N, H, d});
    Tensor lse_all(lse_ref.data(), DType::f32, {B, H, N});
    backend.attention_forward(out_all, lse_all, q_all, k_all, v_all);
    backend.attention_backward(Tensor(dq_ref.data(), DType::f32, {B, N, H, d}),
                               Tensor(dk_ref.data(), DType::f32, {B, N, Hkv, d}),
                               Tensor(dv_ref.data(), DType::f32, {B, N, Hkv, d}),
                               Tensor(dout.data(), DType::f32, {B, N, H, d}), q_all, k_all, v_all,
                               out_all, lse_all);
  }

  // This rank's slice through Ulysses attention.
  const int64_t begin = mesh.sp_rank * Tl;
  std::vector<float> q_mine = token_slice(q, B, N, q_row, begin, Tl);
  std::vector<float> k_mine = token_slice(k, B, N, kv_row, begin, Tl);
  std::vector<float> v_mine = token_slice(v, B, N, kv_row, begin, Tl);
  std::vector<float> dout_mine = token_slice(dout, B, N, q_row, begin, Tl);
  std::vector<float> out_mine(q_mine.size(), NAN), dq_mine(q_mine.size(), NAN);
  std::vector<float> dk_mine(k_mine.size(), NAN), dv_mine(v_mine.size(), NAN);
  Tensor q_t(q_mine.data(), DType::f32, {B, Tl, H, d});
  Tensor k_t(k_mine.data(), DType::f32, {B, Tl, Hkv, d});
  Tensor v_t(v_mine.data(), DType::f32, {B, Tl, Hkv, d});
  Tensor out_t(out_mine.data(), DType::f32, {B, Tl, H, d});

  UlyssesAttention attention(backend, sp_comm, int(H), int(Hkv), int(d));
  sp_comm.reset_stats();
  {
    AttentionState state;
    forward(attention, q_t, k_t, v_t, out_t, state);

    const int64_t h = H / P, hk = attention.kv_heads_per_rank();
    if (P == 1) {
      EXPECT_EQ(state.q.data, q_t.data);
      EXPECT_EQ(state.k.data, k_t.data);
      EXPECT_EQ(state.v.data, v_t.data);
      EXPECT_EQ(state.out.data, out_t.data);
      EXPECT_TRUE(state.q_owned.empty());
    } else {
      EXPECT_EQ(state.q.shape_string(), Tensor(nullptr, DType::f32, {B, N, h, d}).shape_string());
      EXPECT_EQ(state.k.shape_string(), Tensor(nullptr, DType::f32, {B, N, hk, d}).shape_string());
      EXPECT_EQ(hk, Hkv % P == 0 ? Hkv / P : 1);
    }
    // What attention keeps between forward and backward: the head-split q, k, v, out and lse.
    const int64_t kept =
        P == 1 ? B * H * N * 4 : (2 * B * N * h * d + 2 * B * N * hk * d + B * h * N) * 4;
    EXPECT_EQ(backend.memory().current(MemCategory::attention), kept);
    EXPECT_EQ(backend.memory().current(MemCategory::comm), 0);

    backward(attention, Tensor(dout_mine.data(), DType::f32, {B, Tl, H, d}), state,
             Tensor(dq_mine.data(), DType::f32, {B, Tl, H, d}),
             Tensor(dk_mine.data(), DType::f32, {B, Tl, Hkv, d}),
             Tensor(dv_mine.data(), DType::f32, {B, Tl, Hkv, d}));
    EXPECT_EQ(backend.memory().current(MemCategory::attention), kept);
  }
  EXPECT_EQ(backend.memory().current(MemCategory::attention), 0);
  EXPECT_EQ(backend.memory().current(MemCategory::comm), 0);
  // Transient all-to-all buffers: one send and one receive buffer of [B, Tl, H, d] at a time.
  EXPECT_EQ(backend.memory().peak(MemCategory::comm), P == 1 ? 0 : 2 * B * Tl * H * d * 4);

  const double tolerance = 1e-5;
  EXPECT_LE(relative_error(out_mine, token_slice(out_ref, B, N, q_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dq_mine, token_slice(dq_ref, B, N, q_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dk_mine, token_slice(dk_ref, B, N, kv_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dv_mine, token_slice(dv_ref, B, N, kv_row, begin, Tl)), tolerance);

  // 8 all-to-alls (q, k, v, out; dout, dq, dk, dv), each sending (P-1)/P of its send buffer
  // to the other ranks: [B, Tl, H, d] for q-like tensors and P kv blocks of [B, Tl, hk, d].
  const int64_t hk = Hkv % P == 0 ? Hkv / P : 1;
  const int64_t q_like = (P - 1) * B * Tl * (H / P) * d * 4;
  const int64_t kv_like = (P - 1) * B * Tl * hk * d * 4;
  EXPECT_EQ(sp_comm.stats().all_to_all_bytes, P == 1 ? 0 : 4 * q_like + 4 * kv_like);
  EXPECT_EQ(sp_comm.stats().calls, P == 1 ? 0 : 8);
}

INSTANTIATE_TEST_SUITE_P(
    Heads, UlyssesAttentionTest,
    ::testing::Values(Case{1, 4, 4}, Case{1, 4, 2},                  // no communication
                      Case{2, 8, 8}, Case{2, 8, 2}, Case{2, 8, 4},   // kv heads split
                      Case{2, 8, 1}, Case{2, 2, 1},                  // kv head replicated
                      Case{4, 8, 8}, Case{4, 8, 4}, Case{4, 4, 4},   // kv heads split
                      Case{4, 8, 1}, Case{4, 8, 2}, Case{4, 4, 1}),  // kv heads replicated
    case_name);

TEST_F(MpiTest, UlyssesRefusesHeadCountsThatDoNotSplit) {
  CpuBackend backend;
  const int P = world().size();
  EXPECT_THROW(UlyssesAttention(backend, world(), P + 1, 1, 8), std::invalid_argument);
  // 3 kv heads neither divisible by P nor dividing P (P = 2 or 4).
  EXPECT_THROW(UlyssesAttention(backend, world(), 3 * P, 3, 8), std::invalid_argument);
  // 3 kv heads do not divide 4·P heads.
  EXPECT_THROW(UlyssesAttention(backend, world(), 4 * P, 3, 8), std::invalid_argument);
  EXPECT_NO_THROW(UlyssesAttention(backend, world(), 4 * P, 1, 8));
  EXPECT_NO_THROW(UlyssesAttention(backend, world(), 4 * P, 2 * P, 8));
}

TEST_F(MpiTest, UlyssesRejectsShapesThatDisagree) {
  CpuBackend backend;
  const int P = world().size();
  UlyssesAttention attention(backend, world(), 2 * P, P, 4);
  world().reset_stats();
  std::vector<float> q(2 * 3 * 2 * P * 4), kv(2 * 3 * P * 4), out(q.size());
  AttentionState state;
  Tensor q_t(q.data(), DType::f32, {2, 3, 2 * P, 4});
  Tensor kv_t(kv.data(), DType::f32, {2, 3, P, 4});
  Tensor short_kv(kv.data(), DType::f32, {2, 2, P, 4});
  Tensor out_t(out.data(), DType::f32, {2, 3, 2 * P, 4});
  EXPECT_THROW(forward(attention, q_t, short_kv, short_kv, out_t, state), std::invalid_argument);
  EXPECT_THROW(forward(attention, q_t, q_t, kv_t, out_t, state), std::invalid_argument);
  EXPECT_THROW(backward(attention, out_t, state, q_t, kv_t, kv_t), std::logic_error);
  EXPECT_EQ(world().stats().calls, 0);
}

}  // namespace
}  // namespace ulysses
