// What a training run checks before it builds the model (docs/failures.md, "Bad input"): the
// files it writes or reads only later (log.metrics_file, log.trace_file, data.val_path), and
// each stage of a curriculum against memory.limit_gib. Without these, a run trained and then
// failed at the first log line, after the last step, or at a stage change.
#pragma once

#include "core/config/config.h"
#include "parallel/comm.h"

namespace ulysses {

// Collective: log.metrics_file and log.trace_file can be written (their folder exists and is
// writable, an existing file opens for appending; nothing is created), and data.val_path names
// readable files even when train.eval_every is 0. Every rank throws JobError(bad_input)
// together, rank 0 naming the key.
void check_run_files(Comm& world, const Config& config);

// Collective: with train.seq_len_schedule and memory.limit_gib, every stage's planned step
// peak (core/plan/memory_plan.h, cpu_threads as the run's backend has them) fits the limit, else
// every rank throws JobError(runtime): the status of an allocation past the limit, reached
// before the first step instead of at the stage change.
void check_stages_fit(Comm& world, const Config& config, int cpu_threads);

}  // namespace ulysses
