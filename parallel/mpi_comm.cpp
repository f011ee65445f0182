#include "parallel/mpi_comm.h"

// The C API only: the MPI C++ bindings would need a library that ulysses does not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "kernels/stopwatch.h"
#include "parallel/comm_checks.h"
#include "parallel/progress_thread.h"
#include "parallel/watchdog.h"

namespace ulysses {

struct MpiComm::Native {
  MPI_Comm comm = MPI_COMM_NULL;
};

namespace {

void check_mpi(int code, const char* call, const std::string& comm_name) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(call) + " on communicator '" + comm_name +
                           "' failed: " + std::string(text, size_t(length)));
}

// bf16 travels as its 16-bit pattern; reductions on it use the operations below.
MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::bf16:
      return MPI_UINT16_T;
  }
  throw std::logic_error("mpi_type: unknown dtype");
}

// MPI has no bf16: element-wise sum and max of bf16 bit patterns, computed in float and
// rounded back to bf16 at every step, as a bf16 NCCL reduction does.
void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void bf16_max(void* in, void* inout, int* length, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i)
    b[i] = float_to_bf16(std::max(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

// The operation for reducing tensors of this dtype.
MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype != DType::bf16) return mpi_op(op);
  // Created once, after MPI_Init (the first reduction runs inside an MpiSession); MPI_Finalize
  // releases them.
  static const MPI_Op sum = [] {
    MPI_Op created;
    MPI_Op_create(bf16_sum, 1, &created);
    return created;
  }();
  static const MPI_Op max = [] {
    MPI_Op created;
    MPI_Op_create(bf16_max, 1, &created);
    return created;
  }();
  return op == ReduceOp::sum ? sum : max;
}

// Address of element `index` of a tensor.
char* element_at(const Tensor& tensor, int64_t index) {
  return static_cast<char*>(tensor.data) + index * int64_t(dtype_size(tensor.dtype));
}

// Calls fn(offset, length) over [0, count) in pieces of at most max_count elements.
template <typename Fn>
void for_each_chunk(int64_t count, int64_t max_count, Fn fn) {
  for (int64_t offset = 0; offset < count; offset += max_count)
    fn(offset, std::min(max_count, count - offset));
}

// `length` contiguous elements with an extent of `stride` elements. As the unit of a
// collective (count 1), block j then starts j·stride elements into the buffer, which lets one
// call move the same piece of every rank's block when the blocks are too big for an int.
MPI_Datatype strided_block_type(MPI_Datatype element, int64_t length, int64_t stride,
                                size_t element_bytes, const std::string& comm_name) {
  MPI_Datatype contiguous, strided;
  check_mpi(MPI_Type_contiguous(int(length), element, &contiguous), "MPI_Type_contiguous",
            comm_name);
  check_mpi(
      MPI_Type_create_resized(contiguous, 0, MPI_Aint(stride) * MPI_Aint(element_bytes), &strided),
      "MPI_Type_create_resized", comm_name);
  MPI_Type_free(&contiguous);
  check_mpi(MPI_Type_commit(&strided), "MPI_Type_commit", comm_name);
  return strided;
}

MPI_Comm native_with_errors_returned(MPI_Comm comm, const std::string& comm_name) {
  // Errors become exceptions with MPI's message instead of killing the process silently.
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", comm_name);
  return comm;
}

}  // namespace

// The MPI requests of one operation, and the datatypes they use. Blocking operations are
// issued non-blocking too and waited for at once: every wait polls under the watchdog.
class MpiComm::Request final : public CommRequest {
 public:
  Request(const MpiComm& comm, const char* collective, double* seconds)
      : comm_(comm), collective_(collective), seconds_(seconds) {
    if (comm_.progress_) comm_.progress_->started();
  }
  ~Request() override { wait_unless_done(); }

  std::vector<MPI_Request> requests;
  std::vector<MPI_Datatype> types;  // freed once the requests have completed

 private:
  void complete() override {
    int code = MPI_SUCCESS;
    wait_with_watchdog(
        comm_.watchdog().get(),
        [&] {
          int finished = 0;
          code = MPI_Testall(int(requests.size()), requests.data(), &finished, MPI_STATUSES_IGNORE);
          return finished != 0 || code != MPI_SUCCESS;
        },
        collective_, comm_.name(), [] { MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode); });
    if (comm_.progress_) comm_.progress_->finished();
    for (MPI_Datatype& type : types) MPI_Type_free(&type);
    if (seconds_) *seconds_ += clock_.seconds();
    check_mpi(code, "MPI_Testall", comm_.name());
  }

  const MpiComm& comm_;
  const char* collective_;
  double* seconds_;
  Stopwatch clock_;  // issue to completion
};

// ---- MpiSession ----------------------------------------------------------------------------

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized)
    throw std::logic_error("MPI is already initialised: create one MpiSession per process");
  // MPI_THREAD_MULTIPLE where the library grants it, for a progress thread
  // (parallel/progress_thread.h); the compute thread alone needs only funneled.
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread",
            "world");
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw std::runtime_error("this MPI library does not provide MPI_THREAD_FUNNELED");
  }
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Comm> MpiSession::world() {
  auto native = std::make_unique<MpiComm::Native>();
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &native->comm), "MPI_Comm_dup", "world");
  native_with_errors_returned(native->comm, "world");
  return std::make_unique<MpiComm>(std::move(native), "world");
}

