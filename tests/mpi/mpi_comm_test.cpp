// MpiComm under mpiexec: every collective (blocking and non-blocking) moves the right data,
// counts the right bytes, and still works when blocks are split into several MPI calls; the
// dp × sp mesh forms the documented groups.
#include "parallel/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/mesh.h"
#include "parallel/progress_thread.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

using testing::MpiTest;

// Each test runs on a fresh communicator over all ranks (fresh stats), once with MPI calls as
// large as MPI allows and once with at most 3 elements (or bytes) per call, so that the
// splitting of big transfers is exercised on small buffers.
class Collectives : public MpiTest, public ::testing::WithParamInterface<int64_t> {
 protected:
  void SetUp() override {
    owned_ = world().split(0, world().rank(), "test");
    comm_ = dynamic_cast<MpiComm*>(owned_.get());
    ASSERT_NE(comm_, nullptr);
    comm_->set_max_count_per_call(GetParam());
    rank_ = comm_->rank();
    size_ = comm_->size();
  }

  MpiComm& comm() { return *comm_; }

  std::unique_ptr<Comm> owned_;
  MpiComm* comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

// A value that names who sent it, to whom, and which element it is.
float tagged(int from, int to, int64_t element) {
  return float(1000 * from + 100 * to + element);
}

TEST_P(Collectives, AllToAllSendsBlockJToRankJ) {
  const int64_t block = 5;
  std::vector<float> send(size_t(block * size_)), recv(send.size(), -1.0f);
  for (int to = 0; to < size_; ++to)
    for (int64_t e = 0; e < block; ++e) send[size_t(to * block + e)] = tagged(rank_, to, e);
  comm().all_to_all(Tensor(send.data(), DType::f32, {size_, block}),
                    Tensor(recv.data(), DType::f32, {size_, block}));
  for (int from = 0; from < size_; ++from)
    for (int64_t e = 0; e < block; ++e)
      EXPECT_EQ(recv[size_t(from * block + e)], tagged(from, rank_, e));
  EXPECT_EQ(comm().stats().all_to_all_bytes, (size_ - 1) * block * 4);
  EXPECT_GT(comm().stats().all_to_all_seconds, 0.0);
  EXPECT_EQ(comm().stats().calls, 1);
}

TEST_P(Collectives, AllToAllAsyncOnIntegers) {
  const int64_t block = 4;
  std::vector<int32_t> send(size_t(block * size_)), recv(send.size(), -1);
  for (int to = 0; to < size_; ++to)
    for (int64_t e = 0; e < block; ++e)
      send[size_t(to * block + e)] = int32_t(tagged(rank_, to, e)) - 50000;
  CommHandle handle = comm().all_to_all_async(Tensor(send.data(), DType::i32, {size_ * block}),
                                              Tensor(recv.data(), DType::i32, {size_ * block}));
  EXPECT_EQ(comm().stats().all_to_all_bytes, (size_ - 1) * block * 4);
  handle->wait();
  handle->wait();  // a second wait is harmless
  for (int from = 0; from < size_; ++from)
    for (int64_t e = 0; e < block; ++e)
      EXPECT_EQ(recv[size_t(from * block + e)], int32_t(tagged(from, rank_, e)) - 50000);
  EXPECT_GT(comm().stats().all_to_all_seconds, 0.0);
  EXPECT_EQ(comm().stats().calls, 1);
}

// A per-rank value whose sum and max over ranks differ from any single rank's.
float contribution(int rank, int64_t element) {
  return float((rank * 7 + element * 3) % 11) - 4.5f;
}

TEST_P(Collectives, AllReduceSumAndMax) {
  const int64_t n = 7;
  std::vector<float> sum(n), max(n);
  std::vector<int32_t> sum_i(n);
  for (int64_t e = 0; e < n; ++e) {
    sum[e] = max[e] = contribution(rank_, e);
    sum_i[e] = int32_t(2 * contribution(rank_, e));
  }
  comm().all_reduce(Tensor(sum.data(), DType::f32, {n}), ReduceOp::sum);
  comm().all_reduce(Tensor(max.data(), DType::f32, {n}), ReduceOp::max);
  comm().all_reduce_async(Tensor(sum_i.data(), DType::i32, {n}), ReduceOp::sum)->wait();
  for (int64_t e = 0; e < n; ++e) {
    float expected_sum = 0.0f, expected_max = -1e30f;
    int32_t expected_sum_i = 0;
    for (int r = 0; r < size_; ++r) {
      expected_sum += contribution(r, e);
      expected_max = std::max(expected_max, contribution(r, e));
      expected_sum_i += int32_t(2 * contribution(r, e));
    }
    EXPECT_FLOAT_EQ(sum[e], expected_sum) << e;
    EXPECT_EQ(max[e], expected_max) << e;
    EXPECT_EQ(sum_i[e], expected_sum_i) << e;
  }
  EXPECT_EQ(comm().stats().reduce_bytes, 3 * n * 4);
  EXPECT_GT(comm().stats().reduce_seconds, 0.0);
  EXPECT_EQ(comm().stats().calls, 3);
}

TEST_P(Collectives, AllReduceHostDoubles) {
  double values[2] = {double(rank_) + 0.25, double(-rank_)};
  comm().all_reduce_host(values, 2, ReduceOp::sum);
  EXPECT_DOUBLE_EQ(values[0], size_ * (size_ - 1) / 2.0 + 0.25 * size_);
  EXPECT_DOUBLE_EQ(values[1], -size_ * (size_ - 1) / 2.0);
  double largest = double(rank_);
  comm().all_reduce_host(&largest, 1, ReduceOp::max);
  EXPECT_EQ(largest, double(size_ - 1));
  EXPECT_EQ(comm().stats().reduce_bytes, 3 * 8);
}

TEST_P(Collectives, ReduceScatterGivesRankRItsReducedBlock) {
  const int64_t block = 5;
  std::vector<float> send(size_t(block * size_));
  for (int64_t i = 0; i < block * size_; ++i) send[size_t(i)] = contribution(rank_, i);
  std::vector<float> sum(block, -1.0f), max(block, -1.0f);
  comm().reduce_scatter(Tensor(send.data(), DType::f32, {block * size_}),
                        Tensor(sum.data(), DType::f32, {block}), ReduceOp::sum);
  comm()
      .reduce_scatter_async(Tensor(send.data(), DType::f32, {block * size_}),
                            Tensor(max.data(), DType::f32, {block}), ReduceOp::max)
      ->wait();
  for (int64_t e = 0; e < block; ++e) {
    float expected_sum = 0.0f, expected_max = -1e30f;
    for (int r = 0; r < size_; ++r) {
      expected_sum += contribution(r, rank_ * block + e);
      expected_max = std::max(expected_max, contribution(r, rank_ * block + e));
    }
    EXPECT_FLOAT_EQ(sum[e], expected_sum) << e;
    EXPECT_EQ(max[e], expected_max) << e;
  }
  EXPECT_EQ(comm().stats().reduce_bytes, 2 * size_ * block * 4);
  EXPECT_EQ(comm().stats().calls, 2);
}

TEST_P(Collectives, AllGatherPutsRankRAtBlockR) {
  const int64_t block = 7;
  std::vector<float> send(block);
  for (int64_t e = 0; e < block; ++e) send[e] = tagged(rank_, 0, e);
  std::vector<float> recv(size_t(block * size_), -1.0f), recv_async(recv.size(), -1.0f);
  comm().all_gather(Tensor(send.data(), DType::f32, {block}),
                    Tensor(recv.data(), DType::f32, {size_, block}));
  CommHandle handle =
      comm().all_gather_async(Tensor(send.data(), DType::f32, {block}),
                              Tensor(recv_async.data(), DType::f32, {size_, block}));
  handle->wait();
  for (int from = 0; from < size_; ++from)
    for (int64_t e = 0; e < block; ++e) {
      EXPECT_EQ(recv[size_t(from * block + e)], tagged(from, 0, e));
      EXPECT_EQ(recv_async[size_t(from * block + e)], tagged(from, 0, e));
    }
  EXPECT_EQ(comm().stats().gather_bytes, 2 * block * 4);
  EXPECT_GT(comm().stats().gather_seconds, 0.0);
}

TEST_P(Collectives, BroadcastFromTheLastRank) {
  const int root = size_ - 1;
  std::string text = rank_ == root ? "from the root" : "-------------";
  comm().broadcast_host(text.data(), int64_t(text.size()), root);
  EXPECT_EQ(text, "from the root");
  EXPECT_EQ(comm().stats().gather_bytes, 13);
  EXPECT_EQ(comm().stats().calls, 1);
}

TEST_P(Collectives, ManyOperationsInFlightAtOnce) {
  const int64_t block = 6;
  std::vector<float> send(size_t(block * size_)), recv(send.size());
  for (int to = 0; to < size_; ++to)
    for (int64_t e = 0; e < block; ++e) send[size_t(to * block + e)] = tagged(rank_, to, e);
  std::vector<float> reduced(4, float(rank_ + 1));
  std::vector<float> gathered(size_, -1.0f), mine(1, float(rank_));

  CommHandle exchange = comm().all_to_all_async(Tensor(send.data(), DType::f32, {block * size_}),
                                                Tensor(recv.data(), DType::f32, {block * size_}));
  CommHandle reduce =
      comm().all_reduce_async(Tensor(reduced.data(), DType::f32, {4}), ReduceOp::sum);
  CommHandle gather = comm().all_gather_async(Tensor(mine.data(), DType::f32, {1}),
                                              Tensor(gathered.data(), DType::f32, {size_}));
  gather->wait();
  reduce->wait();
  exchange->wait();

  for (int from = 0; from < size_; ++from) {
    EXPECT_EQ(gathered[from], float(from));
    for (int64_t e = 0; e < block; ++e)
      EXPECT_EQ(recv[size_t(from * block + e)], tagged(from, rank_, e));
  }
  for (float value : reduced) EXPECT_EQ(value, float(size_ * (size_ + 1) / 2));
  EXPECT_EQ(comm().stats().calls, 3);
}

TEST_P(Collectives, HandleDroppedWithoutWaitStillCompletes) {
  std::vector<float> data(3, 1.0f);
  comm().all_reduce_async(Tensor(data.data(), DType::f32, {3}), ReduceOp::sum);
  for (float value : data) EXPECT_EQ(value, float(size_));
}

TEST_P(Collectives, BarrierCountsACall) {
  comm().barrier();
  EXPECT_EQ(comm().stats().calls, 1);
  EXPECT_EQ(
      comm().stats().all_to_all_bytes + comm().stats().reduce_bytes + comm().stats().gather_bytes,
      0);
}

// bf16 moves as its bit pattern and reduces in float, rounded to bf16. The values here and
// their partial sums in any order are exact in bf16, so every rank must see exactly these.
TEST_P(Collectives, Bf16MovesAndReducesLikeFloat) {
  auto bf16 = [](float value) { return float_to_bf16(value); };
  // Distinct for every (from, to, element) here and below 256, so exact in bf16.
  auto tagged = [](int from, int to, int64_t element) {
    return float(32 * from + 8 * to + element);
  };
  const int64_t block = 5;
  std::vector<uint16_t> send(size_t(block * size_)), recv(send.size());
  for (int to = 0; to < size_; ++to)
    for (int64_t e = 0; e < block; ++e) send[size_t(to * block + e)] = bf16(tagged(rank_, to, e));
  comm().all_to_all(Tensor(send.data(), DType::bf16, {block * size_}),
                    Tensor(recv.data(), DType::bf16, {block * size_}));
  for (int from = 0; from < size_; ++from)
    for (int64_t e = 0; e < block; ++e)
      EXPECT_EQ(recv[size_t(from * block + e)], bf16(tagged(from, rank_, e)));

  std::vector<uint16_t> sum(size_t(block * size_)), max(sum.size()), scattered(block);
  for (int64_t e = 0; e < block * size_; ++e) sum[e] = max[e] = bf16(contribution(rank_, e));
  comm()
      .reduce_scatter_async(Tensor(sum.data(), DType::bf16, {block * size_}),
                            Tensor(scattered.data(), DType::bf16, {block}), ReduceOp::sum)
      ->wait();
  comm().all_reduce(Tensor(sum.data(), DType::bf16, {block * size_}), ReduceOp::sum);
  comm().all_reduce(Tensor(max.data(), DType::bf16, {block * size_}), ReduceOp::max);
  for (int64_t e = 0; e < block * size_; ++e) {
    float expected_sum = 0.0f, expected_max = -1e30f;
    for (int r = 0; r < size_; ++r) {
      expected_sum += contribution(r, e);
      expected_max = std::max(expected_max, contribution(r, e));
    }
    EXPECT_EQ(bf16_to_float(sum[e]), expected_sum) << e;
    EXPECT_EQ(bf16_to_float(max[e]), expected_max) << e;
    if (e / block == rank_) EXPECT_EQ(scattered[e % block], sum[e]) << e;
  }

  std::vector<uint16_t> gathered(size_t(block * size_)), mine(block);
  for (int64_t e = 0; e < block; ++e) mine[e] = bf16(tagged(rank_, 0, e));
  comm().all_gather(Tensor(mine.data(), DType::bf16, {block}),
                    Tensor(gathered.data(), DType::bf16, {block * size_}));
  for (int from = 0; from < size_; ++from)
    for (int64_t e = 0; e < block; ++e)
      EXPECT_EQ(gathered[size_t(from * block + e)], bf16(tagged(from, 0, e)));
  EXPECT_EQ(comm().stats().all_to_all_bytes, (size_ - 1) * block * 2);
  EXPECT_EQ(comm().stats().reduce_bytes, 3 * block * size_ * 2);
}

INSTANTIATE_TEST_SUITE_P(CallSizes, Collectives, ::testing::Values(int64_t(INT_MAX), int64_t(3)),
                         [](const ::testing::TestParamInfo<int64_t>& call_size) {
                           return call_size.param == INT_MAX ? std::string("Whole")
                                                             : std::string("SplitIntoPiecesOf3");
                         });

TEST_F(MpiTest, MisuseIsRejectedBeforeAnyCollective) {
  std::vector<float> floats(8);
  std::vector<uint16_t> halves(8);
  Tensor f32(floats.data(), DType::f32, {8});
  Tensor bf16(halves.data(), DType::bf16, {8});
  try {
    world().all_to_all(f32, bf16);
    ADD_FAILURE() << "an all-to-all from f32 into bf16 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("send is f32 but recv is bf16"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(world().all_to_all(f32, Tensor(floats.data(), DType::f32, {4})),
               std::invalid_argument);
  const int64_t not_divisible = world().size() + 1;  // at most 8 for up to 7 ranks
  EXPECT_THROW(world().all_to_all(Tensor(floats.data(), DType::f32, {not_divisible}),
                                  Tensor(floats.data(), DType::f32, {not_divisible})),
               std::invalid_argument);
  EXPECT_THROW(world().reduce_scatter(f32, f32, ReduceOp::sum), std::invalid_argument);
  EXPECT_THROW(world().all_gather(f32, f32), std::invalid_argument);
  EXPECT_THROW(world().broadcast_host(floats.data(), 8, world().size()), std::invalid_argument);
  EXPECT_THROW(world().split(-1, 0, "bad"), std::invalid_argument);
  EXPECT_THROW(dynamic_cast<MpiComm&>(world()).set_max_count_per_call(0), std::invalid_argument);
}

TEST_F(MpiTest, AllRanksShareThisNode) {
  EXPECT_EQ(ranks_on_this_node(world()), world().size());
}

// Gathers the world ranks of a group's members, in group rank order.
std::vector<int> members(Comm& group, int world_rank) {
  std::vector<int32_t> mine = {world_rank};
  std::vector<int32_t> all(size_t(group.size()));
  group.all_gather(Tensor(mine.data(), DType::i32, {1}),
                   Tensor(all.data(), DType::i32, {group.size()}));
  return std::vector<int>(all.begin(), all.end());
}

TEST_F(MpiTest, MeshGroupsForEverySpThatDividesTheWorld) {
  const int rank = world().rank(), ranks = world().size();
  for (int sp = 1; sp <= ranks; ++sp) {
    if (ranks % sp != 0) {
      EXPECT_THROW(make_mesh(world(), sp), std::invalid_argument) << "sp " << sp;
      continue;
    }
    Mesh mesh = make_mesh(world(), sp);
    EXPECT_EQ(mesh.world, &world());
    EXPECT_EQ(mesh.sp_size, sp);
    EXPECT_EQ(mesh.dp_size, ranks / sp);
    EXPECT_EQ(mesh.sp_rank, rank % sp);
    EXPECT_EQ(mesh.dp_rank, rank / sp);
    EXPECT_EQ(mesh.sp->size(), sp);
    EXPECT_EQ(mesh.dp->size(), ranks / sp);
    EXPECT_EQ(mesh.sp->rank(), mesh.sp_rank);
    EXPECT_EQ(mesh.dp->rank(), mesh.dp_rank);
    EXPECT_EQ(mesh.sp->name(), "sp");
    EXPECT_EQ(mesh.dp->name(), "dp");

    std::vector<int> expected_sp, expected_dp;
    for (int i = 0; i < sp; ++i) expected_sp.push_back(mesh.dp_rank * sp + i);
    for (int i = 0; i < ranks / sp; ++i) expected_dp.push_back(i * sp + mesh.sp_rank);
    EXPECT_EQ(members(*mesh.sp, rank), expected_sp) << "sp " << sp;
    EXPECT_EQ(members(*mesh.dp, rank), expected_dp) << "sp " << sp;
  }
}

TEST_F(MpiTest, TwoByTwoMeshOnFourRanks) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Mesh mesh = make_mesh(world(), 2);
  const int rank = world().rank();
  // SP groups {0, 1} and {2, 3}; dp groups {0, 2} and {1, 3}.
  const std::vector<std::vector<int>> sp_groups = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> dp_groups = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members(*mesh.sp, rank), sp_groups[rank]);
  EXPECT_EQ(members(*mesh.dp, rank), dp_groups[rank]);

  // Collectives in a group stay in the group: a sum over sp adds the two partners only.
  double value = rank;
  mesh.sp->all_reduce_host(&value, 1, ReduceOp::sum);
  EXPECT_EQ(value, rank < 2 ? 1.0 : 5.0);
  double dp_value = rank;
  mesh.dp->all_reduce_host(&dp_value, 1, ReduceOp::sum);
  EXPECT_EQ(dp_value, rank % 2 == 0 ? 2.0 : 4.0);
  EXPECT_EQ(mesh.sp->stats().reduce_bytes, 8);
  EXPECT_EQ(mesh.dp->stats().reduce_bytes, 8);
}

