// Where `ulysses-train eval` and `sample` take a model's weights from: a ulysses checkpoint
// (a step folder, or a checkpoint dir whose newest intact checkpoint is used), or any path
// model.init_from accepts (a Hugging Face Llama folder, an llm.c GPT-2 file, a checkpoint);
// docs/evaluation.md.
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/comm.h"

namespace ulysses {

struct WeightSource {
  std::string checkpoint;  // --checkpoint
  std::string init_from;   // --init-from
};

// Collective: every rank reads the weights and loads them into model; returns the path
// read (for a checkpoint dir, its newest intact step folder). A path that holds no usable
// weights, or weights of another shape than config.model, is JobError(bad_input) on every
// rank, with rank 0's message.
std::string load_weight_source(const WeightSource& source, const ModelConfig& config, Model& model,
                               Comm& world);

}  // namespace ulysses
