#include "core/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <variant>

#include "core/seq_len_schedule.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "parallel/head_chunks.h"

namespace ulysses {

namespace {

// ---- the table of keys -----------------------------------------------------------------

// One config key and the member it fills. Parsing, overrides, unknown-key suggestions and
// config_to_yaml all walk this one table.
using FieldRef = std::variant<int& (*)(Config&), uint64_t& (*)(Config&), double& (*)(Config&),
                              bool& (*)(Config&), std::string& (*)(Config&)>;

struct Field {
  std::string key;  // full dotted key, e.g. "train.checkpoint.dir"
  FieldRef ref;
};

// clang-format off
#define ULYSSES_FIELD(path) Field{#path, [](Config& c) -> auto& { return c.path; }}
// clang-format on

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      ULYSSES_FIELD(device),
      ULYSSES_FIELD(model.family),
      ULYSSES_FIELD(model.n_layers),
      ULYSSES_FIELD(model.d_model),
      ULYSSES_FIELD(model.n_heads),
      ULYSSES_FIELD(model.n_kv_heads),
      ULYSSES_FIELD(model.d_ff),
      ULYSSES_FIELD(model.vocab_size),
      ULYSSES_FIELD(model.max_seq_len),
      ULYSSES_FIELD(model.rope_theta),
      ULYSSES_FIELD(model.norm_eps),
      ULYSSES_FIELD(model.init_from),
      ULYSSES_FIELD(train.steps),
      ULYSSES_FIELD(train.batch_size),
      ULYSSES_FIELD(train.seq_len),
      ULYSSES_FIELD(train.seq_len_schedule),
      ULYSSES_FIELD(train.grad_accum),
      ULYSSES_FIELD(train.lr),
      ULYSSES_FIELD(train.min_lr),
      ULYSSES_FIELD(train.warmup_steps),
      ULYSSES_FIELD(train.schedule),
      ULYSSES_FIELD(train.weight_decay),
      ULYSSES_FIELD(train.beta1),
      ULYSSES_FIELD(train.beta2),
      ULYSSES_FIELD(train.eps),
      ULYSSES_FIELD(train.grad_clip),
      ULYSSES_FIELD(train.seed),
      ULYSSES_FIELD(train.eval_every),
      ULYSSES_FIELD(train.eval_steps),
      ULYSSES_FIELD(train.on_nonfinite),
      ULYSSES_FIELD(train.max_skipped_steps),
      ULYSSES_FIELD(train.checkpoint.dir),
      ULYSSES_FIELD(train.checkpoint.every),
      ULYSSES_FIELD(train.checkpoint.keep_last),
      ULYSSES_FIELD(train.checkpoint.overwrite),
      ULYSSES_FIELD(data.source),
      ULYSSES_FIELD(data.path),
      ULYSSES_FIELD(data.val_path),
      ULYSSES_FIELD(data.val_fraction),
      ULYSSES_FIELD(data.order),
      ULYSSES_FIELD(data.n_pairs),
      ULYSSES_FIELD(data.n_queries),
      ULYSSES_FIELD(data.n_keys),
      ULYSSES_FIELD(data.n_values),
      ULYSSES_FIELD(data.n_filler),
      ULYSSES_FIELD(data.plant_fraction),
      ULYSSES_FIELD(parallel.sp),
      ULYSSES_FIELD(parallel.zero_stage),
      ULYSSES_FIELD(parallel.head_chunks),
      ULYSSES_FIELD(parallel.overlap),
      ULYSSES_FIELD(parallel.bucket_mb),
      ULYSSES_FIELD(parallel.prefetch),
      ULYSSES_FIELD(parallel.progress_thread),
      ULYSSES_FIELD(parallel.device_comm),
      ULYSSES_FIELD(parallel.timeout_s),
      ULYSSES_FIELD(memory.activation_checkpointing),
      ULYSSES_FIELD(memory.tiled_mlp),
      ULYSSES_FIELD(memory.offload_checkpoints),
      ULYSSES_FIELD(memory.loss_tile_tokens),
      ULYSSES_FIELD(memory.limit_gib),
      ULYSSES_FIELD(kernels.attention),
      ULYSSES_FIELD(log.every),
      ULYSSES_FIELD(log.metrics_file),
      ULYSSES_FIELD(log.trace_file),
      ULYSSES_FIELD(log.trace_steps),
      ULYSSES_FIELD(log.verdict_every),
  };
  return table;
}

#undef ULYSSES_FIELD

