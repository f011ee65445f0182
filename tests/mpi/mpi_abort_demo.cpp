// A job in which rank 1 fails while every other rank waits for it in a collective. The
// failing rank reports and calls world.abort(3), which must end the whole job at once; the
// mpi_abort test runs this under mpiexec and checks that it ends promptly and non-zero.
#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

#include "parallel/mpi_comm.h"

int main(int argc, char** argv) {
  ulysses::MpiSession session(&argc, &argv);
  std::unique_ptr<ulysses::Comm> world = session.world();
  try {
    if (world->rank() == 1) {
      // Let the others reach the barrier first, so that they are really blocked in it.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      throw std::runtime_error("rank 1 failed on purpose");
    }
    world->barrier();
    std::fprintf(stderr, "rank %d: passed a barrier that rank 1 never entered\n", world->rank());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: fatal: %s\n", world->rank(), error.what());
    world->abort(3);
  }
  return 0;
}
