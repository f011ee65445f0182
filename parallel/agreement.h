// Every rank runs the same job (docs/failures.md): verdicts reached on each rank are agreed
// before anyone acts on them, and decisions that depend on one rank's view of the world
// (files, the resume folder) are made once and shared.
#pragma once

#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/exit_code.h"

namespace ulysses {

// Collective. Each rank passes its own verdict ("" = fine). When any rank failed, every
// rank throws JobError(code): rank 0 prints its message, or, when rank 0 was fine, each
// failing rank prints its own. Every rank calls it once per check, whatever its verdict.
void agree_on_failure(Comm& world, const std::string& error, ExitCode code);

// Collective: text of rank root on every rank.
void broadcast_string(Comm& world, std::string& text, int root);
// Collective: every rank's text, by rank, on every rank.
std::vector<std::string> all_gather_strings(Comm& world, const std::string& mine);

}  // namespace ulysses
