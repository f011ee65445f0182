#include "parallel/mesh.h"

#include <stdexcept>
#include <string>

namespace ulysses {

std::string mesh_text(int world_size, int sp, int ring) {
  std::string text = "dp " + std::to_string(world_size / sp) + " x sp " + std::to_string(sp);
  if (ring > 1)
    text += " (Ulysses " + std::to_string(sp / ring) + " x ring " + std::to_string(ring) + ")";
  return text;
}

Mesh make_mesh(Comm& world, int sp, int ring) {
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
  if (ring > 1) {
    if (sp % ring != 0)
      throw std::invalid_argument("parallel.ring = " + std::to_string(ring) +
                                  " must divide parallel.sp = " + std::to_string(sp));
    const int ulysses = sp / ring;
    mesh.ring_size = ring;
    mesh.ulysses = mesh.sp->split(mesh.sp_rank / ulysses, mesh.sp_rank % ulysses, "ulysses");
    mesh.ring = mesh.sp->split(mesh.sp_rank % ulysses, mesh.sp_rank / ulysses, "ring");
  }
  return mesh;
}

RingComms ring_comms(const Mesh& mesh) {
  return {mesh.ulysses.get(), mesh.ring.get()};
}

Comm& ulysses_comm(const Mesh& mesh) {
  return mesh.ulysses ? *mesh.ulysses : *mesh.sp;
}

}  // namespace ulysses
