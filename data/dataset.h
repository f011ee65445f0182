// Dataset readers. A dataset is a deterministic function from a sequence index to tokens,
// so any rank can read exactly its own slice of any sequence, and a resumed run reads
// the same data as an uninterrupted one.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data_config.h"

namespace ulysses {

// Unreadable, malformed or out-of-range data (bad magic, truncation, token id >= vocab).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Split { train, val };

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Tokens [offset, offset + length) of sequence `index` (any index >= 0; finite sources
  // wrap around in a seeded shuffled order per epoch). targets[i] is the token that
  // follows inputs[i] in the sequence, or -1 where no loss is taken (synthetic: every
  // token except the answers). Never reads more of the sequence than the slice needs.
  virtual void read_slice(int64_t index, int64_t offset, int64_t length, int32_t* inputs,
                          int32_t* targets) = 0;
  // Distinct sequences before the order repeats (synthetic: effectively unbounded).
  virtual int64_t num_sequences() const = 0;
  // Answer accuracy is meaningful (synthetic).
  virtual bool has_answers() const { return false; }
  // Synthetic: where each query of sequence `index` is asked and where the key it asks for
  // was planted (positions in the sequence), in query order; empty for other sources.
  struct Query {
    int64_t asked_at;
    int64_t key_at;
  };
  virtual std::vector<Query> queries(int64_t /*index*/) const { return {}; }
  // data.documents eos: whether sequences are packed documents, and where the documents of
  // sequence `index` begin (positions in the whole sequence, ascending, the first 0). Every
  // rank asks for the whole sequence's starts: they are a few integers.
  virtual bool has_documents() const { return false; }
  virtual std::vector<int64_t> document_starts(int64_t /*index*/) { return {0}; }
};

// Smallest vocabulary the source needs (synthetic, text); 0 when it must come from the
// config (tokens).
int default_vocab_size(const DataConfig& data);

// Opens the source for one split; seq_len is the full sequence length; token ids are
// checked against vocab_size as they are read.
std::unique_ptr<Dataset> make_dataset(const DataConfig& data, Split split, int64_t seq_len,
                                      int vocab_size, uint64_t seed);

}  // namespace ulysses
