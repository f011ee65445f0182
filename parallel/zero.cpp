#include "parallel/zero.h"

#include <algorithm>
#include <stdexcept>

namespace ulysses {

int64_t shard_block(int64_t total, int world) { return (total + world - 1) / world; }

ShardRange shard_range(int64_t total, int rank, int world) {
  const int64_t block = shard_block(total, world);
  ShardRange range;
  range.begin = std::min(int64_t(rank) * block, total);
  range.end = std::min(range.begin + block, total);
  return range;
}

void reduce_scatter_shards(Comm& comm, const Tensor& grads_padded, const Tensor& grad_shard) {
  if (grads_padded.numel() != grad_shard.numel() * comm.size())
    throw std::invalid_argument("reduce_scatter_shards: the padded buffer holds " +
                                std::to_string(grads_padded.numel()) + " elements, not " +
                                std::to_string(comm.size()) + " blocks of " +
                                std::to_string(grad_shard.numel()));
  comm.reduce_scatter(grads_padded, grad_shard, ReduceOp::sum);
}

void all_gather_shards(Backend& backend, Comm& comm, const Tensor& params_padded) {
  const int64_t block = params_padded.numel() / comm.size();
  if (block * comm.size() != params_padded.numel())
    throw std::invalid_argument("all_gather_shards: " + std::to_string(params_padded.numel()) +
                                " elements are not " + std::to_string(comm.size()) +
                                " equal blocks");
  // MPI forbids the send block inside the receive buffer: send from a copy.
  Buffer own = backend.alloc(MemCategory::comm, params_padded.dtype, {block}, "zero gather block");
  backend.copy(own, params_padded.flat_range(int64_t(comm.rank()) * block, block));
  comm.all_gather(own, params_padded);
}

}  // namespace ulysses
