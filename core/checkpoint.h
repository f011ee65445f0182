// Checkpoints (DESIGN.md §7): a folder per step holding the weights as safetensors, the
// optimizer state (one file per shard), the trainer state and a manifest with a CRC-32
// per file. Written under a temporary name, fsynced and renamed; `latest` is replaced
// atomically, so a crash at any moment leaves the previous checkpoint intact.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/config.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "parallel/comm.h"

namespace ulysses {

// A checkpoint that cannot be used: names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kCheckpointFormatVersion = 1;

// "step_00001000"
std::string checkpoint_folder_name(int64_t step);

// Checks the manifest, the presence, size and CRC-32 of every file; throws CheckpointError.
void verify_checkpoint(const std::string& folder);

// The newest intact checkpoint under dir: the one `latest` names if it verifies, else the
// newest step folder that does. Empty when there is none.
std::string find_latest_checkpoint(const std::string& dir);

// Resolves --resume: "auto" → find_latest_checkpoint(config dir) (empty: start fresh);
// a step folder → itself; a checkpoint dir → its latest. Throws when PATH has none.
std::string resolve_resume_path(const std::string& resume, const std::string& checkpoint_dir);

class Checkpointer {
 public:
  Checkpointer(const Config& config, Backend& backend, Comm& world);

  // Collective: writes dir/step_XXXXXXXX, repoints dir/latest, prunes to keep_last.
  // Returns the folder written.
  std::string save(int64_t step, Model& model, const AdamW& optimizer);

  // Collective: verifies and loads a checkpoint folder; returns its step.
  int64_t load(const std::string& folder, Model& model, AdamW& optimizer);

 private:
  const Config& config_;
  Backend& backend_;
  Comm& world_;
};

}  // namespace ulysses
