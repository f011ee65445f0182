// Checkpoints (docs/checkpoints.md): a folder per step holding the weights as safetensors,
// the optimizer state (one file per shard), the trainer state and a manifest with a CRC-32
// per file (the format: core/checkpoint_format.h). Written under a temporary name, fsynced
// and renamed; `latest` is replaced atomically, so a crash at any moment leaves the
// previous checkpoint intact. A state that is not finite is never written, and nothing a
// run did not write itself is replaced without train.checkpoint.overwrite.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint_format.h"
#include "core/config.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "parallel/comm.h"

namespace ulysses {

// Collective: rank 0 resolves --resume ("auto" → the newest intact checkpoint of
// checkpoint_dir, or "" to start fresh when there is none; a step folder; a checkpoint
// dir → its newest) and every rank gets its answer, so all ranks resume the same step.
// Throws JobError(bad_input) on every rank when there is nothing to resume from.
std::string agree_resume_folder(Comm& world, const std::string& resume,
                                const std::string& checkpoint_dir);

// Collective, before the first step. Refuses (JobError bad_input on every rank) a run that
// would overwrite another run's checkpoints: a fresh run (resume_folder "") into a
// train.checkpoint.dir that holds step folders, or a resume from an older step than the
// newest intact checkpoint there; with train.checkpoint.overwrite a fresh run deletes them
// instead. Then creates the folder and test-writes it from every rank.
void prepare_checkpoint_dir(Comm& world, const CheckpointConfig& checkpoint,
                            const std::string& resume_folder);

// A step folder as keep_last pruning sees it.
struct PruneCandidate {
  std::string path;
  bool finite_loss = false;  // its trainer state records a finite loss
};
// The folders keep_last pruning removes, of candidates given newest first: all but the
// keep_last newest, the one just written, and the newest whose loss was finite (so a run that
// diverged can always go back to a good state). keep_last 0 keeps everything.
std::vector<std::string> folders_to_prune(const std::vector<PruneCandidate>& newest_first,
                                          int keep_last, const std::string& just_written);

class Checkpointer {
 public:
  Checkpointer(const Config& config, Backend& backend, Comm& world);

  // Collective: writes dir/step_XXXXXXXX, repoints dir/latest, prunes to keep_last (never
  // the newest checkpoint whose loss was finite). loss is the last step's (nullopt when it
  // was not finite). Throws JobError(nonfinite) without writing anything when the weights
  // or optimizer moments hold a NaN or infinity. Returns the folder written.
  std::string save(int64_t step, std::optional<double> loss, Model& model, const AdamW& optimizer);

  // Collective: verifies and loads a checkpoint folder; returns its trainer state.
  TrainerState load(const std::string& folder, Model& model, AdamW& optimizer);

 private:
  void prune(const std::string& keep_folder);

  const Config& config_;
  Backend& backend_;
  Comm& world_;
};

}  // namespace ulysses
