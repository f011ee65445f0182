// Where `ulysses-train eval` and `sample` take a model's weights from: a ulysses checkpoint
// (a step folder, or a checkpoint dir whose newest intact checkpoint is used), or any path
// model.init_from accepts (a Hugging Face Llama folder, an llm.c GPT-2 file, a checkpoint);
// docs/evaluation.md.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/checkpoint/weights_io.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/comm.h"

namespace ulysses {

// At most one is set; neither: the newest checkpoint of the config's train.checkpoint.dir.
struct WeightSource {
  std::string checkpoint;  // --checkpoint
  std::string init_from;   // --init-from
};

// Weights found and checked against the model's table, not read yet.
struct OpenedWeights {
  std::string path;  // for a checkpoint dir, its newest intact step folder
  std::unique_ptr<ParamTable> table;
  std::unique_ptr<PretrainedWeights> weights;
};

// Collective: the weights at resolve(path) as rank 0 resolves it (a checkpoint dir to its
// newest intact step folder), opened on every rank and checked against config. Resolved once,
// so that ranks cannot read different steps of a run that saves into that dir meanwhile
// (docs/evaluation.md); a step folder the run prunes before every rank has opened it is
// resolved again, up to 3 times. Files are memory-mapped when opened, so a prune after that
// changes nothing read. A path that holds no usable weights, or weights of another shape than
// config, is JobError(bad_input) on every rank, with rank 0's message.
OpenedWeights open_agreed_weights(Comm& world, const std::string& path,
                                  const std::function<std::string(const std::string&)>& resolve,
                                  const ModelConfig& config);

// Collective: open_agreed_weights of --checkpoint (a ulysses checkpoint, or a checkpoint dir),
// of --init-from (any path model.init_from takes), or without either of config's
// train.checkpoint.dir (JobError(bad_input) when that is empty too), before a model is built
// (or its memory checked).
OpenedWeights open_weight_source(const WeightSource& source, const Config& config, Comm& world);

// Collective: each rank reads the ranges of the weights it stores into model, built from the
// same config.
void load_opened_weights(const OpenedWeights& opened, Model& model);

}  // namespace ulysses
