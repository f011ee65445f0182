#include "parallel/mesh.h"

#include <stdexcept>
#include <string>

namespace ulysses {

Mesh make_mesh(Comm& world, int sp) {
  if (sp < 1 || world.size() % sp != 0)
    throw std::invalid_argument("parallel.sp = " + std::to_string(sp) +
                                " must be a positive divisor of the number of ranks (" +
                                std::to_string(world.size()) + ")");
  Mesh mesh;
  mesh.world = &world;
  mesh.sp_size = sp;
  mesh.dp_size = world.size() / sp;
  mesh.sp_rank = world.rank() % sp;
  mesh.dp_rank = world.rank() / sp;
  // Both splits are collective: every rank makes them in the same order.
  mesh.sp = world.split(mesh.dp_rank, mesh.sp_rank, "sp");
  mesh.dp = world.split(mesh.sp_rank, mesh.dp_rank, "dp");
  return mesh;
}

}  // namespace ulysses