const Field* find_field(const std::string& key) {
  for (const Field& field : fields()) {
    if (field.key == key) return &field;
  }
  return nullptr;
}

// A section is any proper prefix of a key: "model", "train", "train.checkpoint".
bool is_section(const std::string& key) {
  for (const Field& field : fields()) {
    if (field.key.size() > key.size() && field.key.compare(0, key.size(), key) == 0 &&
        field.key[key.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string> known_keys() {
  std::vector<std::string> keys;
  for (const Field& field : fields()) {
    keys.push_back(field.key);
    for (size_t dot = field.key.find('.'); dot != std::string::npos;
         dot = field.key.find('.', dot + 1)) {
      std::string section = field.key.substr(0, dot);
      if (std::find(keys.begin(), keys.end(), section) == keys.end()) keys.push_back(section);
    }
  }
  return keys;
}

std::string last_component(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) previous[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// The known key a misspelt or misplaced one most likely meant: the same name in another
// section first (train.vocab_size -> model.vocab_size), else the closest spelling.
std::string closest_key(const std::string& unknown) {
  std::vector<std::string> keys = known_keys();
  for (const std::string& key : keys) {
    if (key.find('.') != std::string::npos && last_component(key) == last_component(unknown)) {
      return key;
    }
  }
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& key : keys) {
    size_t distance = edit_distance(unknown, key);
    if (distance < best_distance) {
      best = key;
      best_distance = distance;
    }
  }
  return best;
}

std::string unknown_key_message(const std::string& key) {
  return "unknown key '" + key + "'; did you mean '" + closest_key(key) + "'?";
}

// ---- value conversion ------------------------------------------------------------------

std::string format_double(double value) {
  char text[64];
  auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

template <typename T>
std::string format_value(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return "'" + value + "'";
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(value);
  } else {
    return std::to_string(value);
  }
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

std::string describe_node(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing";
  return "'" + node.Scalar() + "'";
}

// True when the whole text (an optional leading '+' aside) is an integer that fits T.
template <typename T>
bool parse_integer(std::string text, T& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end;
}

bool parse_double(std::string text, double& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end && std::isfinite(out);
}

// YAML 1.1 spellings, which users write in configs.
bool parse_bool(const std::string& text, bool& out) {
  static const std::vector<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
  static const std::vector<std::string> kFalse = {"false", "False", "FALSE", "no",
                                                  "No",    "off",   "Off"};
  if (std::find(kTrue.begin(), kTrue.end(), text) != kTrue.end()) {
    out = true;
    return true;
  }
  if (std::find(kFalse.begin(), kFalse.end(), text) != kFalse.end()) {
    out = false;
    return true;
  }
  return false;
}

// An integer too large (or small) for the key's type gets its range, not "expected an
// integer".
template <typename T>
std::string integer_problem(const YAML::Node& node, const std::string& expected) {
  if (node.IsScalar()) {
    std::string text = node.Scalar();
    if (!text.empty() && text[0] == '+') text.erase(0, 1);
    const bool negative = !text.empty() && text[0] == '-';
    const std::string digits = negative ? text.substr(1) : text;
    const bool integer =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos;
    if (integer && negative && std::numeric_limits<T>::min() == 0)
      return expected + ", got " + node.Scalar();
    if (integer)
      return node.Scalar() + " is out of range; the " + (negative ? "smallest" : "largest") +
             " allowed is " +
             std::to_string(negative ? std::numeric_limits<T>::min()
                                     : std::numeric_limits<T>::max());
  }
  return expected + ", got " + describe_node(node);
}

// Returns the problem with the node as a value of this type, or "" when it was stored.
std::string convert(const YAML::Node& node, int& out) {
  if (node.IsScalar() && parse_integer(node.Scalar(), out)) return "";
  return integer_problem<int>(node, "expected an integer");
}

std::string convert(const YAML::Node& node, uint64_t& out) {
  if (node.IsScalar() && parse_integer(node.Scalar(), out)) return "";
  return integer_problem<uint64_t>(node, "expected a non-negative integer");
}

std::string convert(const YAML::Node& node, double& out) {
  if (node.IsScalar() && parse_double(node.Scalar(), out)) return "";
  return "expected a number, got " + describe_node(node);
}

std::string convert(const YAML::Node& node, bool& out) {
  if (node.IsScalar() && parse_bool(node.Scalar(), out)) return "";
  return "expected true or false, got " + describe_node(node);
}

std::string convert(const YAML::Node& node, std::string& out) {
  if (node.IsNull()) {
    out.clear();
    return "";
  }
  if (node.IsScalar()) {
    out = node.Scalar();
    return "";
  }
  return "expected a string, got " + describe_node(node);
}

// ---- reading the tree ------------------------------------------------------------------

// Records where the last YAML document started. yaml-cpp 0.7's LoadAll never returns on
// some malformed text (a ',' where a document should start): its parser stops advancing and
// adds empty documents until memory runs out. The same parser run with this handler shows
// that as two documents starting at the same place.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    stuck = count > 0 && mark.pos == last.pos;
    last = mark;
    count++;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  YAML::Mark last;
  int64_t count = 0;
  bool stuck = false;
};

// A key given in the file or an override: its value and where it came from.
struct GivenValue {
  YAML::Node value;
  std::string where;  // "config.yaml:12" or "override 'train.lr=1e-3'"
};

class ConfigReader {
 public:
  explicit ConfigReader(std::string source_name) : source_(std::move(source_name)) {}

  void read_file_tree(const std::string& yaml_text) {
    std::vector<YAML::Node> documents;
    try {
      check_parser_advances(yaml_text);
      documents = YAML::LoadAll(yaml_text);
    } catch (const YAML::DeepRecursion& error) {  // yaml-cpp says only "bad file"
      throw ConfigError(source_ + ":" + std::to_string(error.mark.line + 1) +
                        ": invalid YAML: nested too deeply (a config nests at most 3 levels)");
    } catch (const YAML::Exception& error) {
      throw ConfigError(source_ + ":" + std::to_string(error.mark.line + 1) +
                        ": invalid YAML: " + error.msg);
    }
    while (documents.size() > 1 && documents.back().IsNull()) documents.pop_back();
    if (documents.size() > 1) {
      throw ConfigError(line_of(documents[1]) + ": the file holds " +
                        std::to_string(documents.size()) +
                        " YAML documents (separated by '---'); a config is one document");
    }
    if (documents.empty()) return;
    const YAML::Node& root = documents[0];
    if (root.IsNull()) return;
    if (!root.IsMap()) {
      throw ConfigError(line_of(root) + ": the config must be a map of sections (device, " +
                        "model, train, data, parallel, memory, kernels, log), got " +
                        describe_node(root));
    }
    collect(root, "");
  }

  void apply_override(const std::string& override_text) {
    std::string where = "override '" + override_text + "'";
    size_t equals = override_text.find('=');
    if (equals == std::string::npos) {
      throw ConfigError(where + ": expected key=value, e.g. train.lr=1e-3");
    }
    std::string key = trim(override_text.substr(0, equals));
    if (!find_field(key)) {
      if (is_section(key)) {
        throw ConfigError(where + ": '" + key + "' is a section; set one of its keys, e.g. " +
                          first_key_of(key) + "=...");
      }
      throw ConfigError(where + ": " + unknown_key_message(key));
    }
    YAML::Node value;
    try {
      value = YAML::Load(override_text.substr(equals + 1));
    } catch (const YAML::DeepRecursion&) {
      throw ConfigError(where + ": invalid YAML value: nested too deeply");
    } catch (const YAML::Exception& error) {
      throw ConfigError(where + ": invalid YAML value: " + error.msg);
    }
    given_[key] = GivenValue{value, where};
  }

  // Stores every given key into the config, checking its type.
  void fill(Config& config) const {
    for (const Field& field : fields()) {
      auto given = given_.find(field.key);
      if (given == given_.end()) continue;
      std::string problem = std::visit(
          [&](auto ref) { return convert(given->second.value, ref(config)); }, field.ref);
      if (!problem.empty()) fail(field.key, problem);
    }
  }

  // "config.yaml:12", an override, or "" for a key left at its default.
  std::string where(const std::string& key) const {
    auto given = given_.find(key);
    return given == given_.end() ? "" : given->second.where;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    std::string location = where(key);
    if (location.empty()) location = source_;
    throw ConfigError(location + ": " + key + ": " + problem);
  }

  // "model.n_heads = 12 (config.yaml:5)", for messages that involve a second key.
  std::string show(const Config& config, const std::string& key) const {
    std::string location = where(key);
    return key + " = " + value_text(config, key) + " (" +
           (location.empty() ? "default" : location) + ")";
  }

  static std::string value_text(const Config& config, const std::string& key) {
    Config copy = config;  // the table's accessors take a mutable Config
    return std::visit([&](auto ref) { return format_value(ref(copy)); }, find_field(key)->ref);
  }

 private:
  std::string line_of(const YAML::Node& node) const {
    return source_ + ":" + std::to_string(node.Mark().line + 1);
  }

  // Throws ConfigError where YAML::LoadAll would loop forever (DocumentStarts).
  void check_parser_advances(const std::string& yaml_text) const {
    std::istringstream stream(yaml_text);
    YAML::Parser parser(stream);
    DocumentStarts starts;
    while (parser.HandleNextDocument(starts)) {
      if (!starts.stuck) continue;
      const size_t pos = size_t(std::max(starts.last.pos, 0));
      const std::string found =
          pos < yaml_text.size() ? "'" + yaml_text.substr(pos, 1) + "'" : "the end of the text";
      throw ConfigError(source_ + ":" + std::to_string(starts.last.line + 1) +
                        ": invalid YAML: unexpected " + found + " where a value should start");
    }
  }

  static std::string first_key_of(const std::string& section) {
    for (const Field& field : fields()) {
      if (field.key.compare(0, section.size() + 1, section + ".") == 0) return field.key;
    }
    return section;
  }

  void collect(const YAML::Node& map, const std::string& prefix) {
    for (const auto& entry : map) {
      // Copies: the iterator hands out a temporary pair of node handles.
      YAML::Node key_node = entry.first;
      YAML::Node value = entry.second;
      if (!key_node.IsScalar()) {
        throw ConfigError(line_of(key_node) + ": keys must be plain names, got " +
                          describe_node(key_node));
      }
      std::string key = prefix + key_node.Scalar();
      std::string location = line_of(key_node);
      if (find_field(key)) {
        if (given_.count(key)) {
          throw ConfigError(location + ": " + key + ": given twice (first at " + given_[key].where +
                            ")");
        }
        given_[key] = GivenValue{value, location};
      } else if (is_section(key)) {
        if (value.IsMap()) {
          collect(value, key + ".");
        } else if (!value.IsNull()) {
          throw ConfigError(location + ": " + key + ": expected a map of " + key +
                            ".* keys (e.g. " + first_key_of(key) + "), got " +
                            describe_node(value));
        }
      } else {
        throw ConfigError(location + ": " + unknown_key_message(key));
      }
    }
  }

  std::string source_;
  std::map<std::string, GivenValue> given_;
};

// ---- validation ------------------------------------------------------------------------

std::string join_choices(const std::vector<std::string>& choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); i++) {
    if (i > 0) text += i + 1 == choices.size() ? " or " : ", ";
    text += choices[i];
  }
  return text;
}

// Ascending. Pairs d and n / d up to sqrt(n): n may be as large as the int range (a config
// is checked before its size is), where counting up to n would take seconds and overflow.
std::vector<std::string> divisors_of(int n) {
  std::vector<std::string> divisors, above_root;
  for (int d = 1; d <= n / d; d++) {
    if (n % d != 0) continue;
    divisors.push_back(std::to_string(d));
    if (d != n / d) above_root.push_back(std::to_string(n / d));
  }
  divisors.insert(divisors.end(), above_root.rbegin(), above_root.rend());
  return divisors;
}

// Range and choice checks that report through the reader, so messages carry locations.
struct Checks {
  const ConfigReader& reader;
  const Config& config;

  void choice(const std::string& key, const std::string& value,
              const std::vector<std::string>& allowed) const {
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      reader.fail(key, "'" + value + "' is not allowed; use " + join_choices(allowed));
    }
  }

  template <typename T>
  void at_least(const std::string& key, T value, T minimum) const {
    if (value < minimum) {
      reader.fail(key, "must be >= " + format_value(minimum) + ", got " + format_value(value));
    }
  }

  template <typename T>
  void between(const std::string& key, T value, T low, T high) const {
    if (value < low || value > high) {
      reader.fail(key, "must be between " + format_value(low) + " and " + format_value(high) +
                           ", got " + format_value(value));
    }
  }

  void positive(const std::string& key, double value) const {
    if (!(value > 0.0)) reader.fail(key, "must be > 0, got " + format_double(value));
  }

  // [0, 1): Adam betas, the validation fraction.
  void unit_interval(const std::string& key, double value) const {
    if (!(value >= 0.0 && value < 1.0)) {
      reader.fail(key, "must be >= 0 and < 1, got " + format_double(value));
    }
  }

  std::string show(const std::string& key) const { return reader.show(config, key); }
};

void check_ranges(const ConfigReader& reader, const Config& c) {
  Checks check{reader, c};
  check.choice("device", c.device, {"cpu", "cuda"});

  check.choice("model.family", c.model.family, {"llama", "gpt2"});
  check.at_least("model.n_layers", c.model.n_layers, 1);
  check.at_least("model.d_model", c.model.d_model, 1);
  check.at_least("model.n_heads", c.model.n_heads, 1);
  check.at_least("model.n_kv_heads", c.model.n_kv_heads, 0);
  check.at_least("model.d_ff", c.model.d_ff, 0);
  check.at_least("model.vocab_size", c.model.vocab_size, 0);
  check.at_least("model.max_seq_len", c.model.max_seq_len, 0);
  check.positive("model.rope_theta", c.model.rope_theta);
  check.positive("model.norm_eps", c.model.norm_eps);

  check.at_least("train.steps", c.train.steps, 1);
  check.at_least("train.batch_size", c.train.batch_size, 1);
  check.at_least("train.seq_len", c.train.seq_len, 2);
  check.at_least("train.grad_accum", c.train.grad_accum, 1);
  check.positive("train.lr", c.train.lr);
  check.at_least("train.min_lr", c.train.min_lr, 0.0);
  check.at_least("train.warmup_steps", c.train.warmup_steps, 0);
  check.at_least("train.weight_decay", c.train.weight_decay, 0.0);
  check.unit_interval("train.beta1", c.train.beta1);
  check.unit_interval("train.beta2", c.train.beta2);
  check.positive("train.eps", c.train.eps);
  check.at_least("train.grad_clip", c.train.grad_clip, 0.0);
  check.at_least("train.eval_every", c.train.eval_every, 0);
  check.at_least("train.eval_steps", c.train.eval_steps, 1);
  check.choice("train.on_nonfinite", c.train.on_nonfinite, {"abort", "skip"});
  check.choice("train.schedule", c.train.schedule, {"cosine", "linear", "constant"});
  check.at_least("train.max_skipped_steps", c.train.max_skipped_steps, 1);
  check.at_least("train.checkpoint.every", c.train.checkpoint.every, 0);
  check.at_least("train.checkpoint.keep_last", c.train.checkpoint.keep_last, 0);

  check.choice("data.source", c.data.source, {"synthetic", "text", "tokens"});
  check.choice("data.order", c.data.order, {"shuffled", "sequential"});
  check.unit_interval("data.val_fraction", c.data.val_fraction);
  check.at_least("data.n_pairs", c.data.n_pairs, 1);
  check.at_least("data.n_queries", c.data.n_queries, 1);
  check.at_least("data.n_keys", c.data.n_keys, 1);
  check.at_least("data.n_values", c.data.n_values, 1);
  check.at_least("data.n_filler", c.data.n_filler, 1);
  if (!(c.data.plant_fraction > 0.0 && c.data.plant_fraction <= 1.0)) {
    reader.fail("data.plant_fraction",
                "must be > 0 and <= 1, got " + format_double(c.data.plant_fraction));
  }

  check.at_least("parallel.sp", c.parallel.sp, 1);
  check.between("parallel.zero_stage", c.parallel.zero_stage, 0, 3);
  check.at_least("parallel.head_chunks", c.parallel.head_chunks, 1);
  check.positive("parallel.bucket_mb", c.parallel.bucket_mb);
  check.choice("parallel.device_comm", c.parallel.device_comm, {"auto", "nccl", "mpi"});
  check.at_least("parallel.timeout_s", c.parallel.timeout_s, 0.0);
  check.choice("parallel.progress_thread", c.parallel.progress_thread, {"auto", "on", "off"});

  check.choice("memory.activation_checkpointing", c.memory.activation_checkpointing,
               {"none", "layer"});
  check.at_least("memory.loss_tile_tokens", c.memory.loss_tile_tokens, 1);
  {
    int tiles = 0;
    const std::string& tiled = c.memory.tiled_mlp;
    if (tiled != "false" && tiled != "auto" && !(parse_integer(tiled, tiles) && tiles >= 1))
      reader.fail("memory.tiled_mlp", "'" + tiled +
                                          "' is not allowed; use false, auto or a tile "
                                          "count >= 1");
  }
  check.at_least("memory.limit_gib", c.memory.limit_gib, 0.0);
  // A limit that rounds to a few bytes is a typo for 0 (no limit), and the byte count must
  // fit an int64.
  constexpr double kSmallestLimitGib = 1e-6, kLargestLimitGib = 1024.0 * 1024.0 * 1024.0;
  if (c.memory.limit_gib > 0.0 &&
      (c.memory.limit_gib < kSmallestLimitGib || c.memory.limit_gib > kLargestLimitGib)) {
    reader.fail("memory.limit_gib", "must be 0 (no limit) or between 1e-06 (about 1 KiB) and " +
                                        format_double(kLargestLimitGib) + " (1 EiB), got " +
                                        format_double(c.memory.limit_gib));
  }

  check.choice("kernels.attention", c.kernels.attention, {"native", "cudnn"});

  check.at_least("log.every", c.log.every, 1);
  check.at_least("log.trace_steps", c.log.trace_steps, 1);
  check.at_least("log.verdict_every", c.log.verdict_every, 0);
}

// Defaults that depend on other keys.
void resolve_defaults(const ConfigReader& reader, Config& c) {
  ModelConfig& m = c.model;
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  if (m.d_ff == 0) {
    // In 64 bits: d_model is any int here (check_model_size judges the size later).
    const int64_t d_model = m.d_model;
    int64_t d_ff = 4 * d_model;
    if (m.family == "llama") {
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
    if (c.data.source == "tokens") {
      reader.fail("model.vocab_size", "is required with " + reader.show(c, "data.source") +
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
                                     " parameters (" + reader.show(c, "model.n_layers") + ", " +
                                     reader.show(c, "model.d_ff") + ", " +
                                     reader.show(c, "model.vocab_size") +
                                     "); ulysses supports at most 2^40 (1.1e12)");
  }
  const long double activation_bytes = 4.0L * c.train.batch_size * c.train.seq_len * std::max(C, F);
  if (activation_bytes > kMaxActivationBytes) {
    reader.fail("train.seq_len", "one activation of " + reader.show(c, "train.batch_size") +
                                     " sequences of " + std::to_string(c.train.seq_len) +
                                     " tokens would exceed 1 PiB; lower the batch or the length");
  }
}

void check_cross_keys(const ConfigReader& reader, const Config& c) {
  Checks check{reader, c};
  const ModelConfig& m = c.model;

  if (c.train.min_lr > c.train.lr) {
    reader.fail("train.min_lr", format_double(c.train.min_lr) + " is above " +
                                    check.show("train.lr") +
                                    "; the schedule decays from lr down to min_lr");
  }
  if (m.d_model % m.n_heads != 0) {
    reader.fail("model.d_model", std::to_string(m.d_model) + " is not divisible by " +
                                     check.show("model.n_heads") + "; heads split d_model evenly");
  }
  if (m.n_kv_heads > m.n_heads || m.n_heads % m.n_kv_heads != 0) {
    reader.fail("model.n_kv_heads",
                std::to_string(m.n_kv_heads) + " does not divide " + check.show("model.n_heads") +
                    "; each kv head serves a whole group of query heads; n_kv_heads can be " +
                    join_choices(divisors_of(m.n_heads)));
  }
  if (m.family == "llama" && m.head_dim() % 2 != 0) {
    reader.fail("model.d_model", "head_dim = d_model / n_heads = " + std::to_string(m.head_dim()) +
                                     " is odd (" + check.show("model.n_heads") +
                                     "); RoPE rotates pairs of dimensions and needs it even");
  }
  if (m.family == "gpt2" && m.n_kv_heads != m.n_heads) {
    reader.fail("model.n_kv_heads", std::to_string(m.n_kv_heads) + " differs from " +
                                        check.show("model.n_heads") +
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
                std::to_string(c.train.seq_len) + " is above " + check.show("model.max_seq_len"));
  }
  if ((c.data.source == "text" || c.data.source == "tokens") && c.data.path.empty()) {
    reader.fail("data.path", "is required with " + check.show("data.source") +
                                 ": give a file, a folder or a glob");
  }
  if (c.data.source == "synthetic") {
    if (c.data.n_queries > c.data.n_pairs) {
      reader.fail("data.n_queries", std::to_string(c.data.n_queries) + " is above " +
                                        check.show("data.n_pairs") +
                                        "; each query asks for a different planted pair");
    }
    if (c.data.n_keys < c.data.n_pairs) {
      reader.fail("data.n_keys", std::to_string(c.data.n_keys) + " is below " +
                                     check.show("data.n_pairs") + "; planted keys are distinct");
    }
    int64_t needed = synthetic_min_seq_len(c.data);
    if (!stages.empty() && stages.front().seq_len < needed) {
      reader.fail("train.seq_len_schedule",
                  "the first stage's length " + std::to_string(stages.front().seq_len) +
                      " is too short for the synthetic task, which needs " +
                      std::to_string(needed));
    }
    if (c.train.seq_len < needed) {
      reader.fail("train.seq_len",
                  std::to_string(c.train.seq_len) +
                      " is too short for the synthetic task: BOS + 3 tokens for each of " +
                      check.show("data.n_pairs") + " and " + check.show("data.n_queries") +
                      " needs " + std::to_string(needed));
    }
  }
  int needed_vocab = default_vocab_size(c.data);
  if (m.vocab_size < needed_vocab) {
    reader.fail("model.vocab_size", std::to_string(m.vocab_size) + " is below the " +
                                        std::to_string(needed_vocab) + " tokens data.source " +
                                        c.data.source + " needs");
  }
  if (c.parallel.device_comm == "nccl" && c.device != "cuda") {
    reader.fail("parallel.device_comm", "nccl needs device: cuda, but " + check.show("device"));
  }
  if (c.kernels.attention == "cudnn" && c.device != "cuda") {
    reader.fail("kernels.attention", "cudnn needs device: cuda, but " + check.show("device"));
  }
  if (c.kernels.attention == "cudnn" && m.n_heads > 0) {
    const int head_dim = m.d_model / m.n_heads;
    if (head_dim % 8 != 0 || head_dim > 128)
      reader.fail("kernels.attention",
                  "cudnn needs a head dim (model.d_model / model.n_heads) that is a multiple of 8 "
                  "and at most 128, but it is " +
                      std::to_string(head_dim) + "; use kernels.attention: native");
  }
  check_model_size(reader, c);
  // Keys of features that are specified but not built yet: refused rather than ignored, so
  // a run never silently differs from what its config says.

  if (c.memory.offload_checkpoints && c.memory.activation_checkpointing != "layer")
    reader.fail("memory.offload_checkpoints",
                "offloads the layer inputs that layer checkpointing keeps, but " +
                    check.show("memory.activation_checkpointing"));
}

// ---- YAML output -----------------------------------------------------------------------

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  std::string part;
  while (std::getline(stream, part, '.')) parts.push_back(part);
  return parts;
}

std::string scalar_text(Config& config, const Field& field) {
  return std::visit(
      [&](auto ref) -> std::string {
        const auto& value = ref(config);
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return value;
        } else {
          return format_value(value);
        }
      },
      field.ref);
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source_name) {
  ConfigReader reader(source_name);
  reader.read_file_tree(yaml_text);
  for (const std::string& override_text : overrides) reader.apply_override(override_text);
  Config config;
  reader.fill(config);
  check_ranges(reader, config);
  resolve_defaults(reader, config);
  check_cross_keys(reader, config);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error))
    throw ConfigError(path +
                      ": is a folder; --config takes a YAML file (e.g. configs/passkey-sp4.yaml)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": config file does not exist or cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), overrides, path);
}

