// Seconds of wall time on the steady clock, for the timings that communicators, the trainer
// and the tools report.
#pragma once

#include <chrono>

namespace ulysses {

class Stopwatch {
 public:
  // Seconds since construction.
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace ulysses
