#include "core/checkpoint/weights_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <memory>
#include <stdexcept>

#include "core/checkpoint/checkpoint_format.h"
#include "parallel/agreement.h"

namespace ulysses {

namespace {

constexpr int kResolveTries = 3;

bool on_any_rank(Comm& world, bool mine) {
  for (const std::string& theirs : all_gather_strings(world, mine ? "1" : ""))
    if (!theirs.empty()) return true;
  return false;
}

}  // namespace

OpenedWeights open_agreed_weights(Comm& world, const std::string& path,
                                  const std::function<std::string(const std::string&)>& resolve,
                                  const ModelConfig& config) {
  for (int attempt = 1;; ++attempt) {
    OpenedWeights opened;
    opened.table = std::make_unique<ParamTable>(config);
    std::string error;
    if (world.rank() == 0) {
      try {
        opened.path = resolve(path);
      } catch (const CheckpointError& problem) {  // bad input: agreed below
        error = problem.what();
      } catch (const WeightsError& problem) {
        error = problem.what();
      }
    }
    agree_on_failure(world, error, ExitCode::bad_input);
    broadcast_string(world, opened.path, 0);
    bool pruned = false;
    try {
      opened.weights = std::make_unique<PretrainedWeights>(opened.path, config, *opened.table);
    } catch (const CheckpointError& problem) {
      error = problem.what();
    } catch (const WeightsError& problem) {
      error = problem.what();
    }
    if (!error.empty() && opened.path != path) {
      std::error_code ignored;
      pruned = !std::filesystem::exists(opened.path, ignored);
    }
    if (on_any_rank(world, pruned) && attempt < kResolveTries) {
      if (world.rank() == 0)
        spdlog::warn(
            "{} was removed while it was opened (pruned by the run saving into {}?): "
            "choosing again",
            opened.path, path);
      continue;
    }
    agree_on_failure(world, error, ExitCode::bad_input);
    return opened;
  }
}

OpenedWeights open_weight_source(const WeightSource& source, const Config& config, Comm& world) {
  if (!source.init_from.empty())
    return open_agreed_weights(world, source.init_from, resolve_weights_path, config.model);
  const bool given = !source.checkpoint.empty();
  const std::string& folder = given ? source.checkpoint : config.train.checkpoint.dir;
  agree_on_failure(world,
                   folder.empty() ? "give the weights: --checkpoint DIR or --init-from PATH, or a "
                                    "config whose train.checkpoint.dir holds the run's checkpoints"
                                  : "",
                   ExitCode::bad_input);
  const std::string option = given ? "--checkpoint" : "train.checkpoint.dir";
  return open_agreed_weights(
      world, folder, [&](const std::string& path) { return require_checkpoint_in(path, option); },
      config.model);
}

void load_opened_weights(const OpenedWeights& opened, Model& model) {
  if (model.table().total_numel() != opened.table->total_numel())
    throw std::logic_error(
        "load_opened_weights: the model is not of the config they were opened for");
  model.load_weights(
      [&](int64_t begin, int64_t count, float* out) { opened.weights->read(begin, count, out); });
}

}  // namespace ulysses
