// Checkpoints (docs/checkpoints.md): a folder per step holding the weights as safetensors,
// the optimizer state (one file per shard), the trainer state and a manifest with a CRC-32
// per file (the format: core/checkpoint/checkpoint_format.h). Written under a temporary name,
// fsynced and renamed; `latest` is replaced atomically, so a crash at any moment leaves the
// previous checkpoint intact. A state that is not finite is never written, and nothing a
// run did not write itself is replaced without train.checkpoint.overwrite, and then only
// once the run has written and verified its first checkpoint. The folder's checks before the
// first step: core/checkpoint/checkpoint_dir.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/optimizer_moments.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/comm.h"

namespace ulysses {

// The folders keep_last pruning removes, of step folders given newest first: all but the
// keep_last newest, the one just written, and the checkpoint to go back to (good_folder, the
// newest whose weights a normal step measured: core/train/divergence_guard.h), so a run that
// diverged can always go back to a good state. keep_last 0 keeps everything.
std::vector<std::string> folders_to_prune(const std::vector<std::string>& newest_first,
                                          int keep_last, const std::string& just_written,
                                          const std::string& good_folder);

// What the trainer records in a checkpoint beside the weights and optimizer moments.
struct CheckpointProgress {
  int64_t step = 0;
  std::optional<double> loss;  // the last step's; nullopt when it was not finite
  GuardRecord guard;
  // The checkpoint to go back to: pruning keeps it, a refusal to save names it. "" = none.
  std::string good_folder;
  // The step's sequence length and the training split's sequences at it (TrainerState).
  int64_t seq_len = 0;
  int64_t train_sequences = 0;
};

class Checkpointer {
 public:
  Checkpointer(const Config& config, Backend& backend, Comm& world);

  // Collective: writes dir/step_XXXXXXXX, repoints dir/latest, prunes to keep_last (never
  // progress.good_folder). Throws JobError(nonfinite) without writing anything when the
  // weights or optimizer moments hold a NaN or infinity; JobError(runtime) on every rank, before
  // writing, when the folder's file system has no room for the checkpoint, and when writing
  // fails on any rank (its temporary folder removed). Returns the folder written.
  std::string save(const CheckpointProgress& progress, Model& model,
                   const OptimizerMoments& optimizer);

  // Rank 0: the step folders the next save replaces (train.checkpoint.overwrite;
  // core/checkpoint/checkpoint_overwrite.h). That save verifies its checkpoint before they move.
  void replace_after_first_save(std::vector<std::string> folders);

  // Collective: verifies and loads a checkpoint folder; returns its trainer state.
  TrainerState load(const std::string& folder, Model& model, const OptimizerMoments& optimizer);

 private:
  // The steps of save, in order; each collective one ends with stop_if_any_failed. Collective:
  // each rank's optimizer file (ZeRO: one per rank, else rank 0's alone) in temp_path;
  // returns every file's CRC-32 and size, at 2i and 2i + 1 for file i.
  std::vector<double> write_optimizer_files(const std::string& temp_path, int64_t step,
                                            Model& model, const OptimizerMoments& optimizer);
  // Collective: the weights file, each rank writing the master weights it stores.
  void write_weights(const std::string& temp_path, int64_t step, Model& model);
  // Rank 0: the trainer state and the manifest over every file.
  void write_state_and_manifest(const std::string& temp_path, const CheckpointProgress& progress,
                                Model& model, const std::vector<double>& optimizer_checksums);
  // Rank 0: temp_path becomes the step folder `name`, latest points at it, what it replaces
  // and what keep_last drops go.
  void publish(const std::string& temp_path, const std::string& name,
               const std::string& good_folder);
  void prune(const std::string& just_written, const std::string& good_folder);
  // Runs `write` unless this rank's save has failed already; an exception becomes `failure`,
  // the message every rank's exit gives for the checkpoint of `step`.
  void attempt_write(int64_t step, std::string& failure, const std::function<void()>& write);
  // Collective: when any rank's failure is set, rank 0 removes temp_path and every rank throws
  // JobError(runtime), the failing ranks (rank 0 first) printing theirs.
  void stop_if_any_failed(const std::string& temp_path, const std::string& failure);
  // Collective: whether the master weights and both moments are finite on every rank.
  bool training_state_is_finite(const ZeroState& state, const OptimizerMoments& optimizer);

  const Config& config_;
  Backend& backend_;
  Comm& world_;
  std::vector<std::string> replaced_;  // rank 0: what the next save replaces
};

}  // namespace ulysses
