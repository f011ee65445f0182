#include "core/checkpoint/weights_source.h"

#include <memory>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/weights_io.h"
#include "parallel/agreement.h"

namespace ulysses {

std::string load_weight_source(const WeightSource& source, const ModelConfig& config, Model& model,
                               Comm& world) {
  std::string path = source.init_from;
  std::unique_ptr<PretrainedWeights> weights;
  std::string error;
  try {
    if (!source.checkpoint.empty()) path = require_checkpoint_in(source.checkpoint, "--checkpoint");
    weights = std::make_unique<PretrainedWeights>(path, config, model.table());
  } catch (const CheckpointError& problem) {  // bad input: agreed below; anything else throws
    error = problem.what();
  } catch (const WeightsError& problem) {
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  // Each rank reads only the ranges it stores.
  model.load_weights(
      [&](int64_t begin, int64_t count, float* out) { weights->read(begin, count, out); });
  return path;
}

}  // namespace ulysses