void validate_for_world(const Config& config, int world_size) {
  const int sp = config.parallel.sp;
  const int n_heads = config.model.n_heads;
  const int n_kv_heads = config.model.n_kv_heads == 0 ? n_heads : config.model.n_kv_heads;
  if (world_size < 1) {
    throw ConfigError("the job has " + std::to_string(world_size) + " ranks; it needs at least 1");
  }
  if (world_size % sp != 0) {
    throw ConfigError("parallel.sp=" + std::to_string(sp) + " does not divide the " +
                      std::to_string(world_size) + " ranks of the job; sp can be " +
                      join_choices(divisors_of(world_size)));
  }
  if (n_heads % sp != 0) {
    throw ConfigError("model.n_heads=" + std::to_string(n_heads) +
                      " is not divisible by parallel.sp=" + std::to_string(sp) + "; sp can be " +
                      join_choices(divisors_of(n_heads)));
  }
  if (n_kv_heads % sp != 0 && sp % n_kv_heads != 0) {
    std::vector<std::string> working;
    for (int candidate = 1; candidate <= n_heads; ++candidate) {
      if (n_heads % candidate == 0 && world_size % candidate == 0 &&
          (n_kv_heads % candidate == 0 || candidate % n_kv_heads == 0))
        working.push_back(std::to_string(candidate));
    }
    throw ConfigError("model.n_kv_heads=" + std::to_string(n_kv_heads) +
                      " and parallel.sp=" + std::to_string(sp) +
                      " do not fit: kv heads are split over the sp ranks when n_kv_heads % sp "
                      "== 0, or replicated when sp % n_kv_heads == 0, and neither holds; on " +
                      std::to_string(world_size) + " ranks sp can be " + join_choices(working));
  }
  if (config.train.seq_len % sp != 0) {
    int below = config.train.seq_len / sp * sp;
    throw ConfigError("train.seq_len=" + std::to_string(config.train.seq_len) +
                      " is not divisible by parallel.sp=" + std::to_string(sp) +
                      "; every rank holds an equal slice, e.g. use " +
                      (below > 0 ? std::to_string(below) + " or " : "") +
                      std::to_string(below + sp));
  }
  for (const SeqLenStage& stage : parse_seq_len_schedule(config.train.seq_len_schedule)) {
    if (stage.seq_len % sp != 0)
      throw ConfigError("train.seq_len_schedule: the stage at step " +
                        std::to_string(stage.first_step) + " has length " +
                        std::to_string(stage.seq_len) + ", not divisible by parallel.sp=" +
                        std::to_string(sp) + "; every rank holds an equal slice");
  }
  const int heads_per_rank = n_heads / sp;
  const std::vector<int> chunks = valid_head_chunks(n_heads, n_kv_heads, sp);
  if (std::find(chunks.begin(), chunks.end(), config.parallel.head_chunks) == chunks.end()) {
    std::vector<std::string> valid;
    for (int u : chunks) valid.push_back(std::to_string(u));
    const bool divides = heads_per_rank % config.parallel.head_chunks == 0;
    throw ConfigError("parallel.head_chunks=" + std::to_string(config.parallel.head_chunks) +
                      (divides
                           ? " splits the " + std::to_string(heads_per_rank) +
                                 " heads per rank into stages of " +
                                 std::to_string(heads_per_rank / config.parallel.head_chunks) +
                                 ", which neither hold whole groups of the " +
                                 std::to_string(n_heads / n_kv_heads) +
                                 " query heads per kv head nor lie inside one (model.n_kv_heads=" +
                                 std::to_string(n_kv_heads) + ")"
                           : " does not divide the " + std::to_string(heads_per_rank) +
                                 " heads per rank (model.n_heads=" + std::to_string(n_heads) +
                                 " / parallel.sp=" + std::to_string(sp) + ")") +
                      "; head_chunks can be " + join_choices(valid));
  }
}

