#include "core/jobs/run_on_world.h"

#include <spdlog/spdlog.h>

#include <memory>

#include "core/jobs/job_errors.h"
#include "core/train/stop_signal.h"
#include "parallel/mpi_comm.h"

namespace ulysses {

int run_on_world(int* argc, char*** argv, bool stop_handlers, LogColor color, LogStream stream,
                 const std::function<void(Comm& world)>& job) {
  MpiSession mpi(argc, argv);
  if (stop_handlers) install_stop_handlers();  // after MPI_Init, which may install its own
  std::unique_ptr<Comm> world = mpi.world();
  setup_logging(color, world->rank(), world->size(), stream);
  try {
    job(*world);
    return int(ExitCode::done);
  } catch (const JobError& error) {
    // Every rank raised it together: each exits with its code, without aborting the job.
    if (error.print_here()) spdlog::error("{}", error.what());
    spdlog::default_logger()->flush();
    return int(error.code());
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    const int code = int(exit_code_for(error));
    if (world->size() > 1) world->abort(code);
    return code;
  }
}

}  // namespace ulysses
