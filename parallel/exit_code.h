// How a run ends (docs/failures.md): the exit statuses, and the error every rank of a job
// raises together. The top of each binary is the one place that turns errors into a logged
// message and an exit (or a job-wide abort); core/jobs/job_errors.h maps the other errors.
#pragma once

#include <stdexcept>
#include <string>

namespace ulysses {

enum class ExitCode : int {
  done = 0,       // finished (also after SIGTERM/SIGINT, with a checkpoint)
  runtime = 1,    // a failure while running: I/O, MPI, out of memory, a bug
  bad_input = 2,  // bad arguments, config, data, checkpoint or weight files
  nonfinite = 3,  // the loss or gradient became NaN or infinite (train.on_nonfinite)
  timeout = 4,    // a rank waited longer than parallel.timeout_s in a collective
};

// An error that every rank of the job raised at the same point with the same verdict:
// each rank exits with its code without aborting the job, and only ranks with something
// to say print (rank 0, or the ranks that found the problem when rank 0 did not).
class JobError : public std::runtime_error {
 public:
  JobError(ExitCode code, const std::string& message, bool print_here)
      : std::runtime_error(message), code_(code), print_here_(print_here) {}
  ExitCode code() const { return code_; }
  bool print_here() const { return print_here_; }

 private:
  ExitCode code_;
  bool print_here_;
};

}  // namespace ulysses
