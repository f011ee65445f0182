// Ulysses attention under mpiexec: on every rank of an SP group, forward and backward on this
// rank's slice of the sequence, through the stage exchanges the attention schedule uses
// (core/model/attention_schedule.h), must give that slice of the single-rank attention over
// the whole sequence, for plain, split-GQA and replicated-GQA heads in one stage or several,
// with the analytic all-to-all volume and no buffer left behind.
#include "parallel/ulysses_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
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
  int stages = 1;  // parallel.head_chunks
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "sp" + std::to_string(info.param.sp) + "_heads" + std::to_string(info.param.heads) +
         "_kv" + std::to_string(info.param.kv_heads) + "_stages" +
         std::to_string(info.param.stages);
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

// Rank p's n heads of x[B, Tl, Hx, d] from first(p) on, in block p of a send buffer
// [P, B, Tl, n·d]: the layout the schedule's projections write (core/model/attention_schedule.h).
Buffer packed(Backend& backend, const Tensor& x, int P, int64_t n,
              const std::function<int(int)>& first) {
  const int64_t B = x.dim(0), Tl = x.dim(1), heads = x.dim(2), d = x.dim(3);
  Buffer send = backend.alloc(MemCategory::comm, x.dtype, {P, B, Tl, n * d}, "test send");
  const int64_t head_bytes = d * int64_t(sizeof(float));
  for (int p = 0; p < P; ++p)
    backend.copy_2d(static_cast<char*>(send.tensor().data) + p * B * Tl * n * head_bytes,
                    n * head_bytes, static_cast<const char*>(x.data) + first(p) * head_bytes,
                    heads * head_bytes, n * head_bytes, B * Tl);
  return send;
}

// The inverse, adding: x[b, t, first(p) + j] += block p (ranks sharing a kv head each return
// a part of its gradient).
void add_unpacked(const Tensor& packed_blocks, const Tensor& x, int P, int64_t n,
                  const std::function<int(int)>& first) {
  const int64_t B = x.dim(0), Tl = x.dim(1), heads = x.dim(2), d = x.dim(3);
  const float* blocks = packed_blocks.f32();
  float* target = x.f32();
  for (int p = 0; p < P; ++p)
    for (int64_t row = 0; row < B * Tl; ++row)
      for (int64_t e = 0; e < n * d; ++e)
        target[row * heads * d + first(p) * d + e] += blocks[(p * B * Tl + row) * n * d + e];
}

// What a stage's forward keeps for its backward, in the head layout.
struct StageTensors {
  Buffer q, k, v, out, lse;
};

// The schedule's exchanges around the attention, stage by stage, each waited for as it is
// issued: q, k, v packed by destination to the head layout, out back to the tokens.
std::vector<StageTensors> forward(Backend& backend, UlyssesAttention& attention, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& out) {
  const int P = attention.ranks();
  const int64_t B = q.dim(0), N = q.dim(1) * P, d = q.dim(3);
  const int64_t hs = attention.stage_q_heads(), ks = attention.stage_kv_heads();
  std::vector<StageTensors> stages;
  for (int stage = 0; stage < attention.head_chunks(); ++stage) {
    auto q_first = [&](int p) { return attention.stage_q_first(p, stage); };
    auto kv_first = [&](int p) { return attention.stage_kv_first(p, stage); };
    StageTensors t;
    auto heads = [&](int64_t n) {
      return backend.alloc(MemCategory::attention, DType::f32, {B, N, n, d}, "test heads");
    };
    t.q = heads(hs);
    t.k = heads(ks);
    t.v = heads(ks);
    t.out = heads(hs);
    t.lse = backend.alloc(MemCategory::attention, DType::f32, {B, hs, N}, "test lse");
    for (const auto& [x, full, n, first] :
         {std::tuple{&q, &t.q, hs, std::function<int(int)>(q_first)},
          std::tuple{&k, &t.k, ks, std::function<int(int)>(kv_first)},
          std::tuple{&v, &t.v, ks, std::function<int(int)>(kv_first)}}) {
      HeadExchange exchange =
          attention.start_packed_to_heads(packed(backend, *x, P, n, first), *full);
      attention.finish(exchange);
    }
    attention.local_forward(t.out, t.lse, t.q, t.k, t.v);
    HeadExchange back = attention.start_stage_to_tokens(t.out, stage, out);
    attention.finish(back);
    stages.push_back(std::move(t));
  }
  return stages;
}

