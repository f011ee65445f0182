// Argument checks shared by the communicators, so that every implementation rejects the
// same misuse with the same message (and before any rank enters the collective).
#pragma once

#include <cstdint>

#include "parallel/comm.h"

namespace ulysses {

// send and recv: same dtype, equal numel divisible by comm.size().
void check_all_to_all_args(const Comm& comm, const Tensor& send, const Tensor& recv);
// send has comm.size() · recv.numel() elements of recv's dtype.
void check_reduce_scatter_args(const Comm& comm, const Tensor& send, const Tensor& recv);
// recv has comm.size() · send.numel() elements of send's dtype.
void check_all_gather_args(const Comm& comm, const Tensor& send, const Tensor& recv);
// dest and source are ranks of comm (when their tensor is not empty); tag >= 0.
void check_send_recv_args(const Comm& comm, const Tensor& send, int dest, const Tensor& recv,
                          int source, int tag);
void check_root(const Comm& comm, int root, const char* operation);

}  // namespace ulysses
