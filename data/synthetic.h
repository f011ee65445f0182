// The built-in long-range task (passkey / associative recall). A sequence is
//   BOS, filler ... PAIR k1 v1 ... filler ... PAIR k2 v2 ... filler, QUERY k v, QUERY k v ...
// with the pairs planted in the first data.plant_fraction of the sequence and the queries
// filling its last 3 * n_queries tokens. Only the answer to each query (the target at the
// queried key) counts, so it is solved only by attending across the whole sequence.
// With data.documents eos a sequence packs data.documents_per_sequence such tasks, each its own
// document with its own keys, so an answer that used another document's key would show.
#pragma once

#include <cstdint>
#include <memory>

#include "data/data_config.h"
#include "data/dataset.h"

namespace ulysses {

// Token ids: three special tokens, then filler, key and value symbols.
struct SyntheticVocab {
  static constexpr int32_t kBos = 0;
  static constexpr int32_t kPair = 1;
  static constexpr int32_t kQuery = 2;
  static constexpr int kNumSpecial = 3;

  int n_filler = 0;
  int n_keys = 0;
  int n_values = 0;

  int32_t first_filler() const { return kNumSpecial; }
  int32_t first_key() const { return kNumSpecial + n_filler; }
  int32_t first_value() const { return kNumSpecial + n_filler + n_keys; }
  int size() const { return kNumSpecial + n_filler + n_keys + n_values; }
  bool is_key(int32_t token) const { return token >= first_key() && token < first_value(); }
  bool is_value(int32_t token) const { return token >= first_value() && token < size(); }
};

SyntheticVocab synthetic_vocab(const DataConfig& data);

// Shortest sequence the task fits in: BOS, the planted pairs and the queries.
int64_t synthetic_min_seq_len(const DataConfig& data);

std::unique_ptr<Dataset> make_synthetic_dataset(const DataConfig& data, Split split,
                                                int64_t seq_len, int vocab_size, uint64_t seed);

}  // namespace ulysses