// dq, dk and dv (zero on entry) of dout through the stages the forward kept.
void backward(Backend& backend, UlyssesAttention& attention, const Tensor& dout,
              const std::vector<StageTensors>& stages, const Tensor& dq, const Tensor& dk,
              const Tensor& dv) {
  const int P = attention.ranks();
  const int64_t B = dout.dim(0), Tl = dout.dim(1), N = Tl * P, d = dout.dim(3);
  const int64_t hs = attention.stage_q_heads(), ks = attention.stage_kv_heads();
  for (int stage = 0; stage < attention.head_chunks(); ++stage) {
    auto q_first = [&](int p) { return attention.stage_q_first(p, stage); };
    auto kv_first = [&](int p) { return attention.stage_kv_first(p, stage); };
    const StageTensors& t = stages[size_t(stage)];
    auto heads = [&](int64_t n) {
      return backend.alloc(MemCategory::attention, DType::f32, {B, N, n, d}, "test heads");
    };
    Buffer dout_full = heads(hs), dq_full = heads(hs), dk_full = heads(ks), dv_full = heads(ks);
    HeadExchange in = attention.start_stage_to_heads(dout, stage, dout_full);
    attention.finish(in);
    attention.local_backward(dq_full, dk_full, dv_full, dout_full, t.q, t.k, t.v, t.out, t.lse);
    for (const auto& [full, target, n, first] :
         {std::tuple{&dq_full, &dq, hs, std::function<int(int)>(q_first)},
          std::tuple{&dk_full, &dk, ks, std::function<int(int)>(kv_first)},
          std::tuple{&dv_full, &dv, ks, std::function<int(int)>(kv_first)}}) {
      HeadExchange back = attention.start_heads_to_packed(*full, B, Tl);
      attention.finish(back);
      add_unpacked(back.recv, *target, P, n, first);
    }
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
  std::vector<float> out_mine(q_mine.size(), NAN), dq_mine(q_mine.size(), 0.0f);
  std::vector<float> dk_mine(k_mine.size(), 0.0f), dv_mine(v_mine.size(), 0.0f);
  Tensor q_t(q_mine.data(), DType::f32, {B, Tl, H, d});
  Tensor k_t(k_mine.data(), DType::f32, {B, Tl, Hkv, d});
  Tensor v_t(v_mine.data(), DType::f32, {B, Tl, Hkv, d});
  Tensor out_t(out_mine.data(), DType::f32, {B, Tl, H, d});

  UlyssesAttention attention(backend, sp_comm, int(H), int(Hkv), int(d), c.stages);
  sp_comm.reset_stats();
  {
    const std::vector<StageTensors> stages = forward(backend, attention, q_t, k_t, v_t, out_t);
    backward(backend, attention, Tensor(dout_mine.data(), DType::f32, {B, Tl, H, d}), stages,
             Tensor(dq_mine.data(), DType::f32, {B, Tl, H, d}),
             Tensor(dk_mine.data(), DType::f32, {B, Tl, Hkv, d}),
             Tensor(dv_mine.data(), DType::f32, {B, Tl, Hkv, d}));
  }
  // No buffer is left behind, and the exchanges held one stage's send and receive buffers
  // at a time: [B, Tl, H/U, d] each.
  EXPECT_EQ(backend.memory().current(MemCategory::attention), 0);
  EXPECT_EQ(backend.memory().current(MemCategory::comm), 0);
  EXPECT_EQ(backend.memory().peak(MemCategory::comm), 2 * B * Tl * (H / c.stages) * d * 4);

  const double tolerance = 1e-5;
  EXPECT_LE(relative_error(out_mine, token_slice(out_ref, B, N, q_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dq_mine, token_slice(dq_ref, B, N, q_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dk_mine, token_slice(dk_ref, B, N, kv_row, begin, Tl)), tolerance);
  EXPECT_LE(relative_error(dv_mine, token_slice(dv_ref, B, N, kv_row, begin, Tl)), tolerance);

  // 8 all-to-alls per stage (q, k, v, out; dout, dq, dk, dv), each sending (P-1)/P of its
  // send buffer to the other ranks: blocks of [B, Tl, H/(P·U), d] for q-like tensors and of
  // [B, Tl, hk, d] for kv (a stage's share of the kv heads, or the one replicated head).
  const int64_t hs = H / P / c.stages;
  const int64_t hk = std::max<int64_t>(1, hs / (H / Hkv));
  EXPECT_EQ(attention.stage_kv_heads(), hk);
  const int64_t q_like = (P - 1) * B * Tl * hs * d * 4;
  const int64_t kv_like = (P - 1) * B * Tl * hk * d * 4;
  EXPECT_EQ(sp_comm.stats().all_to_all_bytes, c.stages * (4 * q_like + 4 * kv_like));
  EXPECT_EQ(sp_comm.stats().calls, 8 * c.stages);
}

INSTANTIATE_TEST_SUITE_P(
    Heads, UlyssesAttentionTest,
    ::testing::Values(Case{1, 4, 4}, Case{1, 4, 2}, Case{1, 4, 2, 2},        // one rank
                      Case{2, 8, 8}, Case{2, 8, 2}, Case{2, 8, 4},           // kv heads split
                      Case{2, 8, 1}, Case{2, 2, 1},                          // kv head replicated
                      Case{4, 8, 8}, Case{4, 8, 4}, Case{4, 4, 4},           // kv heads split
                      Case{4, 8, 1}, Case{4, 8, 2}, Case{4, 4, 1},           // kv heads replicated
                      Case{2, 8, 8, 2}, Case{2, 8, 2, 4}, Case{2, 8, 1, 2},  // stages
                      Case{4, 8, 8, 2}, Case{4, 8, 2, 2}),
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
  auto make = [&](std::initializer_list<int64_t> dims) {
    return backend.alloc(MemCategory::attention, DType::f32, dims, "test");
  };
  Buffer tokens = make({2, 3, 2 * P, 4}), heads = make({2, 3 * P, 2, 4});
  Buffer short_heads = make({2, 2 * P, 2, 4}), narrow_tokens = make({2, 3, P, 4});
  Buffer send = make({P, 2, 3, 8}), short_send = make({P, 2, 2, 8});
  EXPECT_THROW(attention.start_stage_to_tokens(short_heads, 0, tokens), std::invalid_argument);
  EXPECT_THROW(attention.start_stage_to_heads(narrow_tokens, 0, heads), std::invalid_argument);
  EXPECT_THROW(attention.start_packed_to_heads(std::move(short_send), heads),
               std::invalid_argument);
  EXPECT_THROW(attention.start_heads_to_packed(short_heads, 2, 3), std::invalid_argument);
  EXPECT_EQ(world().stats().calls, 0);
  HeadExchange fits = attention.start_packed_to_heads(std::move(send), heads);
  attention.finish(fits);
  EXPECT_EQ(world().stats().calls, 1);
}

}  // namespace
}  // namespace ulysses
