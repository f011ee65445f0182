// The one-rank communicator: collectives are copies or no-ops, stats are counted the way
// MpiComm counts them, and the mesh works on it.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "parallel/comm.h"
#include "parallel/local_comm.h"
#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"

namespace ulysses {
namespace {

std::vector<float> iota_floats(size_t count, float first) {
  std::vector<float> values(count);
  std::iota(values.begin(), values.end(), first);
  return values;
}

TEST(LocalComm, IsOneRankWithItsName) {
  auto comm = make_local_comm("sp");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "sp");
  EXPECT_EQ(make_local_comm()->name(), "world");
}

TEST(LocalComm, AllToAllCopiesAndSendsNothingToOthers) {
  auto comm = make_local_comm();
  std::vector<float> send = iota_floats(12, 1.0f), recv(12, 0.0f);
  comm->all_to_all(Tensor(send.data(), DType::f32, {3, 4}), Tensor(recv.data(), DType::f32, {12}));
  EXPECT_EQ(recv, send);
  EXPECT_EQ(comm->stats().all_to_all_bytes, 0);
  EXPECT_EQ(comm->stats().calls, 1);

  std::vector<int32_t> send_i = {5, -6, 7}, recv_i(3, 0);
  comm->all_to_all_async(Tensor(send_i.data(), DType::i32, {3}),
                         Tensor(recv_i.data(), DType::i32, {3}))
      ->wait();
  EXPECT_EQ(recv_i, send_i);
  EXPECT_EQ(comm->stats().all_to_all_bytes, 0);
  EXPECT_EQ(comm->stats().calls, 2);
}

TEST(LocalComm, ReductionsLeaveDataAndCountBytes) {
  auto comm = make_local_comm();
  std::vector<float> data = {1.5f, -2.0f, 3.0f};
  comm->all_reduce(Tensor(data.data(), DType::f32, {3}), ReduceOp::sum);
  comm->all_reduce_async(Tensor(data.data(), DType::f32, {3}), ReduceOp::max)->wait();
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  double host[2] = {4.0, 5.0};
  comm->all_reduce_host(host, 2, ReduceOp::sum);
  EXPECT_EQ(host[0], 4.0);
  EXPECT_EQ(host[1], 5.0);
  EXPECT_EQ(comm->stats().reduce_bytes, 3 * 4 + 3 * 4 + 2 * 8);
  EXPECT_EQ(comm->stats().calls, 3);
}

TEST(LocalComm, ReduceScatterAndAllGatherCopy) {
  auto comm = make_local_comm();
  std::vector<float> send = iota_floats(5, 0.5f), recv(5, 0.0f);
  comm->reduce_scatter(Tensor(send.data(), DType::f32, {5}), Tensor(recv.data(), DType::f32, {5}),
                       ReduceOp::sum);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(comm->stats().reduce_bytes, 20);

  std::vector<float> gathered(5, 0.0f);
  comm->all_gather_async(Tensor(send.data(), DType::f32, {5}),
                         Tensor(gathered.data(), DType::f32, {5}))
      ->wait();
  EXPECT_EQ(gathered, send);
  EXPECT_EQ(comm->stats().gather_bytes, 20);

  std::vector<float> scattered(5, 0.0f);
  comm->reduce_scatter_async(Tensor(send.data(), DType::f32, {5}),
                             Tensor(scattered.data(), DType::f32, {5}), ReduceOp::max)
      ->wait();
  EXPECT_EQ(scattered, send);
  EXPECT_EQ(comm->stats().calls, 3);

  std::vector<float> wrong(4);
  EXPECT_THROW(
      comm->all_gather(Tensor(send.data(), DType::f32, {5}), Tensor(wrong.data(), DType::f32, {4})),
      std::invalid_argument);
  EXPECT_THROW(comm->reduce_scatter(Tensor(send.data(), DType::f32, {5}),
                                    Tensor(wrong.data(), DType::f32, {4}), ReduceOp::sum),
               std::invalid_argument);
  std::vector<int32_t> ints(5);
  EXPECT_THROW(
      comm->all_to_all(Tensor(send.data(), DType::f32, {5}), Tensor(ints.data(), DType::i32, {5})),
      std::invalid_argument);
}

TEST(LocalComm, BroadcastFromRankZeroOnly) {
  auto comm = make_local_comm();
  char text[3] = {'a', 'b', 'c'};
  comm->broadcast_host(text, 3, 0);
  EXPECT_EQ(text[2], 'c');
  EXPECT_EQ(comm->stats().gather_bytes, 3);
  EXPECT_THROW(comm->broadcast_host(text, 3, 1), std::invalid_argument);
  EXPECT_THROW(comm->broadcast_host(text, 3, -1), std::invalid_argument);
  comm->barrier();
  EXPECT_EQ(comm->stats().calls, 2);
  comm->reset_stats();
  EXPECT_EQ(comm->stats().calls, 0);
  EXPECT_EQ(comm->stats().gather_bytes, 0);
}

TEST(LocalComm, SplitGivesALocalCommWithTheNewName) {
  auto world = make_local_comm();
  auto group = world->split(7, 3, "dp");
  EXPECT_EQ(group->name(), "dp");
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(ranks_on_this_node(*world), 1);
}

TEST(LocalComm, MeshOfOneRank) {
  auto world = make_local_comm();
  Mesh mesh = make_mesh(*world, 1);
  EXPECT_EQ(mesh.world, world.get());
  EXPECT_EQ(mesh.sp_size, 1);
  EXPECT_EQ(mesh.dp_size, 1);
  EXPECT_EQ(mesh.sp_rank, 0);
  EXPECT_EQ(mesh.dp_rank, 0);
  EXPECT_EQ(mesh.sp->name(), "sp");
  EXPECT_EQ(mesh.dp->name(), "dp");
  EXPECT_EQ(mesh.sp->size(), 1);
  EXPECT_EQ(mesh.dp->size(), 1);
  EXPECT_THROW(make_mesh(*world, 2), std::invalid_argument);
  EXPECT_THROW(make_mesh(*world, 0), std::invalid_argument);
}

// How logs and reports name a mesh: the ring only where there is one.
TEST(LocalComm, MeshTextNamesTheRingWhereThereIsOne) {
  EXPECT_EQ(mesh_text(8, 4, 1), "dp 2 x sp 4");
  EXPECT_EQ(mesh_text(8, 4, 2), "dp 2 x sp 4 (Ulysses 2 x ring 2)");
  EXPECT_EQ(mesh_text(4, 4, 4), "dp 1 x sp 4 (Ulysses 1 x ring 4)");
}

TEST(LocalComm, CopiesThroughTheBackendWhenGivenOne) {
  CpuBackend backend;
  auto comm = make_local_comm(backend, "sp");
  EXPECT_EQ(comm->name(), "sp");
  Buffer send = backend.alloc(MemCategory::comm, DType::f32, {2, 3}, "send");
  Buffer recv = backend.alloc(MemCategory::comm, DType::f32, {6}, "recv");
  std::vector<float> values = iota_floats(6, -2.0f);
  backend.upload(send, values.data());
  backend.fill_zero(recv);
  comm->all_gather(send, recv);
  std::vector<float> result(6);
  backend.download(result.data(), recv);
  EXPECT_EQ(result, values);
  EXPECT_EQ(comm->split(0, 0, "dp")->size(), 1);
}

TEST(LocalCommDeathTest, AbortExitsWithTheCode) {
  auto comm = make_local_comm();
  EXPECT_EXIT(comm->abort(3), ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace ulysses
