// Every rank runs the same job (docs/failures.md): verdicts reached on each rank are
// agreed before anyone acts on them, decisions that depend on one rank's view of the world
// (files, the resume folder) are made once and shared, and the resolved configuration is
// compared across ranks before the first step.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/job_errors.h"
#include "parallel/comm.h"

namespace ulysses {

// Collective. Each rank passes its own verdict ("" = fine). When any rank failed, every
// rank throws JobError(code): rank 0 prints its message, or, when rank 0 was fine, each
// failing rank prints its own. Every rank calls it once per check, whatever its verdict.
void agree_on_failure(Comm& world, const std::string& error, ExitCode code);

// Collective: text of rank root on every rank.
void broadcast_string(Comm& world, std::string& text, int root);
// Collective: every rank's text, by rank, on every rank.
std::vector<std::string> all_gather_strings(Comm& world, const std::string& mine);

// "key=value" lines that identify the job: every config key as resolved, the --resume
// argument and the binary's version.
std::vector<std::string> job_identity(const Config& config, const std::string& resume_argument);

// Collective: compares every rank's job_identity with rank 0's. When any differs, every
// rank throws JobError(bad_input) whose message (printed by rank 0) names each key that
// differs and the ranks and values involved.
void check_same_job(Comm& world, const std::vector<std::string>& identity);

// The version this binary was built from (git describe, or the project version).
const char* ulysses_version();

}  // namespace ulysses
