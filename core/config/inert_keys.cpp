#include "core/config/inert_keys.h"

#include <algorithm>

#include "core/config/config_keys.h"

namespace ulysses {

namespace {

using namespace config_keys;

// Keys that have no effect while `condition` holds of the config that `because` shows.
struct InertRule {
  std::vector<std::string> keys;
  std::string because;  // the key whose value makes them inert
  bool (*condition)(const Config&);
  std::string why;
};

const std::vector<InertRule>& inert_rules() {
  static const std::vector<InertRule> rules = {
      {{"data.n_pairs", "data.n_queries", "data.n_keys", "data.n_values", "data.n_filler",
        "data.plant_fraction", "data.documents_per_sequence"},
       "data.source",
       [](const Config& c) { return c.data.source != DataSource::synthetic; },
       "it shapes the synthetic task only"},
      {{"data.path", "data.val_path", "data.val_fraction", "data.order", "data.eos_id"},
       "data.source",
       [](const Config& c) { return c.data.source == DataSource::synthetic; },
       "synthetic sequences are generated from their index, not read from files"},
      {{"data.val_fraction"},
       "data.val_path",
       [](const Config& c) { return !c.data.val_path.empty(); },
       "the validation split is read from data.val_path"},
      {{"data.eos_id", "data.documents_per_sequence"},
       "data.documents",
       [](const Config& c) { return c.data.documents == DataDocuments::none; },
       "sequences are not packed documents"},
      {{"model.rope_theta"},
       "model.family",
       [](const Config& c) { return c.model.family == Family::gpt2; },
       "gpt2 learns its positions; it has no RoPE"},
      {{"train.min_lr"},
       "train.schedule",
       [](const Config& c) { return c.train.schedule == LrSchedule::constant; },
       "the rate stays at train.lr after the warmup"},
      {{"train.max_skipped_steps"},
       "train.on_nonfinite",
       [](const Config& c) { return c.train.on_nonfinite == OnNonfinite::abort; },
       "the run stops at the first non-finite or spiking step"},
      {{"train.checkpoint.every", "train.checkpoint.keep_last", "train.checkpoint.overwrite"},
       "train.checkpoint.dir",
       [](const Config& c) { return c.train.checkpoint.dir.empty(); },
       "no checkpoint is written without a folder; set train.checkpoint.dir"},
      {{"log.trace_steps"},
       "log.trace_file",
       [](const Config& c) { return c.log.trace_file.empty(); },
       "no trace is written without a file"},
      {{"parallel.device_comm", "log.device_timing"},
       "device",
       [](const Config& c) { return c.device == BackendKind::cpu; },
       "the cpu backend has no device buffers or stream"},
  };
  return rules;
}

}  // namespace

std::vector<std::string> inert_key_warnings(const ConfigReader& reader, const Config& config) {
  const Config defaults;
  std::vector<std::string> warnings;
  for (const Field& field : fields()) {
    if (reader.given(field.key) == nullptr ||
        value_text(config, field.key) == value_text(defaults, field.key))
      continue;
    for (const InertRule& rule : inert_rules()) {
      if (!rule.condition(config) ||
          std::find(rule.keys.begin(), rule.keys.end(), field.key) == rule.keys.end())
        continue;
      warnings.push_back(key_shown(reader, config, field.key) + " has no effect while " +
                         key_shown(reader, config, rule.because) + ": " + rule.why +
                         " (docs/configuration.md#keys-without-effect)");
      break;
    }
  }
  return warnings;
}

}  // namespace ulysses
