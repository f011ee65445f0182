#include "parallel/comm.h"

#include <stdexcept>

namespace ulysses {

CommStats& CommStats::operator+=(const CommStats& other) {
  all_to_all_bytes += other.all_to_all_bytes;
  all_to_all_seconds += other.all_to_all_seconds;
  reduce_bytes += other.reduce_bytes;
  reduce_seconds += other.reduce_seconds;
  gather_bytes += other.gather_bytes;
  gather_seconds += other.gather_seconds;
  p2p_bytes += other.p2p_bytes;
  p2p_seconds += other.p2p_seconds;
  calls += other.calls;
  return *this;
}

CommStats CommStats::operator-(const CommStats& before) const {
  CommStats d;
  d.all_to_all_bytes = all_to_all_bytes - before.all_to_all_bytes;
  d.all_to_all_seconds = all_to_all_seconds - before.all_to_all_seconds;
  d.reduce_bytes = reduce_bytes - before.reduce_bytes;
  d.reduce_seconds = reduce_seconds - before.reduce_seconds;
  d.gather_bytes = gather_bytes - before.gather_bytes;
  d.gather_seconds = gather_seconds - before.gather_seconds;
  d.p2p_bytes = p2p_bytes - before.p2p_bytes;
  d.p2p_seconds = p2p_seconds - before.p2p_seconds;
  d.calls = calls - before.calls;
  return d;
}

CommHandle Comm::send_recv_async(const Tensor&, int, const Tensor&, int, int) {
  throw std::invalid_argument("communicator '" + name() +
                              "' has no point-to-point transfers: ring attention "
                              "(parallel.ring > 1) runs on the cpu backend over MPI only");
}

namespace {

class CompletedRequest final : public CommRequest {
  void complete() override {}
};

}  // namespace

CommHandle completed_request() {
  return std::make_unique<CompletedRequest>();
}

}  // namespace ulysses
