// Log colours (docs/configuration.md#logs): plain text in files, pipes and under mpirun
// unless asked for, so that `grep step` works on a saved log; and the log's stream.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
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

// A command whose stdout is its product keeps the log on stderr: `eval --json` prints only its
// JSON line there (one rank or under mpirun), `sample` only its answers. Training and a plain
// eval, whose result is a log line, log on stdout.
TEST(LogSetup, EvalJsonAndSampleLeaveStdoutToTheirOutput) {
  TempDir dir;
  const std::string config =
      " --config " + std::string(ULYSSES_SOURCE_DIR) + "/configs/passkey-tiny.yaml";
  const auto trained =
      run_command("cd " + dir.path() + " && " + kTrain + config +
                  " --set train.steps=2 --set train.eval_every=0 --set train.checkpoint.dir=ck");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string weights = " --checkpoint " + dir.file("ck");
  // stdout alone: stderr goes to a file, which is read after.
  auto stdout_of = [&](const std::string& command) {
    return run_command("{ " + command + " 2> " + dir.file("stderr") + "; }");
  };
  for (const std::string& launcher : {std::string(), "timeout 120 " + testing::mpirun(2)}) {
    const auto json = stdout_of(launcher + kTrain + " eval" + config + weights + " --json");
    ASSERT_EQ(json.exit_code, 0) << json.output;
    EXPECT_EQ(json.output.find('\n'), json.output.size() - 1) << "one line: " << json.output;
    EXPECT_NO_THROW(nlohmann::json::parse(json.output)) << json.output;
    EXPECT_NE(testing::read_text_file(dir.file("stderr")).find("info attention"),
              std::string::npos);
  }
  const auto sample = stdout_of(kTrain + " sample" + config + weights + " --temperature 0");
  ASSERT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("sequence 0, position ", 0), 0u) << sample.output;
  EXPECT_EQ(sample.output.find("] info "), std::string::npos) << sample.output;

  const auto plain = stdout_of(kTrain + " eval" + config + weights);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("] info eval loss "), std::string::npos) << plain.output;
}

}  // namespace
}  // namespace ulysses
