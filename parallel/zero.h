// ZeRO sharding of flat buffers over a communicator (DESIGN.md §5): rank r owns elements
// [r·S, (r+1)·S) of a buffer of `total` elements, S = ceil(total / world). Flat buffers
// that are all-gathered are padded to world·S elements so every block has the same size.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {

struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;  // may equal begin for the last ranks of a tiny buffer
  int64_t size() const { return end - begin; }
};

// Elements per rank (the padded block size) for a buffer of total elements.
int64_t shard_block(int64_t total, int world);
// The part of [0, total) that rank owns.
ShardRange shard_range(int64_t total, int rank, int world);

// Gradients: grads_padded[world·S] summed over the communicator, rank r receiving block r
// into grad_shard[S] (a reduce-scatter).
void reduce_scatter_shards(Comm& comm, const Tensor& grads_padded, const Tensor& grad_shard);
// Parameters: every rank's block of params_padded[world·S] sent to every rank.
void all_gather_shards(Backend& backend, Comm& comm, const Tensor& params_padded);

}  // namespace ulysses
