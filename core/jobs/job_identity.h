// Every rank runs the same job (docs/failures.md): the resolved configuration, the command
// (what the job does with it: "train --resume auto", "eval --checkpoint DIR", "sample") and
// the binary's version are compared across ranks before the first step. The
// collectives that agree on verdicts are parallel/agreement.h.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "parallel/comm.h"

namespace ulysses {

// "key=value" lines that identify the job: every config key as resolved, the command and the
// binary's version.
std::vector<std::string> job_identity(const Config& config, const std::string& command);

// Collective: compares every rank's job_identity with rank 0's. When any differs, every
// rank throws JobError(bad_input) whose message (printed by rank 0) names each key that
// differs and the ranks and values involved.
void check_same_job(Comm& world, const std::vector<std::string>& identity);

// The version this binary was built from (git describe, or the project version).
const char* ulysses_version();

}  // namespace ulysses
