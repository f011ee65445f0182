#include "parallel/agreement.h"

namespace ulysses {

void agree_on_failure(Comm& world, const std::string& error, ExitCode code) {
  double verdict[2] = {error.empty() ? 0.0 : 1.0, world.rank() == 0 && !error.empty() ? 1.0 : 0.0};
  world.all_reduce_host(verdict, 2, ReduceOp::max);
  if (verdict[0] == 0.0) return;
  const bool rank0_failed = verdict[1] > 0.0;
  const bool print_here = !error.empty() && (world.rank() == 0 || !rank0_failed);
  throw JobError(code, error.empty() ? "another rank failed a check" : error, print_here);
}

void broadcast_string(Comm& world, std::string& text, int root) {
  double length = double(text.size());
  world.broadcast_host(&length, sizeof length, root);
  text.resize(size_t(length));
  if (!text.empty()) world.broadcast_host(text.data(), int64_t(text.size()), root);
}

std::vector<std::string> all_gather_strings(Comm& world, const std::string& mine) {
  std::vector<std::string> texts(size_t(world.size()));
  texts[size_t(world.rank())] = mine;
  for (int rank = 0; rank < world.size(); ++rank)
    broadcast_string(world, texts[size_t(rank)], rank);
  return texts;
}

}  // namespace ulysses
