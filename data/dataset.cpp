#include "data/dataset.h"

#include "data/packed_dataset.h"
#include "data/synthetic.h"
#include "data/token_stream.h"

namespace ulysses {

int default_vocab_size(const DataConfig& data) {
  if (data.source == "synthetic") return synthetic_vocab(data).size();
  if (data.source == "text") return kTextVocabSize;
  return 0;
}

std::unique_ptr<Dataset> make_dataset(const DataConfig& data, Split split, int64_t seq_len,
                                      int vocab_size, uint64_t seed) {
  if (data.source == "synthetic") {
    return make_synthetic_dataset(data, split, seq_len, vocab_size, seed);
  }
  if (data.source == "text" || data.source == "tokens") {
    return make_packed_dataset(data, split, seq_len, vocab_size, seed);
  }
  throw DataError("data.source '" + data.source + "' is not one of synthetic, text, tokens");
}

}  // namespace ulysses
