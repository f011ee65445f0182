// The part of every ulysses-train command that runs on the ranks of a job: starts MPI,
// runs the job and turns any error into a logged message and the same exit status on
// every rank (docs/failures.md).
#pragma once

#include <functional>

#include "core/report/log_setup.h"
#include "parallel/comm.h"

namespace ulysses {

// stop_handlers: SIGTERM/SIGINT ask the job to stop (the trainer checkpoints and exits 0)
// instead of ending the process; color: the --color choice, stream: where the log goes
// (core/report/log_setup.h). Returns the process exit status.
int run_on_world(int* argc, char*** argv, bool stop_handlers, LogColor color, LogStream stream,
                 const std::function<void(Comm& world)>& job);

}  // namespace ulysses
