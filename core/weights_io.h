// Weights in and out of other formats: Hugging Face Llama folders (config.json +
// safetensors, possibly sharded), llm.c GPT-2 checkpoints (.bin), and a ulysses
// checkpoint's own model.safetensors.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/params.h"

namespace ulysses {

// A weight file (model.init_from, export input) that cannot be used: names the file and the
// problem.
class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads pretrained weights for model.init_from into host_params (laid out by table):
// a Hugging Face Llama folder, an llm.c GPT-2 .bin file or a ulysses checkpoint folder.
// The shapes must match the configured model; errors (WeightsError) name the file and the
// mismatch.
void load_pretrained_weights(const std::string& path, const ModelConfig& model,
                             const ParamTable& table, std::vector<float>& host_params);

}  // namespace ulysses
