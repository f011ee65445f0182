#include "data/dataset.h"

#include "data/packed_dataset.h"
#include "data/synthetic.h"
#include "data/token_stream.h"

namespace ulysses {

int default_vocab_size(const DataConfig& data) {
  if (data.source == DataSource::synthetic) return synthetic_vocab(data).size();
  if (data.source == DataSource::text) return kTextVocabSize;
  return 0;
}

std::unique_ptr<Dataset> make_dataset(const DataConfig& data, Split split, int64_t seq_len,
                                      int vocab_size, uint64_t seed) {
  if (data.source == DataSource::synthetic) {
    return make_synthetic_dataset(data, split, seq_len, vocab_size, seed);
  }
  // text and tokens: one packed stream of documents.
  return make_packed_dataset(data, split, seq_len, vocab_size, seed);
}

}  // namespace ulysses
