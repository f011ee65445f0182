// Small helpers shared by the unit tests.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/backend.h"

// In a test: text (a string or std::string) holds fragment.
#define EXPECT_MENTIONS(text, fragment)                          \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) \
      << "no '" << (fragment) << "' in: " << (text)

namespace ulysses::testing {

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_text_file(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);
// Every regular file under dir, by its path relative to dir, with its bytes: two snapshots
// are equal when nothing under dir was added, removed or changed. A checkpoint folder's lock
// file is left out: every run that uses the folder writes who it is there
// (core/checkpoint/checkpoint_lock.h); it holds no checkpoint.
std::map<std::string, std::string> snapshot_files(const std::string& dir);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Every JSON line of a metrics file (log.metrics_file), in order.
std::vector<nlohmann::json> read_metrics_lines(const std::string& path);
// The "loss" of every training-step line of a metrics file, in order.
std::vector<double> read_step_losses(const std::string& path);

// The last line of a command's output that is a JSON object (what --json prints); throws
// when there is none.
nlohmann::json last_json_line(const std::string& output);

// Runs a shell command line and captures its output and exit status.
CommandResult run_command(const std::string& command_line);

// "mpirun -np RANKS" with what Open MPI needs here (root, more ranks than cores, one thread
// per rank), for command lines (it starts with `env`, so it may follow `timeout`).
std::string mpirun(int ranks);

// Runs `write` in this process with files limited to `bytes` (RLIMIT_FSIZE) and SIGXFSZ ignored,
// as ulysses-train ignores it: a write past the limit takes the bytes below it, then fails with
// EFBIG, as on a full disk. Returns the error `write` threw, "" when it threw none.
std::string error_under_file_size_limit(uint64_t bytes, const std::function<void()>& write);

// The cuda backend, or nullptr with the reason there is none ("no CUDA device: ..." or "...
// no CUDA backend ...") for GTEST_SKIP; any other failure to start is thrown, a test failure.
std::unique_ptr<Backend> cuda_backend_or_reason(
    std::string& reason, AttentionKernel attention = AttentionKernel::native);

}  // namespace ulysses::testing
