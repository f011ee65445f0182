// The run log's format on every rank: time, rank (under mpirun), level, message; colours only
// on a terminal (docs/configuration.md#logs), so that files and pipes get plain text.
#pragma once

#include <string>

namespace ulysses {

enum class LogColor { automatic, always, never };

// Where the log goes: stdout, or stderr for a command whose stdout is its product (eval --json,
// sample), so that a pipe or a JSON parser gets only that.
enum class LogStream { out, err };

// "auto", "always" or "never"; throws std::invalid_argument naming them otherwise.
LogColor parse_log_color(const std::string& name);

// Whether log lines get ANSI colours. auto: only when stream is a terminal, NO_COLOR is unset
// and no MPI launcher started this process (Open MPI hands its ranks a pseudo-terminal even
// when mpirun's own output goes to a file, so a rank cannot tell).
bool log_uses_colors(LogColor color, LogStream stream = LogStream::out);

// Installs the default logger; errors are flushed as they are logged, so that a rank's fatal
// message reaches mpirun before the job is aborted. rank < 0: not part of a job yet.
void setup_logging(LogColor color, int rank = -1, int world_size = 1,
                   LogStream stream = LogStream::out);

}  // namespace ulysses
