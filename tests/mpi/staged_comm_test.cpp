// StagedComm under mpiexec: every collective on backend buffers gives exactly what MpiComm
// gives on the same values in host memory (f32, bf16 and i32), with the same byte counts;
// several operations can be in flight; staging blocks are reused; splits stay staged. Runs
// on the cpu backend everywhere and on the cuda backend where a GPU is present.
#include "parallel/staged_comm.h"

#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses {
namespace {

using Bytes = std::vector<char>;

// Values that differ per rank, element and seed, in the dtype's host representation.
Bytes values(DType dtype, int64_t count, int rank, int seed) {
  std::mt19937 engine(uint32_t(1000 * seed + rank));
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  Bytes bytes(size_t(count) * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float value = uniform(engine);
    if (dtype == DType::f32) {
      std::memcpy(&bytes[size_t(i) * 4], &value, 4);
    } else if (dtype == DType::bf16) {
      const uint16_t bits = float_to_bf16(value);
      std::memcpy(&bytes[size_t(i) * 2], &bits, 2);
    } else {
      const int32_t whole = int32_t(value * 1000.0f);
      std::memcpy(&bytes[size_t(i) * 4], &whole, 4);
    }
  }
  return bytes;
}

Tensor host_tensor(Bytes& bytes, DType dtype) {
  return Tensor(bytes.data(), dtype, {int64_t(bytes.size() / dtype_size(dtype))});
}

class StagedCollectives : public testing::MpiTest,
                          public ::testing::WithParamInterface<BackendKind> {
 protected:
  void SetUp() override {
    try {
      backend_ = make_backend(GetParam(), 0);
    } catch (const DeviceUnavailableError& error) {
      GTEST_SKIP() << error.what();
    }
    staged_ = std::make_unique<StagedComm>(world().split(0, world().rank(), "staged"), *backend_);
    direct_ = world().split(0, world().rank(), "direct");
    rank_ = world().rank();
    size_ = world().size();
  }

  // A backend buffer holding bytes.
  Buffer on_device(const Bytes& bytes, DType dtype) {
    Buffer buffer = backend_->alloc(MemCategory::comm, dtype,
                                    {int64_t(bytes.size() / dtype_size(dtype))}, "test");
    backend_->upload(buffer, bytes.data());
    return buffer;
  }

  Bytes from_device(const Tensor& tensor) {
    Bytes bytes(tensor.bytes());
    backend_->download(bytes.data(), tensor);
    return bytes;
  }

  void expect_same_counts() {
    EXPECT_EQ(staged_->stats().all_to_all_bytes, direct_->stats().all_to_all_bytes);
    EXPECT_EQ(staged_->stats().reduce_bytes, direct_->stats().reduce_bytes);
    EXPECT_EQ(staged_->stats().gather_bytes, direct_->stats().gather_bytes);
    EXPECT_EQ(staged_->stats().calls, direct_->stats().calls);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StagedComm> staged_;
  std::unique_ptr<Comm> direct_;
  int rank_ = 0;
  int size_ = 1;
};

const DType kDtypes[] = {DType::f32, DType::bf16, DType::i32};

TEST_P(StagedCollectives, AllToAllAndAllGatherMatchMpiComm) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t block = 7;
    Bytes send = values(dtype, block * size_, rank_, 1);
    Bytes expected(send.size()), expected_gather(send.size());
    direct_->all_to_all(host_tensor(send, dtype), host_tensor(expected, dtype));
    Bytes mine(send.begin(), send.begin() + long(block * int64_t(dtype_size(dtype))));
    direct_->all_gather(host_tensor(mine, dtype), host_tensor(expected_gather, dtype));

    Buffer device_send = on_device(send, dtype), device_mine = on_device(mine, dtype);
    Buffer recv = on_device(Bytes(send.size()), dtype);
    Buffer recv_async = on_device(Bytes(send.size()), dtype);
    Buffer gathered = on_device(Bytes(send.size()), dtype);
    staged_->all_to_all(device_send, recv);
    CommHandle exchange = staged_->all_to_all_async(device_send, recv_async);
    CommHandle gather = staged_->all_gather_async(device_mine, gathered);
    gather->wait();
    exchange->wait();
    EXPECT_EQ(from_device(recv), expected);
    EXPECT_EQ(from_device(recv_async), expected);
    EXPECT_EQ(from_device(gathered), expected_gather);
    direct_->all_to_all(host_tensor(send, dtype), host_tensor(expected, dtype));  // for the counts
  }
  expect_same_counts();
  EXPECT_GT(staged_->stats().all_to_all_seconds, 0.0);
  EXPECT_GT(staged_->stats().gather_seconds, 0.0);
}

