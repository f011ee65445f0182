// The details of weights_io that the export command shares with the import: the llm.c
// GPT-2 file layout, a checkpoint's recorded model, and the writers of both formats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/config/config.h"
#include "core/model/params.h"

namespace ulysses {

// llm.c GPT-2 checkpoint: 256 int32 header, then every parameter in fp32.
constexpr int32_t kLlmcMagic = 20240326;
constexpr int32_t kLlmcVersionF32 = 3;
constexpr int kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * int64_t(sizeof(int32_t));
// llm.c pads the vocabulary of wte to a multiple of this many rows.
constexpr int64_t kLlmcVocabPadding = 128;
// llm.c's LayerNorm epsilon is a constant of its code, not part of the file.
constexpr double kLlmcNormEps = 1e-5;

// Every tensor of a gpt2 table in the order llm.c stores them: one role after the other,
// each role's tensors by layer. Throws if the table has tensors llm.c does not store.
std::vector<const ParamSpec*> llmc_order(const ParamTable& table);

// The model a ulysses checkpoint folder was written for: rope_theta and norm_eps from
// trainer_state.json "model", else from model.safetensors' metadata, where recorded.
CheckpointModel read_checkpoint_model(const std::string& folder);

// Writes folder/config.json and folder/model.safetensors (F32, Hugging Face names), each
// under a temporary name first. The model must be llama.
void write_hf_llama(const std::string& folder, const ModelConfig& model, const ParamTable& table,
                    const std::vector<float>& params);

// Writes an llm.c version-3 checkpoint (wte padded with zero rows) to a temporary name and
// renames it to path. The model must be gpt2 with d_ff = 4·d_model.
void write_llmc(const std::string& path, const ModelConfig& model, const ParamTable& table,
                const std::vector<float>& params);

}  // namespace ulysses