// ---- MpiComm -------------------------------------------------------------------------------

MpiComm::MpiComm(std::unique_ptr<Native> native, const std::string& name)
    : native_(std::move(native)), name_(name), max_count_(INT_MAX) {
  check_mpi(MPI_Comm_rank(native_->comm, &rank_), "MPI_Comm_rank", name_);
  check_mpi(MPI_Comm_size(native_->comm, &size_), "MPI_Comm_size", name_);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && native_->comm != MPI_COMM_NULL) MPI_Comm_free(&native_->comm);
}

void MpiComm::set_max_count_per_call(int64_t count) {
  if (count < 1 || count > INT_MAX)
    throw std::invalid_argument("max_count_per_call must be in [1, INT_MAX], got " +
                                std::to_string(count));
  max_count_ = count;
}

int MpiComm::ranks_on_this_node() const {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(native_->comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", name_);
  int ranks = 1;
  MPI_Comm_size(node, &ranks);
  MPI_Comm_free(&node);
  return ranks;
}

int ranks_on_this_node(Comm& world) {
  auto* mpi = dynamic_cast<MpiComm*>(&world);
  return mpi ? mpi->ranks_on_this_node() : 1;
}

// ---- all-to-all ----------------------------------------------------------------------------

void MpiComm::issue_all_to_all(const Tensor& send, const Tensor& recv, Request& request) {
  MPI_Datatype type = mpi_type(send.dtype);
  MPI_Comm comm = native_->comm;
  int64_t block = send.numel() / size_;  // elements to each rank
  if (block <= max_count_) {
    int count = int(block);
    check_mpi(MPI_Ialltoall(send.data, count, type, recv.data, count, type, comm,
                            &request.requests.emplace_back()),
              "MPI_Ialltoall", name_);
    return;
  }
  for_each_chunk(block, max_count_, [&](int64_t offset, int64_t length) {
    MPI_Datatype piece = strided_block_type(type, length, block, dtype_size(send.dtype), name_);
    request.types.push_back(piece);
    check_mpi(MPI_Ialltoall(element_at(send, offset), 1, piece, element_at(recv, offset), 1, piece,
                            comm, &request.requests.emplace_back()),
              "MPI_Ialltoall", name_);
  });
}

CommHandle MpiComm::all_to_all_async(const Tensor& send, const Tensor& recv) {
  check_all_to_all_args(*this, send, recv);
  auto request = std::make_unique<Request>(*this, "all-to-all", &stats_.all_to_all_seconds);
  issue_all_to_all(send, recv, *request);
  stats_.all_to_all_bytes += int64_t(send.bytes()) / size_ * (size_ - 1);
  stats_.calls += 1;
  return request;
}

// ---- reductions ----------------------------------------------------------------------------

void MpiComm::issue_all_reduce(const Tensor& data, ReduceOp op, Request& request) {
  MPI_Datatype type = mpi_type(data.dtype);
  for_each_chunk(data.numel(), max_count_, [&](int64_t offset, int64_t length) {
    check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, element_at(data, offset), int(length), type,
                       mpi_op(op, data.dtype), native_->comm, &request.requests.emplace_back()),
        "MPI_Iallreduce", name_);
  });
}

CommHandle MpiComm::all_reduce_async(const Tensor& data, ReduceOp op) {
  auto request = std::make_unique<Request>(*this, "all-reduce", &stats_.reduce_seconds);
  issue_all_reduce(data, op, *request);
  stats_.reduce_bytes += int64_t(data.bytes());
  stats_.calls += 1;
  return request;
}

void MpiComm::all_reduce_host(double* values, int count, ReduceOp op) {
  Request request(*this, "all-reduce", &stats_.reduce_seconds);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, mpi_op(op), native_->comm,
                           &request.requests.emplace_back()),
            "MPI_Iallreduce", name_);
  request.wait();
  stats_.reduce_bytes += int64_t(count) * int64_t(sizeof(double));
  stats_.calls += 1;
}

void MpiComm::issue_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                                   Request& request) {
  MPI_Datatype type = mpi_type(send.dtype);
  MPI_Comm comm = native_->comm;
  int64_t block = recv.numel();
  if (block <= max_count_) {
    check_mpi(
        MPI_Ireduce_scatter_block(send.data, recv.data, int(block), type, mpi_op(op, send.dtype),
                                  comm, &request.requests.emplace_back()),
        "MPI_Ireduce_scatter_block", name_);
    return;
  }
  // Blocks too big for an int: reduce every rank's block onto that rank, piece by piece.
  for (int root = 0; root < size_; ++root) {
    for_each_chunk(block, max_count_, [&](int64_t offset, int64_t length) {
      void* source = element_at(send, root * block + offset);
      void* target = element_at(recv, offset);  // used on the root only
      check_mpi(MPI_Ireduce(source, target, int(length), type, mpi_op(op, send.dtype), root, comm,
                            &request.requests.emplace_back()),
                "MPI_Ireduce", name_);
    });
  }
}

