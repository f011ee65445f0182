#include "core/jobs/job_errors.h"

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/weights_io.h"
#include "core/config/config.h"
#include "data/dataset.h"

namespace ulysses {

ExitCode exit_code_for(const std::exception& error) {
  if (const auto* job = dynamic_cast<const JobError*>(&error)) return job->code();
  if (dynamic_cast<const ConfigError*>(&error) || dynamic_cast<const DataError*>(&error) ||
      dynamic_cast<const CheckpointError*>(&error) || dynamic_cast<const WeightsError*>(&error))
    return ExitCode::bad_input;
  return ExitCode::runtime;
}

}  // namespace ulysses
