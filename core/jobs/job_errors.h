// How a run ends (docs/failures.md): the exit status of an error raised on one rank. The
// statuses and the error every rank raises together are parallel/exit_code.h.
#pragma once

#include <exception>

#include "parallel/exit_code.h"

namespace ulysses {

// The exit status for an error raised on one rank: bad input (config, data, checkpoint
// and weight files) is 2, a JobError carries its own, anything else is 1.
ExitCode exit_code_for(const std::exception& error);

}  // namespace ulysses
