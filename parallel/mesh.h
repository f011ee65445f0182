// The dp × sp process mesh (docs/parallelism.md).
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace ulysses {

// world = dp × sp. SP groups are contiguous ranks (ranks 0..sp-1 form SP group 0) because
// they carry the heavy all-to-all and belong on one node; the dp group of a rank holds the
// ranks with the same sp_rank, one from each SP group.
//   world rank = dp_rank · sp_size + sp_rank
struct Mesh {
  Comm* world = nullptr;
  std::unique_ptr<Comm> sp, dp;
  int sp_size = 1;
  int dp_size = 1;
  int sp_rank = 0;
  int dp_rank = 0;
};

// Collective over world. Throws std::invalid_argument unless sp >= 1 divides world.size().
Mesh make_mesh(Comm& world, int sp);

}  // namespace ulysses
