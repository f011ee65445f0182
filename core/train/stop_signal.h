// Cluster preemption: the first SIGTERM or SIGINT asks the run to stop after the current
// step (with a checkpoint); a second one, more than half a second later, exits at once.
// Copies of the first signal that arrive sooner (from `timeout` or mpirun) are ignored.
#pragma once

namespace ulysses {

// Installs the handlers for SIGTERM and SIGINT.
void install_stop_handlers();
// True once a first signal arrived.
bool stop_requested();
// The signal number that asked to stop (0 if none).
int stop_signal();

}  // namespace ulysses
