#include "core/checkpoint/weights_io.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_weights.h"
#include "core/checkpoint/file_util.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/weights_io_formats.h"
#include "data/input_file.h"

namespace ulysses {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kHfConfigFile = "config.json";
const char* kHfIndexFile = "model.safetensors.index.json";
const char* kWeightsFile = "model.safetensors";  // Hugging Face's name for one-file models

// What transformers' LlamaConfig assumes when config.json leaves these keys out.
constexpr double kHfDefaultRopeTheta = 10000.0;
constexpr double kHfDefaultRmsNormEps = 1e-6;

[[noreturn]] void fail(const std::string& message) {
  throw WeightsError(message);
}

std::string in_quotes(const std::string& path) {
  return "'" + path + "'";
}

std::string show_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// Configs written from float32 values (9.999999747e-06 for 1e-5) still count as equal.
bool same_number(double a, double b) {
  return std::abs(a - b) <= 1e-6 * std::max(std::abs(a), std::abs(b));
}

json read_json_object(const std::string& path) {
  const std::string text = read_whole_file(path);
  json value = json::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_object())
    fail(in_quotes(path) + " is not a JSON object (malformed or not the expected file)");
  return value;
}

int64_t json_int(const json& object, const std::string& key, const std::string& path) {
  if (!object.contains(key)) fail(in_quotes(path) + " has no \"" + key + "\"");
  if (!object[key].is_number_integer())
    fail(in_quotes(path) + ": \"" + key + "\" is " + object[key].dump() + ", not an integer");
  return object[key].get<int64_t>();
}

// A positive number under key, or nullopt when the key is absent or null.
std::optional<double> json_positive_number(const json& object, const std::string& key,
                                           const std::string& path) {
  if (!object.contains(key) || object[key].is_null()) return std::nullopt;
  if (!object[key].is_number() || !(object[key].get<double>() > 0.0))
    fail(in_quotes(path) + ": \"" + key + "\" is " + object[key].dump() +
         ", not a positive number");
  return object[key].get<double>();
}

void require_same(const std::string& path, const std::string& file_key, int64_t file_value,
                  const std::string& config_key, int64_t config_value) {
  if (file_value != config_value)
    fail(in_quotes(path) + ": " + file_key + " is " + std::to_string(file_value) + " but " +
         config_key + " is " + std::to_string(config_value));
}

// A different epsilon is never what a fine-tune wants: refuse it.
void require_same_norm_eps(const std::string& where, const std::string& file_key, double file_value,
                           double configured) {
  if (!same_number(file_value, configured))
    fail(where + ": " + file_key + " is " + show_number(file_value) + " but model.norm_eps is " +
         show_number(configured) + "; set model.norm_eps=" + show_number(file_value));
}

// Raising the RoPE base is the usual way to extend a pretrained model's context, so a
// different rope_theta is allowed, but said.
void note_rope_theta(const std::string& where, const std::string& file_key, double file_value,
                     double configured) {
  if (!same_number(file_value, configured))
    spdlog::warn("{}: {} is {} but model.rope_theta is {}; training uses {}", where, file_key,
                 show_number(file_value), show_number(configured), show_number(configured));
}

