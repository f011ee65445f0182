// parse_config and load_config: YAML and --set overrides read against the table of keys
// (config_keys.h), each key's range, the defaults that depend on other keys and the rules
// between keys (docs/design.md, "One table of config keys").
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>
#include <variant>

#include "core/config/config.h"
#include "core/config/config_keys.h"
#include "core/config/config_reader.h"
#include "core/config/inert_keys.h"
#include "core/config/seq_len_schedule.h"
#include "data/dataset.h"
#include "data/input_file.h"
#include "data/synthetic.h"

namespace ulysses {

namespace {

using namespace config_keys;

// The reader's conversions, beside the ones below (an overload here would hide them).
using ::ulysses::convert;

// An enum key: one of its spellings, else the message names them all.
std::string convert(const YAML::Node& node, const EnumValue& out) {
  int index = 0;
  std::string problem = convert_choice(node, out.names, index);
  if (problem.empty()) out.set(index);
  return problem;
}

// memory.tiled_mlp: false, auto or a tile count of at least 1.
std::string convert(const YAML::Node& node, TiledMlp& out) {
  std::string text;
  std::string problem = convert(node, text);
  if (!problem.empty()) return problem;
  int tiles = 0;
  if (text == "false")
    out = TiledMlp{};
  else if (text == "auto")
    out = TiledMlp{TiledMlp::Mode::automatic, 0};
  else if (parse_integer(text, tiles) && tiles >= 1)
    out = TiledMlp{TiledMlp::Mode::tiles, tiles};
  else
    return "'" + text + "' is not allowed; use false, auto or a tile count >= 1";
  return "";
}

// ---- reading the tree ------------------------------------------------------------------

// Stores every given key into the config, checking its type.
void fill(const ConfigReader& reader, Config& config) {
  for (const Field& field : fields()) {
    const YAML::Node* given = reader.given(field.key);
    if (given == nullptr) continue;
    // `auto` spells the 0 of a key whose 0 is resolved (its `resolved` column).
    const bool automatic =
        !field.resolved.empty() && given->IsScalar() && given->Scalar() == "auto";
    std::string problem = std::visit(
        [&](auto ref) { return convert(automatic ? YAML::Node(0) : *given, ref(config)); },
        field.ref);
    if (!problem.empty()) reader.fail(field.key, problem);
  }
}

// ---- validation ------------------------------------------------------------------------

// The range as a message ("must be >= 1").
std::string range_rule(const Range& range) {
  std::string rule = range.zero_allowed ? "must be 0 or" : "must be";
  if (range.has_low && range.has_high && !range.low_open && !range.high_open)
    return rule + " between " + format_double(range.low) + " and " + format_double(range.high);
  if (range.has_low) rule += (range.low_open ? " > " : " >= ") + format_double(range.low);
  if (range.has_low && range.has_high) rule += " and";
  if (range.has_high) rule += (range.high_open ? " < " : " <= ") + format_double(range.high);
  return rule;
}

bool in_range(const Range& range, double value) {
  if (range.zero_allowed && value == 0.0) return true;
  if (range.has_low && !(range.low_open ? value > range.low : value >= range.low)) return false;
  if (range.has_high && !(range.high_open ? value < range.high : value <= range.high)) return false;
  return true;
}

std::string format_float(float value) {
  char text[32];
  auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

// What is wrong with a key's value once rounded to fp32 (Range::fp32), or "".
std::string fp32_problem(const Range& range, double value) {
  const std::string why = " in fp32, which training computes in";
  constexpr float kSmallest = std::numeric_limits<float>::min();  // normal: not flushed to 0
  constexpr float kLargest = std::numeric_limits<float>::max();
  if (value != 0.0 && std::abs(value) < double(kSmallest))
    return format_double(value) + " is below " + format_float(kSmallest) +
           ", the smallest normal number" + why + " (it would be 0 or lose its precision there)";
  if (std::abs(value) > double(kLargest))
    return format_double(value) + " is above " + format_float(kLargest) + ", the largest number" +
           why;
  const float rounded = float(value);
  if (in_range(range, double(rounded))) return "";
  std::string problem = format_double(value) + " is " + format_float(rounded) + why + "; " +
                        range_rule(range) + " there";
  if (range.has_high && range.high_open && double(rounded) >= range.high)
    problem += " (at most " +
               format_float(std::nextafter(float(range.high), -std::numeric_limits<float>::max())) +
               ")";
  return problem;
}

// The ranges of the key table; a choice was checked as it was read (fill).
void check_ranges(const ConfigReader& reader, const Config& c) {
  Config copy = c;  // the table's accessors take a mutable Config
  for (const Field& field : fields()) {
    if (!field.range) continue;
    std::visit(
        [&](auto ref) {
          const auto& value = ref(copy);
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
            if (!in_range(*field.range, double(value)))
              reader.fail(field.key, range_rule(*field.range) + ", got " + format_value(value));
            if (field.range->fp32) {
              const std::string problem = fp32_problem(*field.range, double(value));
              if (!problem.empty()) reader.fail(field.key, problem);
            }
          }
        },
        field.ref);
  }

  // Rules of single keys that a range does not say.
  // A spike factor of 1 or less would call ordinary steps spikes.
  if (c.train.spike_loss_factor > 0.0 && c.train.spike_loss_factor <= 1.0)
    reader.fail("train.spike_loss_factor", "must be 0 (not checked) or above 1, got " +
                                               format_double(c.train.spike_loss_factor));
}

// Defaults that depend on other keys.
void resolve_defaults(const ConfigReader& reader, Config& c) {
  ModelConfig& m = c.model;
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  if (m.d_ff == 0) {
    // In 64 bits: d_model is any int here (check_model_size judges the size later).
    const int64_t d_model = m.d_model;
    int64_t d_ff = 4 * d_model;
    if (architecture(m.family).mlp == MlpKind::swiglu) {
      const int64_t eight_thirds = (8 * d_model + 2) / 3;  // ceil(8·d / 3)
      d_ff = (eight_thirds + 31) / 32 * 32;
    }
    if (d_ff > std::numeric_limits<int>::max()) {
      reader.fail("model.d_model", std::to_string(m.d_model) +
                                       " is too large: the default model.d_ff would be " +
                                       std::to_string(d_ff) + ", above the largest int");
    }
    m.d_ff = int(d_ff);
  }
  if (m.max_seq_len == 0) m.max_seq_len = c.train.seq_len;
  if (m.vocab_size == 0) {
    if (c.data.source == DataSource::tokens) {
      reader.fail("model.vocab_size", "is required with " + key_shown(reader, c, "data.source") +
                                          ": token shards do not say their vocabulary; set "
                                          "it to the tokenizer's vocabulary size");
    }
    m.vocab_size = default_vocab_size(c.data);
  }
}

// Sizes far beyond any real model would overflow the arithmetic of the parameter table and
// the buffers long before an allocation could fail cleanly: refused with the numbers.
void check_model_size(const ConfigReader& reader, const Config& c) {
  constexpr long double kMaxActivationBytes = 1125899906842624.0L;  // 2^50: 1 PiB per rank
  const ModelConfig& m = c.model;
  if (m.n_layers > kMaxLayers) {
    reader.fail("model.n_layers", std::to_string(m.n_layers) + " is above the " +
                                      std::to_string(kMaxLayers) + " layers ulysses supports");
  }
  const long double C = m.d_model, F = m.d_ff;
  const long double params = approximate_parameter_count(m);
  if (params > kMaxParameters) {
    char text[64];
    std::snprintf(text, sizeof text, "%.3Lg", params);
    reader.fail("model.d_model", std::string("the model would have about ") + text +
                                     " parameters (" + key_shown(reader, c, "model.n_layers") +
                                     ", " + key_shown(reader, c, "model.d_ff") + ", " +
                                     key_shown(reader, c, "model.vocab_size") +
                                     "); ulysses supports at most 2^40 (1.1e12)");
  }
  const long double activation_bytes = 4.0L * c.train.batch_size * c.train.seq_len * std::max(C, F);
  if (activation_bytes > kMaxActivationBytes) {
    reader.fail("train.seq_len", "one activation of " + key_shown(reader, c, "train.batch_size") +
                                     " sequences of " + std::to_string(c.train.seq_len) +
                                     " tokens would exceed 1 PiB; lower the batch or the length");
  }
  for (const SeqLenStage& stage : parse_seq_len_schedule(c.train.seq_len_schedule)) {
    const long double batch = stage.batch_size > 0 ? stage.batch_size : c.train.batch_size;
    if (4.0L * batch * stage.seq_len * std::max(C, F) > kMaxActivationBytes)
      reader.fail("train.seq_len_schedule",
                  "one activation of the stage from step " + std::to_string(stage.first_step) +
                      ", " + std::to_string(int64_t(batch)) + " sequences of " +
                      std::to_string(stage.seq_len) +
                      " tokens, would exceed 1 PiB; lower its batch or length");
  }
}

void check_cross_keys(const ConfigReader& reader, const Config& c) {
  auto show = [&](const std::string& key) { return key_shown(reader, c, key); };
  const ModelConfig& m = c.model;

  if (c.train.min_lr > c.train.lr) {
    reader.fail("train.min_lr", format_double(c.train.min_lr) + " is above " + show("train.lr") +
                                    "; the schedule decays from lr down to min_lr");
  }
  if (m.d_model % m.n_heads != 0) {
    reader.fail("model.d_model", std::to_string(m.d_model) + " is not divisible by " +
                                     show("model.n_heads") + "; heads split d_model evenly");
  }
  if (m.n_kv_heads > m.n_heads || m.n_heads % m.n_kv_heads != 0) {
    reader.fail("model.n_kv_heads",
                std::to_string(m.n_kv_heads) + " does not divide " + show("model.n_heads") +
                    "; each kv head serves a whole group of query heads; n_kv_heads can be " +
                    join_choices(divisors_of(m.n_heads)));
  }
  if (architecture(m.family).positions == PositionKind::rope && m.head_dim() % 2 != 0) {
    reader.fail("model.d_model", "head_dim = d_model / n_heads = " + std::to_string(m.head_dim()) +
                                     " is odd (" + show("model.n_heads") +
                                     "); RoPE rotates pairs of dimensions and needs it even");
  }
  if (!architecture(m.family).grouped_query && m.n_kv_heads != m.n_heads) {
    reader.fail("model.n_kv_heads", std::to_string(m.n_kv_heads) + " differs from " +
                                        show("model.n_heads") +
                                        "; model.family gpt2 has no grouped-query attention");
  }
  std::vector<SeqLenStage> stages;
  try {
    stages = parse_seq_len_schedule(c.train.seq_len_schedule);
  } catch (const std::invalid_argument& error) {
    reader.fail("train.seq_len_schedule", error.what());
  }
  const std::string schedule_problem =
      seq_len_schedule_problem(stages, c.train.seq_len, c.train.steps);
  if (!schedule_problem.empty()) reader.fail("train.seq_len_schedule", schedule_problem);
  if (c.train.seq_len > m.max_seq_len) {
    reader.fail("train.seq_len",
                std::to_string(c.train.seq_len) + " is above " + show("model.max_seq_len"));
  }
  if (c.data.source != DataSource::synthetic && c.data.path.empty()) {
    reader.fail("data.path",
                "is required with " + show("data.source") + ": give a file, a folder or a glob");
  }
  if (c.data.source == DataSource::synthetic) {
    if (c.data.n_queries > c.data.n_pairs) {
      reader.fail("data.n_queries", std::to_string(c.data.n_queries) + " is above " +
                                        show("data.n_pairs") +
                                        "; each query asks for a different planted pair");
    }
    if (c.data.n_keys < c.data.n_pairs) {
      reader.fail("data.n_keys", std::to_string(c.data.n_keys) + " is below " +
                                     show("data.n_pairs") + "; planted keys are distinct");
    }
    // With packed documents every sequence holds documents_per_sequence whole tasks.
    const bool packed = c.data.documents == DataDocuments::eos;
    const int64_t needed =
        synthetic_min_seq_len(c.data) * (packed ? c.data.documents_per_sequence : 1);
    const std::string task =
        packed ? std::to_string(c.data.documents_per_sequence) +
                     " synthetic documents (data.documents_per_sequence) of BOS + 3 tokens for "
                     "each of " +
                     show("data.n_pairs") + " and " + show("data.n_queries")
               : "the synthetic task: BOS + 3 tokens for each of " + show("data.n_pairs") +
                     " and " + show("data.n_queries");
    if (!stages.empty() && stages.front().seq_len < needed) {
      reader.fail("train.seq_len_schedule",
                  "the first stage's length " + std::to_string(stages.front().seq_len) +
                      " is too short for " + task + ", which need " + std::to_string(needed));
    }
    if (c.train.seq_len < needed) {
      reader.fail("train.seq_len", std::to_string(c.train.seq_len) + " is too short for " + task +
                                       ", which need " + std::to_string(needed));
    }
  }
  int needed_vocab = default_vocab_size(c.data);
  if (m.vocab_size < needed_vocab) {
    reader.fail("model.vocab_size", std::to_string(m.vocab_size) + " is below the " +
                                        std::to_string(needed_vocab) + " tokens data.source " +
                                        name_of(c.data.source) + " needs");
  }
  if (c.parallel.device_comm == DeviceComm::nccl && c.device != Device::cuda) {
    reader.fail("parallel.device_comm", "nccl needs device: cuda, but " + show("device"));
  }
  if (c.parallel.device_comm == DeviceComm::nccl && c.parallel.ring > 1) {
    reader.fail("parallel.device_comm",
                "nccl has no point to point here, which parallel.ring > 1 needs; use "
                "parallel.device_comm: mpi or auto (docs/parallelism.md, \"Ulysses × ring\")");
  }
  if (c.kernels.attention == AttentionKernel::cudnn && c.device != Device::cuda) {
    reader.fail("kernels.attention", "cudnn needs device: cuda, but " + show("device"));
  }
  if (c.kernels.attention == AttentionKernel::cudnn && m.n_heads > 0) {
    const int head_dim = m.d_model / m.n_heads;
    if (head_dim % 8 != 0 || head_dim > 128)
      reader.fail("kernels.attention",
                  "cudnn needs a head dim (model.d_model / model.n_heads) that is a multiple of 8 "
                  "and at most 128, but it is " +
                      std::to_string(head_dim) + "; use kernels.attention: native");
  }
  if (c.kernels.attention == AttentionKernel::cudnn && c.data.documents == DataDocuments::eos) {
    reader.fail("kernels.attention",
                "cudnn cannot mask packed documents (" + show("data.documents") +
                    "): cuDNN's graphs here have no document mask; use kernels.attention: "
                    "native or auto");
  }
  if (c.data.ask_previous_document &&
      (c.data.source != DataSource::synthetic || c.data.documents != DataDocuments::eos ||
       c.data.documents_per_sequence < 2))
    reader.fail("data.ask_previous_document",
                "needs data.source: synthetic, data.documents: eos and "
                "data.documents_per_sequence >= 2, but " +
                    show("data.source") + ", " + show("data.documents") + ", " +
                    show("data.documents_per_sequence"));
  check_model_size(reader, c);
  // Keys of features that are specified but not built yet: refused rather than ignored, so
  // a run never silently differs from what its config says.

  if (c.memory.offload_checkpoints &&
      c.memory.activation_checkpointing != ActivationCheckpointing::layer)
    reader.fail("memory.offload_checkpoints",
                "offloads the layer inputs that layer checkpointing keeps, but " +
                    show("memory.activation_checkpointing"));
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source_name, std::vector<std::string>* warnings) {
  ConfigReader reader(source_name, key_names());
  reader.read_file_tree(yaml_text);
  const bool file_sets_keys = reader.keys_given() > 0;
  for (const std::string& override_text : overrides) reader.apply_override(override_text);
  Config config;
  fill(reader, config);
  check_ranges(reader, config);
  resolve_defaults(reader, config);
  check_cross_keys(reader, config);
  if (warnings) {
    const std::vector<std::string> inert = inert_key_warnings(reader, config);
    warnings->insert(warnings->end(), inert.begin(), inert.end());
  }
  if (warnings && !file_sets_keys) {
    const Config defaults;
    warnings->push_back(source_name +
                        ": the config sets no keys, so every key not given with --set has its "
                        "default (docs/configuration.md): " +
                        std::to_string(defaults.train.steps) + " steps of a " +
                        std::to_string(defaults.model.n_layers) + "-layer " +
                        name_of(defaults.model.family) + " model on the " +
                        name_of(defaults.data.source) + " task");
  }
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   std::vector<std::string>* warnings) {
  if (input_folder_problem(path).empty())
    throw ConfigError(path +
                      ": is a folder; --config takes a YAML file (e.g. configs/passkey-sp4.yaml)");
  InputFile file(path);
  std::string text;
  if (!file.read_all(text)) throw ConfigError("config file " + file.problem());
  return parse_config(text, overrides, path, warnings);
}

}  // namespace ulysses
