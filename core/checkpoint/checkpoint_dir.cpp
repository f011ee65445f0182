#include "core/checkpoint/checkpoint_dir.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_overwrite.h"
#include "core/checkpoint/checkpoint_space.h"
#include "core/checkpoint/file_util.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

// What rank 0 found in the checkpoint folder before the first step: "" when all is well.
// `replaced` gets the step folders this run replaces (train.checkpoint.overwrite).
std::string inspect_checkpoint_dir(const CheckpointConfig& checkpoint,
                                   const std::string& resume_folder,
                                   std::vector<std::string>& replaced) {
  const std::string& dir = checkpoint.dir;
  const auto folders = checkpoint_step_folders(dir);
  const std::string newest = find_latest_checkpoint(dir);
  if (resume_folder.empty() && !folders.empty()) {
    const std::string newest_name = fs::path(folders.front().second).filename().string();
    if (!checkpoint.overwrite && newest.empty())
      return "train.checkpoint.dir '" + dir +
             "' holds step folders of an earlier run (newest: " + newest_name +
             ") but none is intact, so there is nothing to resume and this run would " +
             "overwrite them; to start over and replace them set train.checkpoint.overwrite: " +
             "true, or choose another train.checkpoint.dir";
    if (!checkpoint.overwrite)
      return "train.checkpoint.dir '" + dir + "' already holds checkpoints of an earlier run " +
             "(newest: " + newest_name + ") and this run starts fresh, so it would overwrite " +
             "them. To continue that run use --resume auto; to start over and replace them " +
             "set train.checkpoint.overwrite: true; or choose another train.checkpoint.dir";
    for (const auto& [step, folder] : folders) replaced.push_back(folder);
    spdlog::warn(
        "train.checkpoint.overwrite: this run replaces the {} checkpoint(s) of an earlier run in "
        "{} (newest: {}); they stay until it has written and verified its first checkpoint",
        folders.size(), dir, newest_name);
  }
  if (!resume_folder.empty() && !newest.empty() &&
      fs::weakly_canonical(newest) != fs::weakly_canonical(resume_folder)) {
    const int64_t resume_step = read_trainer_state(resume_folder).step;
    const int64_t newest_step = read_trainer_state(newest).step;
    if (newest_step > resume_step && !checkpoint.overwrite)
      return "this run resumes from step " + std::to_string(resume_step) + " (" + resume_folder +
             ") but train.checkpoint.dir '" + dir + "' holds a newer intact checkpoint (" + newest +
             ", step " + std::to_string(newest_step) +
             ") that it would overwrite. To continue from the newest use --resume auto; to go " +
             "back to step " + std::to_string(resume_step) + " and replace the newer " +
             "checkpoints set train.checkpoint.overwrite: true (they stay until this run has " +
             "written and verified its first checkpoint); or choose another " +
             "train.checkpoint.dir";
    if (newest_step > resume_step) {
      for (const auto& [step, folder] : folders)
        if (step > resume_step) replaced.push_back(folder);
      spdlog::warn(
          "train.checkpoint.overwrite: this run resumes from step {} and replaces the {} newer "
          "checkpoint(s) in {} (newest: {}); they stay until it has written and verified its "
          "first checkpoint",
          resume_step, replaced.size(), dir, fs::path(newest).filename().string());
    }
  }
  // `latest` follows the folders (docs/checkpoints.md): repointed where it lags behind them,
  // unless this run replaces them anyway.
  if (replaced.empty() && !newest.empty()) {
    std::string latest;
    try {
      latest = read_latest_name(dir);
    } catch (const CheckpointError&) {
    }
    const std::string newest_name = fs::path(newest).filename().string();
    if (latest != newest_name) {
      point_latest_at(dir, newest_name);
      spdlog::info("{}/latest now names {}, the newest intact checkpoint", dir, newest_name);
    }
  }
  return "";
}

std::string create_checkpoint_dir(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || !fs::is_directory(dir))
    return "train.checkpoint.dir '" + dir +
           "' cannot be created: " + (error ? error.message() : "a file of that name exists");
  return "";
}