// Checks a Hugging Face config.json against the configured model; returns whether the
// LM head is tied to the embedding.
bool check_hf_config(const std::string& config_path, const ModelConfig& model) {
  const json config = read_json_object(config_path);

  require_same(config_path, "hidden_size", json_int(config, "hidden_size", config_path),
               "model.d_model", model.d_model);
  require_same(config_path, "intermediate_size", json_int(config, "intermediate_size", config_path),
               "model.d_ff", model.d_ff);
  require_same(config_path, "num_hidden_layers", json_int(config, "num_hidden_layers", config_path),
               "model.n_layers", model.n_layers);
  const int64_t heads = json_int(config, "num_attention_heads", config_path);
  require_same(config_path, "num_attention_heads", heads, "model.n_heads", model.n_heads);
  const int64_t kv_heads = config.contains("num_key_value_heads")
                               ? json_int(config, "num_key_value_heads", config_path)
                               : heads;
  require_same(config_path, "num_key_value_heads", kv_heads, "model.n_kv_heads", model.n_kv_heads);
  require_same(config_path, "vocab_size", json_int(config, "vocab_size", config_path),
               "model.vocab_size", model.vocab_size);
  if (config.contains("head_dim") && !config["head_dim"].is_null())
    require_same(config_path, "head_dim", json_int(config, "head_dim", config_path),
                 "model.d_model / model.n_heads", model.head_dim());

  // Features of some Llama variants that ulysses' llama does not compute.
  if (config.value("hidden_act", json("silu")) != "silu")
    fail(in_quotes(config_path) + ": hidden_act is " + config["hidden_act"].dump() +
         "; ulysses' llama uses silu (SwiGLU)");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (config.value(bias, json(false)) != false)
      fail(in_quotes(config_path) + ": " + bias + " is " + config[bias].dump() +
           "; ulysses' llama has no biases");
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null())
    fail(in_quotes(config_path) + ": rope_scaling " + config["rope_scaling"].dump() +
         " is not supported; ulysses' llama uses plain RoPE (remove the key to load the weights "
         "anyway)");

  require_same_norm_eps(
      in_quotes(config_path), "rms_norm_eps",
      json_positive_number(config, "rms_norm_eps", config_path).value_or(kHfDefaultRmsNormEps),
      model.norm_eps);
  note_rope_theta(
      in_quotes(config_path), "rope_theta",
      json_positive_number(config, "rope_theta", config_path).value_or(kHfDefaultRopeTheta),
      model.rope_theta);
  if (config.contains("max_position_embeddings") &&
      json_int(config, "max_position_embeddings", config_path) < model.max_seq_len)
    spdlog::info("{}: max_position_embeddings is {}; model.max_seq_len is {}", config_path,
                 config["max_position_embeddings"].get<int64_t>(), model.max_seq_len);
  const json tie = config.value("tie_word_embeddings", json(false));
  if (!tie.is_boolean())
    fail(in_quotes(config_path) + ": tie_word_embeddings is " + tie.dump() + ", not true or false");
  return tie.get<bool>();
}

void open_hf_llama(const std::string& folder, const ModelConfig& model, const ParamTable& table,
                   PretrainedWeights::Files& files) {
  if (model.family != Family::llama)
    fail(in_quotes(folder) + " is a Hugging Face Llama model, but model.family is " +
         name_of(model.family));
  const bool tied = check_hf_config(folder + "/" + kHfConfigFile, model);

  // Either one model.safetensors or shards named by the index's weight_map.
  const std::string index_path = folder + "/" + kHfIndexFile;
  const bool sharded = fs::exists(index_path);
  std::map<std::string, std::string> shard_of;  // tensor name -> shard file name
  if (sharded) {
    const json index = read_json_object(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(in_quotes(index_path) + " has no \"weight_map\" object");
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      // The index is untrusted: it may only name files inside the folder.
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos || file == "." || file == "..")
        fail(in_quotes(index_path) + " maps '" + tensor + "' to " + file.dump() +
             ", which is not a file name in the folder");
      shard_of[tensor] = file.get<std::string>();
    }
  } else if (!fs::exists(folder + "/" + kWeightsFile)) {
    fail(in_quotes(folder) + " has config.json but neither " + kWeightsFile + " nor " +
         kHfIndexFile);
  }

  std::map<std::string, SafetensorsReader>& readers = files.safetensors;  // opened on first use
  auto reader_of = [&](const std::string& tensor) -> const SafetensorsReader& {
    std::string file = kWeightsFile;
    if (sharded) {
      auto found = shard_of.find(tensor);
      if (found == shard_of.end())
        fail("tensor '" + tensor + "' is missing: " + in_quotes(index_path) +
             " does not list it in its weight_map");
      file = found->second;
    }
    auto open = readers.find(folder + "/" + file);
    if (open == readers.end()) {
      const std::string path = folder + "/" + file;
      if (!fs::exists(path))
        fail("shard " + in_quotes(path) + ", listed in " + in_quotes(index_path) + " for '" +
             tensor + "', is missing");
      open = readers.emplace(path, SafetensorsReader(path)).first;
    }
    return open->second;
  };

  const std::string& embedding_name = table.find(ParamRole::token_embedding).name;
  std::set<std::string> used;
  for (const ParamSpec& spec : table.specs()) {
    // Tied checkpoints store no head: it is the embedding (as transformers ties them).
    const std::string& source =
        tied && spec.role == ParamRole::lm_head ? embedding_name : spec.name;
    const SafetensorsReader& reader = reader_of(source);
    if (!reader.contains(source))
      fail(
          "tensor '" + source + "' is missing from " + in_quotes(reader.path()) +
          (spec.role == ParamRole::lm_head ? " (config.json says tie_word_embeddings false)" : ""));
    reader.require_shape(source, spec.shape);
    files.tensors.push_back({reader.path(), source, -1});
    used.insert(source);
  }

  std::vector<std::string> unused;
  for (const auto& [file, reader] : readers)
    for (const SafetensorsEntry& entry : reader.entries())
      if (!used.count(entry.name)) unused.push_back(entry.name);
  if (!unused.empty())
    spdlog::warn("{}: {} tensor(s) not used by the model, e.g. '{}'", folder, unused.size(),
                 unused.front());
}

