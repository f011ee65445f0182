// The dp × sp process mesh (docs/parallelism.md).
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"

namespace ulysses {

// world = dp × sp. SP groups are contiguous ranks (ranks 0..sp-1 form SP group 0) because
// they carry the heavy all-to-all and belong on one node; the dp group of a rank holds the
// ranks with the same sp_rank, one from each SP group.
//   world rank = dp_rank · sp_size + sp_rank
//
// With parallel.ring = R > 1 an SP group of sp ranks is sp/R Ulysses ranks × R ring ranks
// (docs/parallelism.md, "Ulysses × ring"): Ulysses groups are contiguous sp ranks, and a ring
// joins the ranks at the same Ulysses position of adjacent groups.
//   sp_rank = ring_rank · (sp / R) + ulysses_rank
struct Mesh {
  Comm* world = nullptr;
  std::unique_ptr<Comm> sp, dp;
  std::unique_ptr<Comm> ulysses, ring;  // parallel.ring > 1 only
  int ring_size = 1;
  int sp_size = 1;
  int dp_size = 1;
  int sp_rank = 0;
  int dp_rank = 0;
};

// Collective over world. Throws std::invalid_argument unless sp >= 1 divides world.size() and
// ring >= 1 divides sp.
Mesh make_mesh(Comm& world, int sp, int ring = 1);

// "dp 2 x sp 4", and with a ring "dp 2 x sp 4 (Ulysses 2 x ring 2)", for logs and reports.
std::string mesh_text(int world_size, int sp, int ring);

// What attention needs of a ring (parallel.ring > 1): the Ulysses group its all-to-alls run
// over and the ring; both null without a ring (the all-to-alls then span the SP group).
struct RingComms {
  Comm* ulysses = nullptr;
  Comm* ring = nullptr;
};
RingComms ring_comms(const Mesh& mesh);

// The communicator Ulysses' all-to-alls run over: the Ulysses group, or the whole SP group
// without a ring.
Comm& ulysses_comm(const Mesh& mesh);

}  // namespace ulysses
