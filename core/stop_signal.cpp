#include "core/stop_signal.h"

#include <unistd.h>

#include <csignal>

namespace ulysses {

namespace {

// A signal handler can only reach process-wide state.
volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int signal_number) {
  if (g_stop_signal != 0) _exit(128 + signal_number);  // second signal: leave at once
  g_stop_signal = signal_number;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool stop_requested() {
  return g_stop_signal != 0;
}

int stop_signal() {
  return int(g_stop_signal);
}

}  // namespace ulysses
