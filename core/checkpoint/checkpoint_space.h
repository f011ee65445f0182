// Disk space for checkpoints (docs/checkpoints.md#disk-space): what one checkpoint of a model
// takes, which steps a run saves, and the verdicts on the room train.checkpoint.dir's file
// system has. Before the first step a folder that cannot hold one checkpoint stops the run and
// one that cannot hold what the run keeps is warned about, naming the save that would not
// fit; before each save, a checkpoint that would not fit is not started, so a run never fills
// the disk with a checkpoint it cannot finish.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/params.h"

namespace ulysses {

// The bytes one checkpoint of this model takes: the weights, both Adam moments (all shards
// together) and the trainer state and manifest, whose few KiB are bounded from above.
uint64_t checkpoint_bytes(const ParamTable& table, int optimizer_shards);

// The bytes an unprivileged writer may still use in the file system holding `folder` (the
// nearest existing folder above it when it does not exist yet); nullopt when the system
// cannot say (an error, or a file system that reports no capacity), and then nothing is
// checked.
std::optional<uint64_t> available_bytes(const std::string& folder);

// Whether a run of last_step steps saves after `step`: every checkpoint.every steps and the
// last step.
bool is_checkpoint_step(const CheckpointConfig& checkpoint, int64_t step, int64_t last_step);

// The steps in (first_step, last_step] at which a run saves (is_checkpoint_step).
std::vector<int64_t> checkpoint_steps(const CheckpointConfig& checkpoint, int64_t first_step,
                                      int64_t last_step);

// The most checkpoint folders a run that starts in an empty folder holds at once, while its
// last save of `saves` is written: keep_last pruning keeps max(keep_last, 2) (the checkpoint to
// go back to as well), plus the one being written; all of them when keep_last is 0.
int64_t checkpoints_held_at_most(const CheckpointConfig& checkpoint, int64_t saves);

// What the folder's room means for a run about to start: an error when it cannot hold the
// first save, a warning when a later save would not fit. `kept` counts the step folders there
// that the run keeps (a resumed run's; not those train.checkpoint.overwrite replaces), which
// keep_last pruning removes like the run's own.
struct SpaceVerdict {
  std::string error;
  std::string warning;
};
SpaceVerdict checkpoint_space_at_start(const CheckpointConfig& checkpoint, uint64_t checkpoint_size,
                                       uint64_t available, int kept,
                                       const std::vector<int64_t>& save_steps);

// "" when a checkpoint of checkpoint_size fits in `available`, else why the save at `step`
// is not started and how to go on.
std::string checkpoint_space_at_save(const std::string& dir, int64_t step, uint64_t checkpoint_size,
                                     uint64_t available);

}  // namespace ulysses
