// The collective watchdog (parallel.timeout_s; docs/failures.md). Communicators wait for
// their operations by polling, and a wait that outlasts the limit ends the whole job with
// a message naming the rank, the step, the phase and the collective: a stopped, stuck or
// dead rank never leaves the others spinning. One per process, shared by every
// communicator split from the world; the trainer keeps its step and phase current.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "parallel/exit_code.h"

namespace ulysses {

class Watchdog {
 public:
  // A wait that overlaps another rank's slow local work (writing or reading a checkpoint,
  // loading weights, opening data) may take this many times the limit.
  static constexpr double kSlowWorkFactor = 10.0;

  // timeout_s 0 = no limit. world_rank names this process in the message.
  Watchdog(double timeout_s, int world_rank);

  void set_timeout(double seconds) { timeout_s_ = seconds; }
  void set_step(int64_t step) { step_ = step; }
  void set_phase(const std::string& phase) { phase_ = phase; }
  // Prints the message (spdlog in the trainer; stderr by default).
  void set_reporter(std::function<void(const std::string&)> reporter) {
    reporter_ = std::move(reporter);
  }

  // While alive, waits may last kSlowWorkFactor × the limit and the phase says why.
  class SlowWork {
   public:
    SlowWork(Watchdog* watchdog, const std::string& phase);
    ~SlowWork();
    SlowWork(const SlowWork&) = delete;
    SlowWork& operator=(const SlowWork&) = delete;

   private:
    Watchdog* watchdog_;
    std::string previous_phase_;
  };

  // Seconds a wait may last now; 0 = no limit.
  double limit_seconds() const;

  // Called by a communicator whose wait has lasted `waited` seconds past the limit: prints
  // what was being waited for, where. The caller then ends the job with ExitCode timeout.
  void report_timeout(const std::string& collective, const std::string& comm_name,
                      double waited) const;

 private:
  double timeout_s_;
  int world_rank_;
  int64_t step_ = -1;  // -1 before the first step
  std::string phase_ = "startup";
  int slow_work_depth_ = 0;
  std::function<void(const std::string&)> reporter_;
};

// Exit status of a job ended by the watchdog.
constexpr int kWatchdogExitCode = int(ExitCode::timeout);

// Polls done() until it returns true. Past the watchdog's limit (none when watchdog is
// null or its limit is 0), reports and calls on_timeout, which must not return.
// Between polls the thread yields, so ranks that share cores keep computing.
void wait_with_watchdog(const Watchdog* watchdog, const std::function<bool()>& done,
                        const std::string& collective, const std::string& comm_name,
                        const std::function<void()>& on_timeout);

}  // namespace ulysses