// The progress thread polls MPI while an operation is in flight and the caller is busy
// elsewhere, stops when nothing is in flight, and changes no result. Deadlines, not fixed
// sleeps: four ranks with a thread each on two loaded cores may wait long for a time slice.
TEST_F(MpiTest, ProgressThreadPollsWhileAnOperationIsInFlightAndOnlyThen) {
  if (!mpi_thread_multiple()) GTEST_SKIP() << "this MPI library did not grant THREAD_MULTIPLE";
  using std::chrono::milliseconds;
  std::unique_ptr<Comm> owned = world().split(0, world().rank(), "progress");
  auto* comm = dynamic_cast<MpiComm*>(owned.get());
  ASSERT_NE(comm, nullptr);
  comm->start_progress_thread();
  const ProgressThread& progress = *comm->progress_thread();
  std::vector<float> values(1 << 20, float(comm->rank() + 1));
  const int64_t before = progress.polls();
  CommHandle sum = comm->all_reduce_async(
      Tensor(values.data(), DType::f32, {int64_t(values.size())}), ReduceOp::sum);
  // "Compute": the caller makes no MPI call; the thread polls until the caller waits.
  for (int waited_ms = 0; progress.polls() <= before + 10 && waited_ms < 10000; waited_ms += 5)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_GT(progress.polls(), before + 10) << "the thread did not poll while the sum travelled";
  sum->wait();
  const float expected = float(comm->size() * (comm->size() + 1) / 2);
  EXPECT_EQ(values.front(), expected);
  EXPECT_EQ(values.back(), expected);
  // Idle: some 30 ms window soon shows no poll at all (a thread that kept polling never would).
  bool stopped = false;
  for (int tries = 0; tries < 100 && !stopped; ++tries) {
    const int64_t idle = progress.polls();
    std::this_thread::sleep_for(milliseconds(30));
    stopped = progress.polls() == idle;
  }
  EXPECT_TRUE(stopped) << "the thread kept polling with nothing in flight";
}

}  // namespace
}  // namespace ulysses
