#include "core/checkpoint/checkpoint_overwrite.h"

#include <algorithm>
#include <filesystem>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/file_util.h"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

std::string pending_folder(const std::string& dir) {
  return dir + "/" + kOverwritePendingFolder;
}

// The new checkpoint a pending overwrite publishes; "" when the file is absent. It is
// written, atomically, once everything replaced is moved aside and before the new folder
// takes its name, so a folder of that name in dir is the new one exactly when it is there.
std::string replacement_name(const std::string& pending) {
  std::error_code error;
  const std::string path = pending + "/" + kOverwriteReplacementFile;
  if (!fs::is_regular_file(path, error)) return "";
  std::string name = read_whole_file(path);
  name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
  return name;
}

}  // namespace

void move_replaced_aside(const std::string& dir, const std::vector<std::string>& replaced,
                         const std::string& new_name) {
  const std::string pending = pending_folder(dir);
  std::error_code error;
  if (fs::exists(pending, error))
    throw CheckpointError("'" + pending + "' appeared while this run trained: is another run " +
                          "writing into the same train.checkpoint.dir?");
  fs::create_directory(pending);
  for (const std::string& folder : replaced)
    if (fs::exists(folder, error))
      rename_or_throw(folder, pending + "/" + fs::path(folder).filename().string());
  const std::string latest = dir + "/" + kCheckpointLatestFile;
  if (fs::exists(latest, error)) rename_or_throw(latest, pending + "/" + kCheckpointLatestFile);
  fsync_directory(dir);
  const std::string marker = pending + "/" + kOverwriteReplacementFile;
  replace_file_durably(marker, new_name + "\n");
  fsync_directory(pending);
}

void delete_replaced(const std::string& dir) {
  // One rename settles it: a crash while the contents are deleted one by one leaves them
  // under a name the next run only deletes. Deleted in place, a crash could leave some of the
  // replaced checkpoints without `replaced-by`, and the next run would move them back beside
  // the new ones.
  const std::string deleting = dir + "/" + kOverwriteDeletingFolder;
  fs::remove_all(deleting);
  rename_or_throw(pending_folder(dir), deleting);
  fsync_directory(dir);
  fs::remove_all(deleting);
  fsync_directory(dir);
}

std::string recover_interrupted_overwrite(const std::string& dir) {
  if (dir.empty()) return "";
  const std::string pending = pending_folder(dir);
  const std::string deleting = dir + "/" + kOverwriteDeletingFolder;
  std::error_code error;
  if (fs::exists(deleting, error)) {
    fs::remove_all(deleting);
    fsync_directory(dir);
    if (!fs::is_directory(pending, error))
      return "train.checkpoint.overwrite was interrupted in '" + dir + "' while it deleted the " +
             "checkpoints of the earlier run it replaced: deleted the rest";
  }
  if (!fs::is_directory(pending, error)) return "";
  const std::string new_name = replacement_name(pending);
  std::vector<std::string> moved;  // what was moved aside, by name
  for (const auto& entry : fs::directory_iterator(pending)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kOverwriteReplacementFile, 0) != 0) moved.push_back(name);
  }
  const auto checkpoints = std::count_if(moved.begin(), moved.end(), [](const std::string& name) {
    return name != kCheckpointLatestFile;
  });
  bool published = false;
  if (!new_name.empty()) {
    try {
      verify_checkpoint(dir + "/" + new_name);
      published = true;
    } catch (const CheckpointError&) {
    }
  }
  if (published) {
    std::string latest;
    try {
      latest = read_latest_name(dir);
    } catch (const CheckpointError&) {
    }
    if (latest != new_name) point_latest_at(dir, new_name);
    delete_replaced(dir);
    return "train.checkpoint.overwrite was interrupted in '" + dir + "' after the new run's " +
           "first checkpoint (" + new_name + ") was in place: deleted the " +
           std::to_string(checkpoints) + " checkpoint(s) of the earlier run it replaces";
  }
  for (const std::string& name : moved)
    if (fs::exists(dir + "/" + name, error))
      throw CheckpointError("train.checkpoint.overwrite was interrupted in '" + dir +
                            "' before the new run's first checkpoint was in place, and '" + name +
                            "' cannot be moved back from '" + pending +
                            "': a file or folder of that name is in the way. Move one of them "
                            "elsewhere, then start again");
  for (const std::string& name : moved) rename_or_throw(pending + "/" + name, dir + "/" + name);
  fsync_directory(dir);
  delete_replaced(dir);
  return "train.checkpoint.overwrite was interrupted in '" + dir + "' before the new run's " +
         "first checkpoint was in place: moved the " + std::to_string(checkpoints) +
         " checkpoint(s) it had set aside back, as they were";
}

}  // namespace ulysses
