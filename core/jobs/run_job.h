// What ulysses-train does with a parsed command line: opens the run (config, checks that
// every rank runs the same job, backend, communicators, mesh, threads, the checkpoint
// folder), then plans (--dry-run) or trains. apps/ only parses arguments and turns errors
// into an exit (docs/failures.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace ulysses {

struct JobOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "a.b=value"
  bool dry_run = false;
  std::optional<std::string> resume;  // --resume: auto, a step folder or a checkpoint dir
};

// Runs the job on this rank of world. Errors are thrown: JobError for verdicts every rank
// reached together, other exceptions for failures of this rank (core/jobs/job_errors.h).
void run_job(const JobOptions& options, Comm& world);

}  // namespace ulysses
