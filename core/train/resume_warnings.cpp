#include "core/train/resume_warnings.h"

#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "core/train/optimizer.h"

namespace ulysses {

namespace {

std::string lr_text(double lr) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", lr);
  return text;
}

// The original run's train section: this config with the recorded schedule keys; none where
// those keys no longer make a valid config with the others.
std::optional<TrainConfig> original_schedule(const Config& config, const TrainerState& state) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : state.lr_schedule_keys) overrides.push_back(key + "=" + value);
  try {
    return parse_config(config_to_yaml(config), overrides, "the checkpoint's schedule").train;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string schedule_change(const Config& config, const TrainerState& state) {
  if (state.lr_schedule_keys.empty()) return "";  // a checkpoint of an earlier build
  const std::map<std::string, std::string> keys = lr_schedule_keys(config);
  std::set<std::string> names;
  for (const auto& [key, value] : keys) names.insert(key);
  for (const auto& [key, value] : state.lr_schedule_keys) names.insert(key);
  std::string changes;
  for (const std::string& key : names) {
    const auto now = keys.find(key);
    const auto then = state.lr_schedule_keys.find(key);
    std::string change;
    if (then == state.lr_schedule_keys.end())
      change = key + " '" + now->second + "' (not used by the original schedule)";
    else if (now == keys.end())
      change = key + " not used now (was '" + then->second + "')";
    else if (now->second != then->second)
      change = key + " '" + now->second + "' (was '" + then->second + "')";
    if (!change.empty()) changes += (changes.empty() ? "" : "; ") + change;
  }
  if (changes.empty()) return "";
  const int64_t next = state.step;  // learning_rate counts steps from 0
  std::string text =
      "the learning-rate schedule differs from the run that wrote the checkpoint: " + changes +
      ". From step " + std::to_string(next + 1) +
      " on the learning rate follows this run's schedule: " +
      lr_text(learning_rate(config.train, next)) + " at step " + std::to_string(next + 1);
  if (const std::optional<TrainConfig> original = original_schedule(config, state))
    text += ", where the original schedule gives " + lr_text(learning_rate(*original, next));
  return text + " (docs/checkpoints.md#resuming)";
}

std::string batch_change(const Config& config, const TrainerState& state, int dp_size) {
  const int64_t sequences_per_step =
      int64_t(config.train.grad_accum) * config.train.batch_size * dp_size;
  if (state.sequences_per_step == 0 || state.sequences_per_step == sequences_per_step) return "";
  return "this run reads " + std::to_string(sequences_per_step) +
         " sequences per step (train.grad_accum x train.batch_size x dp), the run that wrote the "
         "checkpoint read " +
         std::to_string(state.sequences_per_step) +
         ": the data position follows the step, so from step " + std::to_string(state.step + 1) +
         " on this run sees other sequences than the original run would have";
}

std::string data_changes(const Config& config, const TrainerState& state, int64_t seq_len,
                         const Dataset& train_data) {
  if (state.train_sequences == 0) return "";  // a checkpoint of an earlier build
  std::vector<std::string> changes;
  const std::map<std::string, std::string> keys = data_order_keys(config);
  for (const auto& [key, recorded] : state.data_keys) {
    const auto now = keys.find(key);
    if (now == keys.end())
      changes.push_back(key + " is no longer a key (was '" + recorded + "')");
    else if (now->second != recorded)
      changes.push_back(key + " '" + now->second + "' (was '" + recorded + "')");
  }
  // The same keys can name other data: files added to a folder or a glob, or rewritten. Under
  // a curriculum the checkpoint's length is a later stage's: the split is counted at it.
  const int64_t sequences = state.data_seq_len == seq_len
                                ? train_data.num_sequences()
                                : make_dataset(config.data, Split::train, state.data_seq_len,
                                               config.model.vocab_size, config.train.seed)
                                      ->num_sequences();
  if (sequences != state.train_sequences)
    changes.push_back("the training split holds " + std::to_string(sequences) + " sequences of " +
                      std::to_string(state.data_seq_len) + " tokens (was " +
                      std::to_string(state.train_sequences) + ")");
  if (changes.empty()) return "";
  std::string text = "the data differs from the run that wrote the checkpoint: ";
  for (size_t i = 0; i < changes.size(); ++i) text += (i == 0 ? "" : "; ") + changes[i];
  return text + ". The data position follows the step, so from step " +
         std::to_string(state.step + 1) +
         " on this run reads other tokens than the original run would have "
         "(docs/checkpoints.md#resuming)";
}

}  // namespace

std::vector<std::string> resume_warnings(const Config& config, const TrainerState& state,
                                         int dp_size, int64_t seq_len, const Dataset& train_data) {
  std::vector<std::string> warnings;
  for (const std::string& warning :
       {batch_change(config, state, dp_size), data_changes(config, state, seq_len, train_data),
        schedule_change(config, state)})
    if (!warning.empty()) warnings.push_back(warning);
  return warnings;
}

}  // namespace ulysses
