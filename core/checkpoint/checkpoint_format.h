// The checkpoint folder format (docs/checkpoints.md): the names of the files in a step
// folder, the manifest and trainer_state schemas, verification, and "folder → newest
// intact checkpoint". Every reader of checkpoints (resume, model.init_from, export) and the
// writer go through here, so the format lives in one place.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"

namespace ulysses {

// A checkpoint that cannot be used: names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointStateFile = "trainer_state.json";
inline constexpr const char* kCheckpointManifestFile = "manifest.json";
inline constexpr const char* kCheckpointLatestFile = "latest";
// Where train.checkpoint.overwrite moves the checkpoints it replaces while it publishes the
// first checkpoint of the new run, and the file there naming that checkpoint
// (core/checkpoint/checkpoint_overwrite.h).
inline constexpr const char* kOverwritePendingFolder = ".overwrite-pending";
inline constexpr const char* kOverwriteReplacementFile = "replaced-by";
// The pending folder's name once the overwrite is complete and its contents are being deleted.
inline constexpr const char* kOverwriteDeletingFolder = ".overwrite-deleting";
// Hidden folders that are never checkpoints: a save writes .tmp-step_XXXXXXXX and renames it
// when complete; pruning renames a step folder to .pruning-step_XXXXXXXX before deleting it.
// What a kill leaves of either, the next start deletes (core/checkpoint/checkpoint_dir.h).
inline constexpr const char* kSavingPrefix = ".tmp-";
inline constexpr const char* kPruningPrefix = ".pruning-";
// The file whose flock(2) the run using the folder holds (core/checkpoint/checkpoint_lock.h).
inline constexpr const char* kCheckpointLockFile = ".lock";

// "step_00001000"
std::string checkpoint_folder_name(int64_t step);
// "optimizer-00003-of-00004.safetensors"
std::string optimizer_file_name(int shard, int shards);
// Step folders (step_<digits>) under dir, newest first; empty when dir does not exist.
std::vector<std::pair<int64_t, std::string>> checkpoint_step_folders(const std::string& dir);

struct ManifestEntry {
  std::string name;  // a file of the step folder (a plain name, no '/')
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointManifest {
  int64_t step = 0;
  std::vector<ManifestEntry> files;
};

// The model a checkpoint was written for (trainer_state.json "model"). rope_theta and
// norm_eps are set only where the checkpoint records them.
struct CheckpointModel {
  ModelConfig model;  // sizes recorded; rope_theta/norm_eps are the defaults
  std::optional<double> rope_theta;
  std::optional<double> norm_eps;
};

// The divergence guard's state (core/train/divergence_guard.h): what a resumed run needs to judge
// steps and to know its checkpoint to go back to as the uninterrupted run would.
struct GuardRecord {
  // The step of the newest checkpoint whose weights a normal step measured, in the folder
  // the checkpoint was written to; absent when there is none.
  std::optional<int64_t> good_step;
  double loss_mean = 0.0;    // running mean of the normal steps' loss
  int64_t normal_steps = 0;  // how many normal steps the mean holds; 0 = none yet
};

struct TrainerState {
  int64_t step = 0;                // optimizer steps taken
  int64_t sequences_per_step = 0;  // global batch in sequences; 0 when not recorded
  std::optional<double> loss;      // the last step's loss; absent when it was not finite
  GuardRecord guard;               // absent in checkpoints of earlier builds: all zero
  int world_size = 0;              // the run that wrote it, for the resume log
  int sp = 0;
  int zero_stage = 0;
  CheckpointModel model;
  std::vector<std::string> optimizer_shards;  // file names in the step folder
  // What decided the tokens the run read (data_order_keys), and its training split's
  // sequences at the sequence length of the saved step; empty and 0 in checkpoints of
  // earlier builds.
  std::map<std::string, std::string> data_keys;
  int64_t data_seq_len = 0;
  int64_t train_sequences = 0;
  // What the learning rate of every step was a function of (lr_schedule_keys); empty in
  // checkpoints of earlier builds.
  std::map<std::string, std::string> lr_schedule_keys;
};

// Parse and check every field; throw CheckpointError naming path and the field.
CheckpointManifest parse_manifest(const std::string& text, const std::string& path);
TrainerState parse_trainer_state(const std::string& text, const std::string& path);
std::string manifest_json(const CheckpointManifest& manifest);
std::string trainer_state_json(const TrainerState& state);

// Reads folder/trainer_state.json: all of it, or only the model it records (what
// model.init_from and export need).
TrainerState read_trainer_state(const std::string& folder);
CheckpointModel read_recorded_model(const std::string& folder);

// Checks the manifest and the presence, size and CRC-32 of every file it lists; throws
// CheckpointError.
void verify_checkpoint(const std::string& folder);

// The newest intact checkpoint under dir: the newest step folder that verifies, whatever
// `latest` names (a save interrupted by a full disk can leave `latest` behind a newer intact
// folder; docs/checkpoints.md). Warns when `latest` names another folder or is unusable.
// Empty when there is none.
std::string find_latest_checkpoint(const std::string& dir);

// The folder name dir/latest holds ("" when there is no such file); throws CheckpointError
// when it is unreadable or not a plain name.
std::string read_latest_name(const std::string& dir);
// Points dir/latest at the step folder `name`, atomically (written beside it, fsynced and
// renamed).
void point_latest_at(const std::string& dir, const std::string& name);

// A step folder itself (it has a manifest), or the newest intact checkpoint of a checkpoint
// dir; empty when path is neither.
std::string checkpoint_in(const std::string& path);
// Why checkpoint_in(path) found nothing, for messages: the path is missing, a file, holds no
// step folders, or only broken ones (with the newest one's problem).
std::string why_no_checkpoint_in(const std::string& path);
// checkpoint_in(path), or a CheckpointError that names the option the path came from
// ("--checkpoint: ...") and why_no_checkpoint_in: what resume, eval and export all take.
std::string require_checkpoint_in(const std::string& path, const std::string& option);

}  // namespace ulysses
