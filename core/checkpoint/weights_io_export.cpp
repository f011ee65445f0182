// Writers of the export formats (the readers are in weights_io.cpp).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/checkpoint/file_util.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/weights_io.h"
#include "core/checkpoint/weights_io_formats.h"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw WeightsError(message);
}

std::string in_quotes(const std::string& path) {
  return "'" + path + "'";
}

std::string parent_folder(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Closes the file on every path; removes it unless the write completed, so a failed export (a
// full disk) leaves no partial file taking the space.
struct TempFileGuard {
  FILE* file = nullptr;
  std::string path;
  bool keep = false;
  ~TempFileGuard() {
    if (file) std::fclose(file);
    if (!keep) std::remove(path.c_str());
  }
};

}  // namespace

void write_hf_llama(const std::string& folder, const ModelConfig& model, const ParamTable& table,
                    const std::vector<float>& params) {
  if (model.family != Family::llama)
    fail("a Hugging Face Llama export needs a llama checkpoint; this one is model.family " +
         name_of(model.family) + " (export it with --format llmc)");
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) fail("cannot create the folder " + in_quotes(folder) + ": " + error.message());
  const std::string index_path = folder + "/model.safetensors.index.json";
  if (fs::exists(index_path))
    fail(in_quotes(folder) + " holds " + in_quotes(index_path) +
         ", which loaders would read instead of the exported model.safetensors; export into a "
         "folder without it");

  SafetensorsWriter weights;
  for (const ParamSpec& spec : table.specs())
    weights.add(spec.name, spec.shape, params.data() + spec.offset);
  weights.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  const std::string weights_path = folder + "/model.safetensors";
  TempFileGuard weights_temp{nullptr, weights_path + ".tmp"};
  weights.write(weights_temp.path);
  rename_or_throw(weights_temp.path, weights_path);
  weights_temp.keep = true;

  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"model_type", "llama"},
                                 {"hidden_size", model.d_model},
                                 {"intermediate_size", model.d_ff},
                                 {"num_hidden_layers", model.n_layers},
                                 {"num_attention_heads", model.n_heads},
                                 {"num_key_value_heads", model.n_kv_heads},
                                 {"hidden_act", "silu"},
                                 {"attention_bias", false},
                                 {"mlp_bias", false},
                                 {"rms_norm_eps", model.norm_eps},
                                 {"rope_theta", model.rope_theta},
                                 {"vocab_size", model.vocab_size},
                                 {"max_position_embeddings", model.max_seq_len},
                                 {"tie_word_embeddings", false},
                                 {"torch_dtype", "float32"}};
  // Written last: a folder with config.json is taken for a complete model.
  const std::string config_path = folder + "/config.json";
  replace_file_durably(config_path, config.dump(2) + "\n");
  fsync_directory(folder);
}

void write_llmc(const std::string& path, const ModelConfig& model, const ParamTable& table,
                const std::vector<float>& params) {
  if (model.family != Family::gpt2)
    fail("an llm.c export needs a gpt2 checkpoint; this one is model.family " +
         name_of(model.family) + " (export it with --format hf-llama)");
  if (model.d_ff != 4 * model.d_model)
    fail("llm.c's GPT-2 MLP is 4·d_model = " + std::to_string(4 * model.d_model) +
         " wide; this model has d_ff " + std::to_string(model.d_ff));
  if (std::abs(model.norm_eps - kLlmcNormEps) > 1e-6 * kLlmcNormEps)
    spdlog::warn("llm.c's GPT-2 uses LayerNorm eps 1e-5; this model was trained with {}",
                 model.norm_eps);
  const int64_t vocab = model.vocab_size;
  const int64_t padded_vocab =
      (vocab + kLlmcVocabPadding - 1) / kLlmcVocabPadding * kLlmcVocabPadding;
  if (padded_vocab > std::numeric_limits<int32_t>::max())
    fail("vocab_size " + std::to_string(vocab) + " does not fit an llm.c header");

  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionF32;
  header[2] = model.max_seq_len;
  header[3] = model.vocab_size;
  header[4] = model.n_layers;
  header[5] = model.n_heads;
  header[6] = model.d_model;
  header[7] = int32_t(padded_vocab);

  create_parent_folders(path);
  TempFileGuard temp{nullptr, path + ".tmp"};
  temp.file = std::fopen(temp.path.c_str(), "wb");
  if (!temp.file) fail("cannot create " + in_quotes(temp.path) + ": " + std::strerror(errno));
  auto put = [&](const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, temp.file) != bytes)
      fail("cannot write " + in_quotes(temp.path) + ": " + std::strerror(errno));
  };
  put(header, sizeof header);
  const std::vector<float> zero_row(size_t(model.d_model), 0.0f);
  for (const ParamSpec* spec : llmc_order(table)) {
    put(params.data() + spec->offset, size_t(spec->numel) * sizeof(float));
    if (spec->role == ParamRole::token_embedding)
      for (int64_t row = vocab; row < padded_vocab; ++row)
        put(zero_row.data(), zero_row.size() * sizeof(float));
  }
  if (std::fflush(temp.file) != 0 || ::fsync(fileno(temp.file)) != 0)
    fail("cannot write " + in_quotes(temp.path) + ": " + std::strerror(errno));
  const int closed = std::fclose(temp.file);
  temp.file = nullptr;
  if (closed != 0) fail("cannot write " + in_quotes(temp.path) + ": " + std::strerror(errno));
  rename_or_throw(temp.path, path);
  temp.keep = true;
  fsync_directory(parent_folder(path));
}

}  // namespace ulysses
