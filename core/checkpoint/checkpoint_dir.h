// The checkpoint folder before the first step (docs/checkpoints.md): what an interrupted
// overwrite, prune or save left is finished or deleted, --resume names one folder for every
// rank, and a run that would overwrite another run's checkpoints, or whose folder cannot be
// written or cannot hold one checkpoint, stops before the model is built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_lock.h"
#include "core/config/config.h"
#include "parallel/comm.h"

namespace ulysses {

// Collective, before anything reads checkpoint_dir: rank 0 locks it for this run
// (core/checkpoint/checkpoint_lock.h; a folder not there yet is locked once
// prepare_checkpoint_dir has created it), finishes or undoes what an interrupted
// train.checkpoint.overwrite left there (core/checkpoint/checkpoint_overwrite.h) and logs it,
// and deletes what an interrupted prune or save left (hidden folders, never published).
// JobError(bad_input) on every rank when another run holds the folder or it cannot be
// recovered.
void recover_checkpoint_dir(Comm& world, const std::string& checkpoint_dir,
                            CheckpointDirLock& lock);

// Collective: rank 0 resolves --resume ("auto" → the newest intact checkpoint of
// checkpoint_dir, or "" to start fresh when there is none; a step folder; a checkpoint
// dir → its newest) and every rank gets its answer, so all ranks resume the same step.
// Throws JobError(bad_input) on every rank when there is nothing to resume from.
std::string agree_resume_folder(Comm& world, const std::string& resume,
                                const std::string& checkpoint_dir);

// Collective, before the first step. Refuses (JobError bad_input on every rank) a run that
// would overwrite another run's checkpoints: a fresh run (resume_folder "") into a
// train.checkpoint.dir that holds step folders, or a resume from an older step than the
// newest intact step folder there (whatever `latest` says). With train.checkpoint.overwrite
// it returns, on rank 0, the step folders this run replaces (all of them for a fresh run,
// those newer than the resumed step otherwise): they stay until the run's first checkpoint
// is written and verified (Checkpointer::replace_after_first_save). Otherwise it repoints a
// `latest` that lags behind the newest intact folder. Refuses a folder whose file system cannot
// hold one checkpoint of checkpoint_size bytes (core/checkpoint/checkpoint_space.h) and warns
// when it cannot hold what the run keeps. Then creates the folder, locks it if
// recover_checkpoint_dir found none to lock (refused when another run took it meanwhile), and
// test-writes it from every rank.
std::vector<std::string> prepare_checkpoint_dir(Comm& world, const TrainConfig& train,
                                                uint64_t checkpoint_size,
                                                const std::string& resume_folder,
                                                CheckpointDirLock& lock);

}  // namespace ulysses
