#include "parallel/watchdog.h"

#include <sched.h>

#include <cstdio>

#include "kernels/stopwatch.h"

namespace ulysses {

Watchdog::Watchdog(double timeout_s, int world_rank)
    : timeout_s_(timeout_s), world_rank_(world_rank) {}

Watchdog::SlowWork::SlowWork(Watchdog* watchdog, const std::string& phase) : watchdog_(watchdog) {
  if (!watchdog_) return;
  previous_phase_ = watchdog_->phase_;
  watchdog_->phase_ = phase;
  ++watchdog_->slow_work_depth_;
}

Watchdog::SlowWork::~SlowWork() {
  if (!watchdog_) return;
  watchdog_->phase_ = previous_phase_;
  --watchdog_->slow_work_depth_;
}

double Watchdog::limit_seconds() const {
  return slow_work_depth_ > 0 ? timeout_s_ * kSlowWorkFactor : timeout_s_;
}

void Watchdog::report_timeout(const std::string& collective, const std::string& comm_name,
                              double waited) const {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", waited);
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", timeout_s_);
  const std::string step = step_ < 0 ? "before the first step" : "in step " + std::to_string(step_);
  const std::string message = "watchdog: rank " + std::to_string(world_rank_) + " waited " +
                              seconds + " s in " + collective + " on communicator '" + comm_name +
                              "' " + step + ", phase '" + phase_ + "' (parallel.timeout_s is " +
                              limit + (slow_work_depth_ > 0 ? ", ×10 during slow I/O" : "") +
                              "): another rank is stopped, stuck or dead; ending the job";
  if (reporter_) {
    reporter_(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
  std::fflush(nullptr);
}

void wait_with_watchdog(const Watchdog* watchdog, const std::function<bool()>& done,
                        const std::string& collective, const std::string& comm_name,
                        const std::function<void()>& on_timeout) {
  const double limit = watchdog ? watchdog->limit_seconds() : 0.0;
  const Stopwatch clock;
  while (!done()) {
    if (limit > 0.0) {
      const double waited = clock.seconds();
      if (waited > limit) {
        watchdog->report_timeout(collective, comm_name, waited);
        on_timeout();
      }
    }
    sched_yield();
  }
}

}  // namespace ulysses
