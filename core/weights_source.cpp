#include "core/weights_source.h"

#include <vector>

#include "core/checkpoint_format.h"
#include "core/job_agreement.h"
#include "core/weights_io.h"

namespace ulysses {

std::string load_weight_source(const WeightSource& source, const ModelConfig& config, Model& model,
                               Comm& world) {
  std::string path = source.init_from;
  std::vector<float> host(size_t(model.num_params()));
  std::string error;
  try {
    if (!source.checkpoint.empty()) {
      path = checkpoint_in(source.checkpoint);
      if (path.empty())
        throw CheckpointError("--checkpoint: " + why_no_checkpoint_in(source.checkpoint));
    }
    load_pretrained_weights(path, config, model.table(), host);
  } catch (const std::exception& problem) {
    if (exit_code_for(problem) != ExitCode::bad_input) throw;
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  model.load_weights(host.data());
  return path;
}

}  // namespace ulysses
