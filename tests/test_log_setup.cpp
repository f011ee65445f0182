// Log colours (docs/configuration.md#logs): plain text in files, pipes and under mpirun
// unless asked for, so that `grep step` works on a saved log.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <stdexcept>
#include <string>

#include "core/report/log_setup.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kEscape = "\x1b[";

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(LogSetup, ParsesTheThreeModesAndNamesThemOtherwise) {
  EXPECT_EQ(parse_log_color("auto"), LogColor::automatic);
  EXPECT_EQ(parse_log_color("always"), LogColor::always);
  EXPECT_EQ(parse_log_color("never"), LogColor::never);
  try {
    parse_log_color("yes");
    FAIL() << "accepted 'yes'";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("auto, always or never"), std::string::npos);
  }
}

TEST(LogSetup, AutoIsPlainUnderALauncherOrWithNoColor) {
  EXPECT_TRUE(log_uses_colors(LogColor::always));
  EXPECT_FALSE(log_uses_colors(LogColor::never));
  {
    ScopedEnv launcher("OMPI_COMM_WORLD_SIZE", "4");
    EXPECT_FALSE(log_uses_colors(LogColor::automatic));
    EXPECT_TRUE(log_uses_colors(LogColor::always));
  }
  {
    ScopedEnv no_color("NO_COLOR", "1");
    EXPECT_FALSE(log_uses_colors(LogColor::automatic));
  }
}

TEST(LogSetup, TrainerLogThroughAPipeOrMpirunIsPlainUnlessForced) {
  TempDir dir;
  const std::string job = kTrain + " --config " + std::string(ULYSSES_SOURCE_DIR) +
                          "/configs/passkey-tiny.yaml --set train.steps=1 --set train.eval_every=0";
  const auto piped = run_command(job);
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_NE(piped.output.find("] info "), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find(kEscape), std::string::npos) << piped.output;

  const auto mpi = run_command("timeout 120 " + testing::mpirun(2) + job);
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("[rank 0] info "), std::string::npos) << mpi.output;
  EXPECT_EQ(mpi.output.find(kEscape), std::string::npos) << mpi.output;

  const auto forced = run_command(job + " --color always");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find(kEscape), std::string::npos) << forced.output;
}

}  // namespace
}  // namespace ulysses
