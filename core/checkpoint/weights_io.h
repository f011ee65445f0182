// Weights in and out of other formats: Hugging Face Llama folders (config.json +
// safetensors, possibly sharded), llm.c GPT-2 checkpoints (.bin), and a ulysses
// checkpoint's own model.safetensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_weights.h"
#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/model/params.h"

namespace ulysses {

// A weight file (model.init_from, export input) that cannot be used: names the file and the
// problem.
class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What model.init_from = path reads: a checkpoint dir (a folder without manifest.json or
// config.json) is its newest intact step folder, when it has one; any other path is itself.
std::string resolve_weights_path(const std::string& path);

// Pretrained weights for model.init_from: a Hugging Face Llama folder, an llm.c GPT-2 .bin
// file or a ulysses checkpoint folder. Opening checks every tensor against the configured
// model (shapes, names, the format's config) without reading the values; read() then reads
// only the ranges asked for, from the memory-mapped safetensors files or by offset from the
// llm.c file, so each rank reads only what it stores (docs/memory.md, "Host memory per
// rank"). Errors (WeightsError) name the file and the mismatch.
class PretrainedWeights {
 public:
  // Where each tensor of the table is read from; filled by opening.
  struct Files {
    struct Tensor {
      std::string file;          // the file's path
      std::string name;          // the tensor's name in a safetensors file
      int64_t file_offset = -1;  // llm.c: where its f32 values start; -1 for safetensors
    };
    std::unique_ptr<CheckpointWeights> checkpoint;         // a ulysses checkpoint: all from it
    std::map<std::string, SafetensorsReader> safetensors;  // Hugging Face files, by path
    std::string llmc_path;                                 // or "" when none
    std::vector<Tensor> tensors;  // the others: by the table's tensor index
  };

  PretrainedWeights(const std::string& path, const ModelConfig& model, const ParamTable& table);
  ~PretrainedWeights();
  PretrainedWeights(const PretrainedWeights&) = delete;
  PretrainedWeights& operator=(const PretrainedWeights&) = delete;

  // Fills out[0, count) with flat elements [begin, begin + count) of the table's buffer.
  void read(int64_t begin, int64_t count, float* out) const;

 private:
  const ParamTable* table_;
  Files files_;
  int llmc_fd_ = -1;
};

}  // namespace ulysses
