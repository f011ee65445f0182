#include "core/jobs/start_checks.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checkpoint/file_util.h"
#include "data/dataset.h"
#include "data/input_file.h"
#include "data/token_stream.h"
#include "parallel/agreement.h"

namespace ulysses {

namespace {

// Why rank 0 could not write `path` later, or "". Nothing is created: a run refused after
// this check leaves no empty file behind. An existing file must open for appending.
std::string output_problem(const std::string& key, const std::string& path) {
  if (path.empty()) return "";
  if (const std::string problem = output_file_problem(path); !problem.empty())
    return key + " '" + path + "' cannot be written: " + problem;
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::ofstream(path, std::ios::app))
    return key + " '" + path + "' cannot be opened for writing: " + std::strerror(errno);
  return "";
}

// Rank 0 writes the metrics after every step and the trace at the end.
std::string outputs_problem(const LogConfig& log) {
  std::string problem = output_problem("log.metrics_file", log.metrics_file);
  if (problem.empty()) problem = output_problem("log.trace_file", log.trace_file);
  return problem;
}

// The validation files are read only at the first evaluation, or never with eval_every 0:
// a wrong path is a mistake either way.
std::string val_path_problem(const DataConfig& data) {
  if (data.val_path.empty() || data.source == DataSource::synthetic) return "";
  try {
    for (const std::string& path : resolve_data_files(data.val_path, "data.val_path")) {
      const InputFile file(path);
      if (!file.is_open()) return "data.val_path: " + file.problem();
    }
  } catch (const DataError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

void check_run_files(Comm& world, const Config& config) {
  agree_on_failure(world, world.rank() == 0 ? outputs_problem(config.log) : "",
                   ExitCode::bad_input);
  agree_on_failure(world, val_path_problem(config.data), ExitCode::bad_input);
}

}  // namespace ulysses
