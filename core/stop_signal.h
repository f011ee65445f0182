// Cluster preemption: the first SIGTERM or SIGINT asks the run to stop after the current
// step (with a checkpoint); a second one exits at once.
#pragma once

namespace ulysses {

// Installs the handlers for SIGTERM and SIGINT.
void install_stop_handlers();
// True once a first signal arrived.
bool stop_requested();
// The signal number that asked to stop (0 if none).
int stop_signal();

}  // namespace ulysses
