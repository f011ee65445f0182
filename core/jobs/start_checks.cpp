#include "core/jobs/start_checks.h"

#include <fnmatch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/file_util.h"
#include "data/dataset.h"
#include "data/input_file.h"
#include "data/token_stream.h"
#include "parallel/agreement.h"

namespace ulysses {

namespace {

namespace fs = std::filesystem;

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

// An output of the run and files it would write there (for a data glob to be matched against).
struct RunOutput {
  const char* key;
  std::string path;
  std::vector<std::string> files;
};

std::vector<RunOutput> run_outputs(const Config& config) {
  std::vector<RunOutput> outputs;
  if (const std::string& dir = config.train.checkpoint.dir; !dir.empty()) {
    const std::string step = dir + "/" + checkpoint_folder_name(1) + "/";
    outputs.push_back({"train.checkpoint.dir",
                       dir,
                       {dir + "/" + kCheckpointLatestFile, step + kCheckpointModelFile,
                        step + kCheckpointStateFile, step + kCheckpointManifestFile,
                        step + optimizer_file_name(0, 1)}});
  }
  for (const auto& [key, path] :
       {std::pair<const char*, std::string>{"log.metrics_file", config.log.metrics_file},
        {"log.trace_file", config.log.trace_file}})
    if (!path.empty()) outputs.push_back({key, path, {path}});
  return outputs;
}

fs::path absolute_path(const std::string& path) {
  return (fs::path(path).is_absolute() ? fs::path(path) : fs::current_path() / path)
      .lexically_normal();
}

// Whether a data folder lists `path` (recursively, hidden entries skipped: a hidden checkpoint
// folder inside the data folder is not read).
bool folder_lists(const std::string& folder, const std::string& path) {
  std::error_code error;
  const fs::path relative =
      fs::weakly_canonical(path, error).lexically_relative(fs::weakly_canonical(folder, error));
  if (error || relative.empty() || *relative.begin() == "..") return false;
  for (const fs::path& part : relative)
    if (part.string().rfind('.', 0) == 0) return false;
  return true;
}

// An output the data would read: a checkpoint folder or log file inside a data folder or
// matching a data glob (the first run lists its files at start and is unaffected, but a resumed
// run reads its checkpoints or logs as training data, and pruning then deletes files it reads),
// or a log file that is a data file, which writing it destroys (docs/failures.md, "Bad input").
std::string outputs_in_data_problem(const Config& config) {
  if (config.data.source == DataSource::synthetic) return "";
  for (const auto& [data_key, pattern] :
       {std::pair<const char*, std::string>{"data.path", config.data.path},
        {"data.val_path", config.data.val_path}}) {
    if (pattern.empty()) continue;
    const bool glob = pattern.find_first_of("*?[") != std::string::npos;
    const bool folder = !glob && input_folder_problem(pattern).empty();
    for (const RunOutput& output : run_outputs(config)) {
      const std::string what = std::string(output.key) + " '" + output.path + "'";
      const std::string harm =
          ": a resumed run would read what this run writes there as training data; put it "
          "outside the data";
      if (folder && folder_lists(pattern, output.files.front()))
        return what + " is inside " + data_key + " '" + pattern + "'" + harm;
      for (const std::string& file : output.files) {
        if (glob && fnmatch(absolute_path(pattern).c_str(), absolute_path(file).c_str(),
                            FNM_PATHNAME | FNM_PERIOD) == 0)
          return what + (file == output.path ? "" : " writes '" + file + "', which") + " matches " +
                 data_key + " '" + pattern + "'" + harm;
        std::error_code error;
        if (!glob && !folder && fs::equivalent(pattern, file, error))
          return what + " is " + data_key + " '" + pattern +
                 "': writing it would destroy the data; give the run another file";
      }
    }
  }
  return "";
}

}  // namespace

void check_run_files(Comm& world, const Config& config) {
  agree_on_failure(world, world.rank() == 0 ? outputs_problem(config.log) : "",
                   ExitCode::bad_input);
  agree_on_failure(world, val_path_problem(config.data), ExitCode::bad_input);
  agree_on_failure(world, world.rank() == 0 ? outputs_in_data_problem(config) : "",
                   ExitCode::bad_input);
}

}  // namespace ulysses