// Rank 0, after inspect_checkpoint_dir: an error when the folder's file system cannot hold
// the run's first checkpoint; a warning, logged here, when a later save would not fit.
std::string check_checkpoint_space(const TrainConfig& train, uint64_t checkpoint_size,
                                   const std::string& resume_folder, size_t replaced) {
  const std::optional<uint64_t> available = available_bytes(train.checkpoint.dir);
  if (!available) return "";
  const int64_t first_step = resume_folder.empty() ? 0 : read_trainer_state(resume_folder).step;
  const size_t folders = checkpoint_step_folders(train.checkpoint.dir).size();
  const SpaceVerdict verdict = checkpoint_space_at_start(
      train.checkpoint, checkpoint_size, *available, int(folders - std::min(folders, replaced)),
      checkpoint_steps(train.checkpoint, first_step, train.steps));
  if (!verdict.warning.empty()) spdlog::warn("{}", verdict.warning);
  return verdict.error;
}

// What a kill left of a prune or a save (the hidden folders of checkpoint_format.h): never a
// published checkpoint, and only taking space.
void delete_interrupted_prunes_and_saves(const std::string& checkpoint_dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPruningPrefix, 0) == 0 || name.rfind(kSavingPrefix, 0) == 0)
      fs::remove_all(entry.path());
  }
}

}  // namespace

void recover_checkpoint_dir(Comm& world, const std::string& checkpoint_dir,
                            CheckpointDirLock& lock) {
  if (checkpoint_dir.empty()) return;
  Watchdog::SlowWork slow(world.watchdog().get(), "recovering the checkpoint folder");
  std::string error;
  if (world.rank() == 0 && fs::is_directory(checkpoint_dir)) error = lock.acquire(checkpoint_dir);
  agree_on_failure(world, error, ExitCode::bad_input);
  if (world.rank() == 0) {
    try {
      const std::string done = recover_interrupted_overwrite(checkpoint_dir);
      if (!done.empty()) spdlog::warn("{}", done);
      delete_interrupted_prunes_and_saves(checkpoint_dir);
    } catch (const std::exception& problem) {
      error = problem.what();
    }
  }
  agree_on_failure(world, error, ExitCode::bad_input);
}

std::string agree_resume_folder(Comm& world, const std::string& resume,
                                const std::string& checkpoint_dir) {
  std::string folder, error;
  if (world.rank() == 0) {
    Watchdog::SlowWork slow(world.watchdog().get(), "finding the checkpoint to resume");
    try {
      if (resume == "auto") {
        if (checkpoint_dir.empty())
          error = "--resume auto needs train.checkpoint.dir in the config";
        else
          folder = find_latest_checkpoint(checkpoint_dir);
        if (error.empty() && folder.empty())
          spdlog::info("--resume auto: no checkpoint in {} yet, starting from step 0",
                       checkpoint_dir);
      } else {
        folder = require_checkpoint_in(resume, "--resume");
      }
    } catch (const CheckpointError& problem) {
      error = problem.what();
    } catch (const std::exception& problem) {
      error = "--resume " + resume + ": " + problem.what();
    }
  }
  {
    Watchdog::SlowWork slow(world.watchdog().get(), "finding the checkpoint to resume");
    agree_on_failure(world, error, ExitCode::bad_input);
  }
  broadcast_string(world, folder, 0);
  return folder;
}

std::vector<std::string> prepare_checkpoint_dir(Comm& world, const TrainConfig& train,
                                                uint64_t checkpoint_size,
                                                const std::string& resume_folder,
                                                CheckpointDirLock& lock) {
  const CheckpointConfig& checkpoint = train.checkpoint;
  std::vector<std::string> replaced;
  if (checkpoint.dir.empty()) return replaced;
  Watchdog::SlowWork slow(world.watchdog().get(), "preparing the checkpoint folder");
  std::string error;
  if (world.rank() == 0) {
    try {
      error = inspect_checkpoint_dir(checkpoint, resume_folder, replaced);
      if (error.empty())
        error = check_checkpoint_space(train, checkpoint_size, resume_folder, replaced.size());
      if (error.empty()) error = create_checkpoint_dir(checkpoint.dir);
      // A folder that was not there to lock when recovering: another run that created it
      // meanwhile holds it.
      if (error.empty() && !lock.acquired()) error = lock.acquire(checkpoint.dir);
    } catch (const std::exception& problem) {
      error = "train.checkpoint.dir '" + checkpoint.dir + "': " + problem.what();
    }
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  // Every rank writes into step folders (its optimizer shard): each proves it can.
  const std::string probe = checkpoint.dir + "/.write-test-rank" + std::to_string(world.rank());
  try {
    write_file_durably(probe, "ulysses write test\n");
    fs::remove(probe);
  } catch (const std::exception& problem) {
    error = "train.checkpoint.dir '" + checkpoint.dir + "' is not writable from rank " +
            std::to_string(world.rank()) + ": " + problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  return replaced;
}

}  // namespace ulysses
