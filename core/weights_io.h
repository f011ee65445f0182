// Weights in and out of other formats: Hugging Face Llama folders (config.json +
// safetensors, possibly sharded), llm.c GPT-2 checkpoints (.bin), and a ulysses
// checkpoint's own model.safetensors.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/params.h"

namespace ulysses {

// Reads pretrained weights for model.init_from into host_params (laid out by table):
// a Hugging Face Llama folder, an llm.c GPT-2 .bin file or a ulysses checkpoint folder.
// The shapes must match the configured model; errors name the file and the mismatch.
void load_pretrained_weights(const std::string& path, const ModelConfig& model,
                             const ParamTable& table, std::vector<float>& host_params);

}  // namespace ulysses
