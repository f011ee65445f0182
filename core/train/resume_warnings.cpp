#include "core/train/resume_warnings.h"

#include <map>

namespace ulysses {

namespace {

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
       {batch_change(config, state, dp_size), data_changes(config, state, seq_len, train_data)})
    if (!warning.empty()) warnings.push_back(warning);
  return warnings;
}

}  // namespace ulysses