void open_llmc(const std::string& path, const ModelConfig& model, const ParamTable& table,
               PretrainedWeights::Files& files) {
  const InputFile file(path);
  if (!file.is_open()) fail("model.init_from " + file.problem());
  const uint64_t file_bytes = uint64_t(file.size());
  if (file_bytes < uint64_t(kLlmcHeaderBytes))
    fail(in_quotes(path) + " is truncated: " + std::to_string(file_bytes) +
         " bytes, less than the 1024-byte header of an llm.c GPT-2 checkpoint");
  int32_t header[kLlmcHeaderInts];
  if (::pread(file.fd(), header, kLlmcHeaderBytes, 0) != ssize_t(kLlmcHeaderBytes))
    fail("cannot read the header of " + in_quotes(path));
  if (header[0] != kLlmcMagic)
    fail(in_quotes(path) + " is not an llm.c GPT-2 checkpoint: magic " + std::to_string(header[0]) +
         ", expected " + std::to_string(kLlmcMagic) +
         " (model.init_from takes a Hugging Face Llama folder, an llm.c GPT-2 .bin file or a "
         "ulysses checkpoint folder)");
  if (header[1] != kLlmcVersionF32)
    fail(in_quotes(path) + ": llm.c checkpoint version " + std::to_string(header[1]) +
         " is not supported; only version 3 (fp32) is (version 5 is llm.c's bf16 format)");
  if (model.family != Family::gpt2)
    fail(in_quotes(path) + " is an llm.c GPT-2 checkpoint, but model.family is " +
         name_of(model.family));

  const int64_t vocab = header[3], padded_vocab = header[7];
  require_same(path, "header maxT", header[2], "model.max_seq_len", model.max_seq_len);
  require_same(path, "header V", vocab, "model.vocab_size", model.vocab_size);
  require_same(path, "header L", header[4], "model.n_layers", model.n_layers);
  require_same(path, "header NH", header[5], "model.n_heads", model.n_heads);
  require_same(path, "header C", header[6], "model.d_model", model.d_model);
  if (padded_vocab < vocab)
    fail(in_quotes(path) + ": header Vp " + std::to_string(padded_vocab) + " is below V " +
         std::to_string(vocab));
  if (model.d_ff != 4 * model.d_model)
    fail(in_quotes(path) + ": llm.c's GPT-2 MLP is 4·C = " + std::to_string(4 * model.d_model) +
         " wide but model.d_ff is " + std::to_string(model.d_ff));
  if (!same_number(model.norm_eps, kLlmcNormEps))
    spdlog::warn("{}: llm.c's GPT-2 uses LayerNorm eps 1e-5; model.norm_eps is {}", path,
                 show_number(model.norm_eps));

  const int64_t padding_bytes = (padded_vocab - vocab) * model.d_model * int64_t(sizeof(float));
  const uint64_t expected_bytes = uint64_t(kLlmcHeaderBytes) + uint64_t(padding_bytes) +
                                  uint64_t(table.total_numel()) * sizeof(float);
  if (file_bytes < expected_bytes)
    fail(in_quotes(path) + " is truncated: " + std::to_string(file_bytes) +
         " bytes, but the GPT-2 its header describes needs " + std::to_string(expected_bytes));
  if (file_bytes > expected_bytes)
    fail(in_quotes(path) + " has " + std::to_string(file_bytes - expected_bytes) +
         " bytes after the last parameter its header describes");

  // Where each tensor starts in the file; rows [V, Vp) of wte are llm.c's padding, never read.
  std::vector<int64_t> start(table.specs().size());
  int64_t offset = kLlmcHeaderBytes;
  for (const ParamSpec* spec : llmc_order(table)) {
    start[size_t(spec - table.specs().data())] = offset;
    offset += spec->numel * int64_t(sizeof(float));
    if (spec->role == ParamRole::token_embedding) offset += padding_bytes;
  }
  files.llmc_path = path;
  for (const ParamSpec& spec : table.specs())
    files.tensors.push_back({path, spec.name, start[size_t(&spec - table.specs().data())]});
}

