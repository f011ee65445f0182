// What a training run checks before it builds the model besides its memory
// (core/jobs/memory_fit.h): the files it writes or reads only later (log.metrics_file,
// log.trace_file, data.val_path), and that none of its outputs is where its data is read.
// Without it, a run trained and then failed at the first log line, after the last step, or at
// its first evaluation, and a log file named like the data file destroyed it (docs/failures.md,
// "Bad input").
#pragma once

#include "core/config/config.h"
#include "parallel/comm.h"

namespace ulysses {

// Collective: log.metrics_file and log.trace_file can be written (their folder exists and is
// writable, an existing file opens for appending; nothing is created), and data.val_path names
// readable files even when train.eval_every is 0, and no output (the checkpoint folder, those
// files) is where data.path or data.val_path would read it. Every rank throws
// JobError(bad_input) together, rank 0 naming the key.
void check_run_files(Comm& world, const Config& config);

}  // namespace ulysses