int64_t mlp_tiles(const MemoryConfig& memory, int64_t rows, int d_model, int d_ff,
                  int intermediates) {
  int64_t tiles = 1;
  if (memory.tiled_mlp == "auto") {
    tiles = (int64_t(intermediates) * d_ff + d_model - 1) / d_model;
  } else if (memory.tiled_mlp != "false") {
    int count = 1;
    parse_integer(memory.tiled_mlp, count);
    tiles = count;
  }
  return std::max<int64_t>(1, std::min(tiles, rows));
}

long double approximate_parameter_count(const ModelConfig& m) {
  const long double C = m.d_model, F = m.d_ff, L = m.n_layers;
  return 2.0L * m.vocab_size * C + (long double)m.max_seq_len * C +
         L * (4.0L * C * C + 3.0L * C * F + 6.0L * C + F);
}

std::vector<std::string> config_key_values(const Config& config) {
  Config copy = config;
  std::vector<std::string> lines;
  for (const Field& field : fields()) lines.push_back(field.key + "=" + scalar_text(copy, field));
  return lines;
}

std::string config_to_yaml(const Config& config) {
  Config copy = config;
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open_sections;
  for (const Field& field : fields()) {
    std::vector<std::string> parts = split_key(field.key);
    std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open_sections.size() && common < sections.size() &&
           open_sections[common] == sections[common]) {
      common++;
    }
    while (open_sections.size() > common) {
      out << YAML::EndMap;
      open_sections.pop_back();
    }
    while (open_sections.size() < sections.size()) {
      out << YAML::Key << sections[open_sections.size()] << YAML::Value << YAML::BeginMap;
      open_sections.push_back(sections[open_sections.size()]);
    }
    out << YAML::Key << parts.back() << YAML::Value << scalar_text(copy, field);
  }
  while (!open_sections.empty()) {
    out << YAML::EndMap;
    open_sections.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ulysses