void open_ulysses_checkpoint(const std::string& folder, const ModelConfig& model,
                             const ParamTable& table, PretrainedWeights::Files& files) {
  verify_checkpoint(folder);
  const CheckpointModel recorded = read_checkpoint_model(folder);
  const ModelConfig& m = recorded.model;
  const std::string state_path = folder + "/" + kCheckpointStateFile;
  if (m.family != model.family)
    fail(in_quotes(state_path) + ": family is " + name_of(m.family) + " but model.family is " +
         name_of(model.family));
  require_same(state_path, "n_layers", m.n_layers, "model.n_layers", model.n_layers);
  require_same(state_path, "d_model", m.d_model, "model.d_model", model.d_model);
  require_same(state_path, "n_heads", m.n_heads, "model.n_heads", model.n_heads);
  require_same(state_path, "n_kv_heads", m.n_kv_heads, "model.n_kv_heads", model.n_kv_heads);
  require_same(state_path, "d_ff", m.d_ff, "model.d_ff", model.d_ff);
  require_same(state_path, "vocab_size", m.vocab_size, "model.vocab_size", model.vocab_size);
  // Learned positions are the only tensor sized by max_seq_len; a llama may be fine-tuned
  // for a longer context than it was trained with.
  if (architecture(model.family).positions == PositionKind::learned)
    require_same(state_path, "max_seq_len", m.max_seq_len, "model.max_seq_len", model.max_seq_len);
  if (recorded.norm_eps)
    require_same_norm_eps("checkpoint " + in_quotes(folder), "norm_eps", *recorded.norm_eps,
                          model.norm_eps);
  if (recorded.rope_theta)
    note_rope_theta("checkpoint " + in_quotes(folder), "rope_theta", *recorded.rope_theta,
                    model.rope_theta);
  files.checkpoint = std::make_unique<CheckpointWeights>(folder, table);
}

double parse_positive_number(const std::string& text, const std::string& where) {
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(value > 0.0))
    fail(where + " is '" + text + "', not a positive number");
  return value;
}

}  // namespace

std::vector<const ParamSpec*> llmc_order(const ParamTable& table) {
  using R = ParamRole;
  // llm.c's ParameterTensors in file order; each role spans all layers.
  constexpr R kRoles[] = {
      R::token_embedding, R::position_embedding, R::attn_norm_weight,  R::attn_norm_bias,
      R::qkv_weight,      R::qkv_bias,           R::o_weight,          R::o_bias,
      R::mlp_norm_weight, R::mlp_norm_bias,      R::up_weight,         R::up_bias,
      R::down_weight,     R::down_bias,          R::final_norm_weight, R::final_norm_bias};
  std::vector<const ParamSpec*> order;
  for (R role : kRoles)
    for (const ParamSpec& spec : table.specs())  // the table lists a role's layers in order
      if (spec.role == role) order.push_back(&spec);
  if (order.size() != table.specs().size())
    throw std::logic_error("the parameter table holds tensors an llm.c GPT-2 checkpoint lacks");
  return order;
}

