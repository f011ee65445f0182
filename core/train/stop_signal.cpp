#include "core/train/stop_signal.h"

#include <time.h>
#include <unistd.h>

#include <csignal>

namespace ulysses {

namespace {

// One stop request often arrives twice within microseconds: `timeout` signals the
// trainer and then its whole process group, and mpirun can forward a signal that the
// group also received. Only a signal later than this counts as a second request.
constexpr double kDuplicateWindowSeconds = 0.5;

// A signal handler can only reach process-wide state.
volatile std::sig_atomic_t g_stop_signal = 0;
timespec g_first_signal_time = {};

double seconds_since(const timespec& start) {
  timespec now = {};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return double(now.tv_sec - start.tv_sec) + 1e-9 * double(now.tv_nsec - start.tv_nsec);
}

void on_stop_signal(int signal_number) {
  if (g_stop_signal == 0) {
    clock_gettime(CLOCK_MONOTONIC, &g_first_signal_time);
    g_stop_signal = signal_number;
    return;
  }
  if (seconds_since(g_first_signal_time) > kDuplicateWindowSeconds)
    _exit(128 + signal_number);  // a second request: leave at once
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
