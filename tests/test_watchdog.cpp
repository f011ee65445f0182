// The collective watchdog (parallel/watchdog.h): a wait past the limit reports where it was
// waiting and hands over to the caller's abort; slow local work stretches the limit; no
// limit means waiting as long as it takes. The 4-rank SIGSTOP case is in test_faults.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "parallel/watchdog.h"

namespace ulysses {
namespace {

struct Expired : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Waits for a condition that never comes; returns the message reported and the seconds
// waited, or throws when `done` ends the wait first.
std::pair<std::string, double> wait_forever(Watchdog& watchdog) {
  std::string reported;
  watchdog.set_reporter([&](const std::string& message) { reported = message; });
  const auto start = std::chrono::steady_clock::now();
  try {
    wait_with_watchdog(
        &watchdog, [] { return false; }, "all-to-all", "sp", [] { throw Expired("expired"); });
  } catch (const Expired&) {
  }
  return {reported,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

TEST(Watchdog, AWaitPastTheLimitReportsRankStepPhaseAndCollective) {
  Watchdog watchdog(0.2, 3);
  watchdog.set_step(17);
  watchdog.set_phase("forward and backward");
  const auto [message, seconds] = wait_forever(watchdog);
  EXPECT_GE(seconds, 0.2);
  EXPECT_LT(seconds, 5.0);
  for (const char* part :
       {"watchdog: rank 3 waited 0.2", "in all-to-all on communicator 'sp'", "in step 17",
        "phase 'forward and backward'", "parallel.timeout_s is 0.2", "ending the job"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " missing from: " << message;
}

TEST(Watchdog, SlowWorkStretchesTheLimitAndNamesItselfUntilItEnds) {
  Watchdog watchdog(0.05, 0);
  {
    Watchdog::SlowWork slow(&watchdog, "writing a checkpoint");
    EXPECT_DOUBLE_EQ(watchdog.limit_seconds(), 0.05 * Watchdog::kSlowWorkFactor);
    const auto [message, seconds] = wait_forever(watchdog);
    EXPECT_GE(seconds, 0.05 * Watchdog::kSlowWorkFactor);
    EXPECT_NE(message.find("phase 'writing a checkpoint'"), std::string::npos) << message;
    EXPECT_NE(message.find("before the first step"), std::string::npos) << message;
  }
  EXPECT_DOUBLE_EQ(watchdog.limit_seconds(), 0.05);
  const auto [message, seconds] = wait_forever(watchdog);
  EXPECT_NE(message.find("phase 'startup'"), std::string::npos) << message;
}

TEST(Watchdog, WithoutALimitTheWaitLastsUntilDone) {
  Watchdog off(0.0, 0);
  int polls = 0;
  wait_with_watchdog(
      &off, [&] { return ++polls == 200000; }, "barrier", "world",
      [] { FAIL() << "no limit, yet it expired"; });
  EXPECT_EQ(polls, 200000);
  polls = 0;
  wait_with_watchdog(
      nullptr, [&] { return ++polls == 10; }, "barrier", "world", [] { FAIL() << "expired"; });
  EXPECT_EQ(polls, 10);
}

}  // namespace
}  // namespace ulysses