CommHandle MpiComm::reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_reduce_scatter_args(*this, send, recv);
  auto request = std::make_unique<Request>(*this, "reduce-scatter", &stats_.reduce_seconds);
  issue_reduce_scatter(send, recv, op, *request);
  stats_.reduce_bytes += int64_t(send.bytes());
  stats_.calls += 1;
  return request;
}

// ---- gathers -------------------------------------------------------------------------------

void MpiComm::issue_all_gather(const Tensor& send, const Tensor& recv, Request& request) {
  MPI_Datatype type = mpi_type(send.dtype);
  MPI_Comm comm = native_->comm;
  int64_t block = send.numel();
  if (block <= max_count_) {
    int count = int(block);
    check_mpi(MPI_Iallgather(send.data, count, type, recv.data, count, type, comm,
                             &request.requests.emplace_back()),
              "MPI_Iallgather", name_);
    return;
  }
  for_each_chunk(block, max_count_, [&](int64_t offset, int64_t length) {
    MPI_Datatype piece = strided_block_type(type, length, block, dtype_size(send.dtype), name_);
    request.types.push_back(piece);
    check_mpi(MPI_Iallgather(element_at(send, offset), int(length), type, element_at(recv, offset),
                             1, piece, comm, &request.requests.emplace_back()),
              "MPI_Iallgather", name_);
  });
}

CommHandle MpiComm::all_gather_async(const Tensor& send, const Tensor& recv) {
  check_all_gather_args(*this, send, recv);
  auto request = std::make_unique<Request>(*this, "all-gather", &stats_.gather_seconds);
  issue_all_gather(send, recv, *request);
  stats_.gather_bytes += int64_t(send.bytes());
  stats_.calls += 1;
  return request;
}

// ---- point to point -----------------------------------------------------------------------

// Pieces of at most max_count_ elements, each its own message with the same tag: MPI keeps
// the order of messages between two ranks on one communicator and tag.
CommHandle MpiComm::send_recv_async(const Tensor& send, int dest, const Tensor& recv, int source,
                                    int tag) {
  check_send_recv_args(*this, send, dest, recv, source, tag);
  auto request = std::make_unique<Request>(*this, "send-recv", &stats_.p2p_seconds);
  if (recv.numel() > 0)
    for_each_chunk(recv.numel(), max_count_, [&](int64_t offset, int64_t length) {
      check_mpi(MPI_Irecv(element_at(recv, offset), int(length), mpi_type(recv.dtype), source, tag,
                          native_->comm, &request->requests.emplace_back()),
                "MPI_Irecv", name_);
    });
  if (send.numel() > 0)
    for_each_chunk(send.numel(), max_count_, [&](int64_t offset, int64_t length) {
      check_mpi(MPI_Isend(element_at(send, offset), int(length), mpi_type(send.dtype), dest, tag,
                          native_->comm, &request->requests.emplace_back()),
                "MPI_Isend", name_);
    });
  stats_.p2p_bytes += int64_t(send.bytes());
  stats_.calls += 1;
  return request;
}

void MpiComm::broadcast_host(void* data, int64_t bytes, int root) {
  check_root(*this, root, "broadcast_host");
  Request request(*this, "broadcast", &stats_.gather_seconds);
  for_each_chunk(bytes, max_count_, [&](int64_t offset, int64_t length) {
    check_mpi(MPI_Ibcast(static_cast<char*>(data) + offset, int(length), MPI_BYTE, root,
                         native_->comm, &request.requests.emplace_back()),
              "MPI_Ibcast", name_);
  });
  request.wait();
  stats_.gather_bytes += bytes;
  stats_.calls += 1;
}

void MpiComm::barrier() {
  Request request(*this, "barrier", nullptr);
  check_mpi(MPI_Ibarrier(native_->comm, &request.requests.emplace_back()), "MPI_Ibarrier", name_);
  request.wait();
  stats_.calls += 1;
}

// ---- groups and failure --------------------------------------------------------------------

std::unique_ptr<Comm> MpiComm::split(int color, int key, const std::string& name) {
  if (color < 0)
    throw std::invalid_argument("split of communicator '" + name_ + "' into '" + name +
                                "': color must be >= 0, got " + std::to_string(color));
  auto native = std::make_unique<Native>();
  check_mpi(MPI_Comm_split(native_->comm, color, key, &native->comm), "MPI_Comm_split", name_);
  native_with_errors_returned(native->comm, name);
  auto comm = std::make_unique<MpiComm>(std::move(native), name);
  comm->set_max_count_per_call(max_count_);
  comm->set_watchdog(watchdog_);
  comm->progress_ = progress_;
  return comm;
}

void MpiComm::start_progress_thread() {
  if (!progress_) progress_ = std::make_shared<ProgressThread>();
}

void MpiComm::abort(int exit_code) {
  std::fflush(nullptr);  // what this rank printed about the failure must not be lost
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

}  // namespace ulysses
