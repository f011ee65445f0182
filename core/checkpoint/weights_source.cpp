#include "core/checkpoint/weights_source.h"

#include <memory>
#include <stdexcept>

#include "core/checkpoint/checkpoint_format.h"
#include "parallel/agreement.h"

namespace ulysses {

OpenedWeights open_weight_source(const WeightSource& source, const ModelConfig& config,
                                 Comm& world) {
  OpenedWeights opened;
  opened.path = source.init_from;
  opened.table = std::make_unique<ParamTable>(config);
  std::string error;
  try {
    if (!source.checkpoint.empty())
      opened.path = require_checkpoint_in(source.checkpoint, "--checkpoint");
    opened.weights = std::make_unique<PretrainedWeights>(opened.path, config, *opened.table);
  } catch (const CheckpointError& problem) {  // bad input: agreed below; anything else throws
    error = problem.what();
  } catch (const WeightsError& problem) {
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  return opened;
}

void load_opened_weights(const OpenedWeights& opened, Model& model) {
  if (model.table().total_numel() != opened.table->total_numel())
    throw std::logic_error(
        "load_opened_weights: the model is not of the config they were opened for");
  model.load_weights(
      [&](int64_t begin, int64_t count, float* out) { opened.weights->read(begin, count, out); });
}

}  // namespace ulysses
