// Where `ulysses-train eval` and `sample` take a model's weights from: a ulysses checkpoint
// (a step folder, or a checkpoint dir whose newest intact checkpoint is used), or any path
// model.init_from accepts (a Hugging Face Llama folder, an llm.c GPT-2 file, a checkpoint);
// docs/evaluation.md.
#pragma once

#include <memory>
#include <string>

#include "core/checkpoint/weights_io.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/comm.h"

namespace ulysses {

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

// Collective: every rank opens the weights and checks every tensor's name and shape against
// config, before a model is built (or its memory checked). A path that holds no usable weights,
// or weights of another shape than config, is JobError(bad_input) on every rank, with rank 0's
// message.
OpenedWeights open_weight_source(const WeightSource& source, const ModelConfig& config,
                                 Comm& world);

// Collective: each rank reads the ranges of the weights it stores into model, built from the
// same config.
void load_opened_weights(const OpenedWeights& opened, Model& model);

}  // namespace ulysses