CheckpointModel read_checkpoint_model(const std::string& folder) {
  CheckpointModel result = read_recorded_model(folder);
  if (!result.rope_theta || !result.norm_eps) {
    const SafetensorsReader weights(folder + "/" + kCheckpointModelFile);
    const auto& metadata = weights.metadata();
    auto from_metadata = [&](std::optional<double>& value, const char* key) {
      auto found = metadata.find(key);
      if (!value && found != metadata.end())
        value = parse_positive_number(
            found->second, in_quotes(weights.path()) + ": metadata \"" + std::string(key) + "\"");
    };
    from_metadata(result.rope_theta, "rope_theta");
    from_metadata(result.norm_eps, "norm_eps");
  }
  if (result.rope_theta) result.model.rope_theta = *result.rope_theta;
  if (result.norm_eps) result.model.norm_eps = *result.norm_eps;
  return result;
}

namespace {

void open_weights(const std::string& given, const ModelConfig& model, const ParamTable& table,
                  PretrainedWeights::Files& files) {
  const std::string path = resolve_weights_path(given);
  std::error_code error;
  if (fs::is_directory(path, error)) {
    if (fs::exists(path + "/" + kCheckpointManifestFile, error))
      return open_ulysses_checkpoint(path, model, table, files);
    if (fs::exists(path + "/" + kHfConfigFile, error))
      return open_hf_llama(path, model, table, files);
    fail("model.init_from " + in_quotes(path) + " is a folder with neither " +
         kCheckpointManifestFile + " (a ulysses checkpoint), " + kHfConfigFile +
         " (a Hugging Face Llama model) nor an intact checkpoint step folder");
  }
  // A .safetensors or .json file of a folder the option takes (its model.safetensors,
  // config.json, manifest.json): name the folder rather than fail on the file as an llm.c
  // checkpoint.
  const fs::path file(path);
  const fs::path folder = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const std::pair<const char*, const char*> folder_kinds[] = {
      {kCheckpointManifestFile, "ulysses checkpoint"}, {kHfConfigFile, "Hugging Face Llama model"}};
  if (file.extension() == ".safetensors" || file.extension() == ".json")
    for (const auto& [marker, kind] : folder_kinds)
      if (fs::is_regular_file(folder / marker, error))
        fail("model.init_from " + in_quotes(path) + " is a file of the " + kind + " " +
             in_quotes(folder.string()) + ": give the folder");
  open_llmc(path, model, table, files);
}

// Errors of the files' readers name the file: they become WeightsError.
template <typename Action>
void as_weights_error(Action action) {
  try {
    action();
  } catch (const WeightsError&) {
    throw;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::runtime_error& error) {
    throw WeightsError(error.what());
  }
}

}  // namespace

std::string resolve_weights_path(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error) || fs::exists(path + "/" + kCheckpointManifestFile, error) ||
      fs::exists(path + "/" + kHfConfigFile, error))
    return path;
  const std::string latest = find_latest_checkpoint(path);
  return latest.empty() ? path : latest;
}

PretrainedWeights::PretrainedWeights(const std::string& path, const ModelConfig& model,
                                     const ParamTable& table)
    : table_(&table) {
  as_weights_error([&] { open_weights(path, model, table, files_); });
  if (!files_.llmc_path.empty()) {
    InputFile file(files_.llmc_path);
    if (!file.is_open()) fail("model.init_from " + file.problem());
    llmc_fd_ = file.release();
  }
}

PretrainedWeights::~PretrainedWeights() {
  if (llmc_fd_ >= 0) ::close(llmc_fd_);
}

void PretrainedWeights::read(int64_t begin, int64_t count, float* out) const {
  as_weights_error([&] {
    if (files_.checkpoint) return files_.checkpoint->read(begin, count, out);
    for_each_tensor_piece(
        *table_, begin, count, [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
          const Files::Tensor& tensor = files_.tensors[size_t(&spec - table_->specs().data())];
          if (tensor.file_offset < 0) {
            files_.safetensors.at(tensor.file).read_f32_range(tensor.name, first, n, out + done);
            return;
          }
          const size_t bytes = size_t(n) * sizeof(float);
          const off_t at = off_t(tensor.file_offset + first * int64_t(sizeof(float)));
          if (::pread(llmc_fd_, out + done, bytes, at) != ssize_t(bytes))
            fail("reading " + in_quotes(tensor.file) +
                 " failed (the file changed while it was read?)");
        });
  });
}

}  // namespace ulysses
