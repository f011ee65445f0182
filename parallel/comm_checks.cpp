#include "parallel/comm_checks.h"

#include <stdexcept>
#include <string>

namespace ulysses {

namespace {

std::string where(const Comm& comm, const char* operation) {
  return std::string(operation) + " on communicator '" + comm.name() + "' (size " +
         std::to_string(comm.size()) + ")";
}

void check_same_dtype(const Comm& comm, const char* operation, const Tensor& send,
                      const Tensor& recv) {
  if (send.dtype != recv.dtype)
    throw std::invalid_argument(where(comm, operation) + ": send is " + dtype_name(send.dtype) +
                                " but recv is " + dtype_name(recv.dtype));
}

}  // namespace

void check_all_to_all_args(const Comm& comm, const Tensor& send, const Tensor& recv) {
  check_same_dtype(comm, "all_to_all", send, recv);
  if (send.numel() != recv.numel() || send.numel() % comm.size() != 0)
    throw std::invalid_argument(where(comm, "all_to_all") + ": send " + send.shape_string() +
                                " and recv " + recv.shape_string() +
                                " must have equal element counts divisible by the size");
}

void check_reduce_scatter_args(const Comm& comm, const Tensor& send, const Tensor& recv) {
  check_same_dtype(comm, "reduce_scatter", send, recv);
  if (send.numel() != recv.numel() * comm.size())
    throw std::invalid_argument(where(comm, "reduce_scatter") + ": send " + send.shape_string() +
                                " must have size() times the elements of recv " +
                                recv.shape_string());
}

void check_all_gather_args(const Comm& comm, const Tensor& send, const Tensor& recv) {
  check_same_dtype(comm, "all_gather", send, recv);
  if (recv.numel() != send.numel() * comm.size())
    throw std::invalid_argument(where(comm, "all_gather") + ": recv " + recv.shape_string() +
                                " must have size() times the elements of send " +
                                send.shape_string());
}

void check_send_recv_args(const Comm& comm, const Tensor& send, int dest, const Tensor& recv,
                          int source, int tag) {
  const char* operation = "send_recv";
  if (send.numel() > 0 && (dest < 0 || dest >= comm.size()))
    throw std::invalid_argument(where(comm, operation) + ": destination " + std::to_string(dest) +
                                " is not a rank of this communicator");
  if (recv.numel() > 0 && (source < 0 || source >= comm.size()))
    throw std::invalid_argument(where(comm, operation) + ": source " + std::to_string(source) +
                                " is not a rank of this communicator");
  if (tag < 0) throw std::invalid_argument(where(comm, operation) + ": negative tag");
}

void check_root(const Comm& comm, int root, const char* operation) {
  if (root < 0 || root >= comm.size())
    throw std::invalid_argument(where(comm, operation) + ": root " + std::to_string(root) +
                                " is not a rank of this communicator");
}

}  // namespace ulysses
