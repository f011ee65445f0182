#include "tests/testing.h"

#include <sys/resource.h>
#include <sys/wait.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/checkpoint/checkpoint_format.h"

namespace ulysses::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "ulysses-test-XXXXXX").string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!mkdtemp(buffer.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::map<std::string, std::string> snapshot_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string name = std::filesystem::relative(entry.path(), dir).string();
    if (entry.is_regular_file() && name != kCheckpointLockFile)
      files[name] = read_text_file(entry.path().string());
  }
  return files;
}

std::vector<nlohmann::json> read_metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<double> read_step_losses(const std::string& path) {
  std::vector<double> losses;
  for (const nlohmann::json& line : read_metrics_lines(path))
    if (line.contains("loss")) losses.push_back(line["loss"].get<double>());
  return losses;
}

CommandResult run_command(const std::string& command_line) {
  CommandResult result;
  FILE* pipe = popen((command_line + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed for " + command_line);
  std::array<char, 4096> chunk;
  size_t n;
  while ((n = fread(chunk.data(), 1, chunk.size(), pipe)) > 0)
    result.output.append(chunk.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

nlohmann::json last_json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string line, found;
  while (std::getline(lines, line))
    if (!line.empty() && line.front() == '{') found = line;
  if (found.empty()) throw std::runtime_error("no JSON line in: " + output);
  return nlohmann::json::parse(found);
}

std::string mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 mpirun --bind-to none -np " +
         std::to_string(ranks) + " ";
}

std::string error_under_file_size_limit(uint64_t bytes, const std::function<void()>& write) {
  rlimit old_limit{};
  if (getrlimit(RLIMIT_FSIZE, &old_limit) != 0) throw std::runtime_error("getrlimit failed");
  rlimit limit = old_limit;
  limit.rlim_cur = bytes;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) throw std::runtime_error("setrlimit failed");
  std::string error;
  try {
    write();
  } catch (const std::exception& problem) {
    error = problem.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  return error;
}

std::unique_ptr<Backend> cuda_backend_or_reason(std::string& reason, AttentionKernel attention) {
  try {
    return make_backend(BackendKind::cuda, 0, attention);
  } catch (const std::exception& error) {
    reason = error.what();
    if (reason.find("no CUDA device") == std::string::npos &&
        reason.find("no CUDA backend") == std::string::npos)
      throw;
    return nullptr;
  }
}

}  // namespace ulysses::testing