// Pipelined in pieces (uneven: 3 pieces of a 22-element block are 8, 8 and 6), the blocking and
// the non-blocking all-to-all move the same bytes as MpiComm on host copies, counted as one
// exchange each; the staging blocks are reused from call to call.
TEST_P(StagedCollectives, PipelinedAllToAllMatchesMpiComm) {
  staged_->set_pipeline(3, 1);
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t block = 22;
    Bytes send = values(dtype, block * size_, rank_, 3);
    Bytes expected(send.size());
    direct_->all_to_all(host_tensor(send, dtype), host_tensor(expected, dtype));
    direct_->all_to_all(host_tensor(send, dtype), host_tensor(expected, dtype));
    Buffer device_send = on_device(send, dtype);
    Buffer recv = on_device(Bytes(send.size()), dtype);
    Buffer recv_async = on_device(Bytes(send.size()), dtype);
    staged_->all_to_all(device_send, recv);
    const size_t held = staged_->staging_bytes();
    CommHandle exchange = staged_->all_to_all_async(device_send, recv_async);
    exchange->wait();
    EXPECT_EQ(from_device(recv), expected);
    EXPECT_EQ(from_device(recv_async), expected);
    EXPECT_EQ(staged_->staging_bytes(), held) << "pieces must reuse the staging blocks";
  }
  expect_same_counts();
}

TEST_P(StagedCollectives, ReductionsMatchMpiComm) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t block = 5;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      Bytes data = values(dtype, block * size_, rank_, 2);
      Bytes reduced = data, scattered(size_t(block) * dtype_size(dtype));
      direct_->all_reduce(host_tensor(reduced, dtype), op);
      direct_->reduce_scatter(host_tensor(data, dtype), host_tensor(scattered, dtype), op);

      Buffer in_place = on_device(data, dtype), in_place_async = on_device(data, dtype);
      Buffer source = on_device(data, dtype), part = on_device(Bytes(scattered.size()), dtype);
      staged_->all_reduce(in_place, op);
      CommHandle reduce = staged_->all_reduce_async(in_place_async, op);
      staged_->reduce_scatter_async(source, part, op)->wait();
      reduce->wait();
      EXPECT_EQ(from_device(in_place), reduced);
      EXPECT_EQ(from_device(in_place_async), reduced);
      EXPECT_EQ(from_device(part), scattered);
      direct_->all_reduce(host_tensor(data, dtype), op);  // for the counts
    }
  }
  expect_same_counts();
  EXPECT_GT(staged_->stats().reduce_seconds, 0.0);
}

TEST_P(StagedCollectives, HostValuesAndBarrier) {
  const int root = size_ - 1;
  double sum = rank_ + 1.0;
  staged_->all_reduce_host(&sum, 1, ReduceOp::sum);
  EXPECT_EQ(sum, size_ * (size_ + 1) / 2.0);
  std::string text = rank_ == root ? "root" : "....";
  staged_->broadcast_host(text.data(), 4, root);
  EXPECT_EQ(text, "root");
  staged_->barrier();
  EXPECT_EQ(staged_->stats().calls, 3);
}

TEST_P(StagedCollectives, StagingBlocksAreReusedAndReleasedAfterMisuse) {
  Bytes data = values(DType::f32, 1000, rank_, 6);
  Buffer device = on_device(data, DType::f32);
  staged_->all_reduce(device, ReduceOp::max);
  const size_t held = staged_->staging_bytes();
  EXPECT_GT(held, 0u);
  for (int i = 0; i < 10; ++i) staged_->all_reduce(device, ReduceOp::max);
  EXPECT_EQ(staged_->staging_bytes(), held);

  Buffer halves = on_device(Bytes(data.size() / 2), DType::bf16);
  try {
    staged_->all_to_all(device, halves);
    ADD_FAILURE() << "an all-to-all from f32 into bf16 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("send is f32 but recv is bf16"), std::string::npos)
        << error.what();
  }
  {
    Buffer dropped = on_device(data, DType::f32);
    staged_->all_reduce_async(dropped, ReduceOp::sum);  // destroyed at once: waits, uploads
    Bytes expected = data;
    direct_->all_reduce(host_tensor(expected, DType::f32), ReduceOp::sum);
    EXPECT_EQ(from_device(dropped), expected);
  }
  staged_->all_reduce(device, ReduceOp::max);
  EXPECT_EQ(staged_->staging_bytes(), held);
}

TEST_P(StagedCollectives, SplitGroupsAreStagedToo) {
  std::unique_ptr<Comm> half = staged_->split(rank_ % 2, rank_, "half");
  ASSERT_NE(dynamic_cast<StagedComm*>(half.get()), nullptr);
  EXPECT_EQ(half->name(), "half");
  EXPECT_EQ(half->size(), (size_ + 1 - rank_ % 2) / 2);
  std::vector<float> one = {float(rank_)};
  Bytes bytes(4);
  std::memcpy(bytes.data(), one.data(), 4);
  Buffer device = on_device(bytes, DType::f32);
  half->all_reduce(device, ReduceOp::sum);
  float sum = 0.0f;
  for (int r = rank_ % 2; r < size_; r += 2) sum += float(r);
  backend_->download(one.data(), device);
  EXPECT_EQ(one[0], sum);
}

INSTANTIATE_TEST_SUITE_P(Backends, StagedCollectives,
                         ::testing::Values(BackendKind::cpu, BackendKind::cuda),
                         [](const ::testing::TestParamInfo<BackendKind>& backend) {
                           return std::string(backend.param == BackendKind::cuda ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace ulysses
