#include "data/packed_dataset.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/random.h"
#include "data/token_stream.h"

namespace ulysses {

namespace {

// data.documents eos: which tokens end a document. The end-of-text token always; in text
// also the second newline of a blank line, so that each blank-line-separated record is a
// document. Empty when documents are off.
struct DocumentEnds {
  bool on = false;
  int32_t eos = 0;
  bool blank_lines = false;
  bool ends(int32_t previous, int32_t token) const {
    return on && (token == eos || (blank_lines && token == '\n' && previous == '\n'));
  }
};

// Sequence i of an epoch starts at begin + i * seq_len of the stream and reads
// seq_len + 1 tokens; index n * epoch + k visits sequence perm_epoch(k), or sequence k when
// the order is sequential. With documents, the windows stay the same: documents are packed
// greedily one after another, and the one that does not fit goes on as the first document
// of the next window (its positions restart there).
class PackedDataset : public Dataset {
 public:
  PackedDataset(std::shared_ptr<TokenStream> stream, int64_t begin, int64_t end, int64_t seq_len,
                bool shuffled, uint64_t order_seed, DocumentEnds document_ends)
      : stream_(std::move(stream)),
        begin_(begin),
        seq_len_(seq_len),
        num_sequences_((end - begin - 1) / seq_len),
        shuffled_(shuffled),
        order_seed_(order_seed),
        document_ends_(document_ends) {}

  void read_slice(int64_t index, int64_t offset, int64_t length, int32_t* inputs,
                  int32_t* targets) override {
    if (index < 0 || offset < 0 || length < 0 || offset + length > seq_len_) {
      throw std::out_of_range("read_slice: sequence " + std::to_string(index) + ", tokens [" +
                              std::to_string(offset) + ", " + std::to_string(offset + length) +
                              ") of a sequence of " + std::to_string(seq_len_));
    }
    if (length == 0) return;
    const int64_t start = window_start(index) + offset;
    // Targets are the inputs shifted by one, plus the one token after the slice.
    stream_->read(start, length, inputs);
    for (int64_t i = 0; i + 1 < length; i++) targets[i] = inputs[i + 1];
    stream_->read(start + length, 1, targets + length - 1);
    if (!document_ends_.on) return;
    // A document's last token is not scored against the next document's first.
    int32_t previous = -1;
    if (start > 0) stream_->read(start - 1, 1, &previous);
    for (int64_t i = 0; i < length; i++) {
      if (document_ends_.ends(previous, inputs[i])) targets[i] = -1;
      previous = inputs[i];
    }
  }

  int64_t num_sequences() const override { return num_sequences_; }
  bool has_documents() const override { return document_ends_.on; }

  std::vector<int64_t> document_starts(int64_t index) override {
    const int64_t start = window_start(index);
    std::vector<int32_t> tokens(static_cast<size_t>(seq_len_));
    stream_->read(start, seq_len_, tokens.data());
    int32_t previous = -1;
    if (start > 0) stream_->read(start - 1, 1, &previous);
    std::vector<int64_t> starts = {0};
    for (int64_t t = 0; t + 1 < seq_len_; t++) {
      if (document_ends_.ends(previous, tokens[size_t(t)])) starts.push_back(t + 1);
      previous = tokens[size_t(t)];
    }
    return starts;
  }

 private:
  std::shared_ptr<TokenStream> stream_;
  int64_t begin_;
  int64_t seq_len_;
  int64_t num_sequences_;
  bool shuffled_;
  uint64_t order_seed_;
  DocumentEnds document_ends_;

  int64_t window_start(int64_t index) const {
    const int64_t epoch = index / num_sequences_, in_epoch = index % num_sequences_;
    const int64_t sequence =
        shuffled_ ? Permutation(num_sequences_, hash_words(order_seed_, uint64_t(epoch)))(in_epoch)
                  : in_epoch;
    return begin_ + sequence * seq_len_;
  }
};

DocumentEnds document_ends(const DataConfig& data, int vocab_size) {
  DocumentEnds ends;
  if (data.documents == DataDocuments::none) return ends;
  ends.on = true;
  ends.blank_lines = data.source == DataSource::text;
  ends.eos = data.eos_id >= 0                  ? data.eos_id
             : data.source == DataSource::text ? kEndOfDocument
                                               : kGpt2EndOfText;
  if (ends.eos >= vocab_size)
    throw DataError("data.documents eos: the end-of-text token " + std::to_string(ends.eos) +
                    (data.eos_id >= 0 ? " (data.eos_id)" : " (the source's default)") +
                    " is not below model.vocab_size = " + std::to_string(vocab_size) +
                    "; set data.eos_id to your tokenizer's end-of-text id");
  return ends;
}

std::shared_ptr<TokenStream> load_stream(const DataConfig& data, const std::string& pattern,
                                         const std::string& key, int vocab_size) {
  std::vector<std::string> files = resolve_data_files(pattern, key);
  if (data.source == DataSource::text) {
    return std::make_shared<TokenStream>(TokenStream::from_text_files(files));
  }
  return std::make_shared<TokenStream>(TokenStream::from_token_shards(files, vocab_size));
}

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

void check_fits(int64_t tokens, int64_t seq_len, const std::string& split,
                const std::string& sizes) {
  if (tokens < seq_len + 1) {
    throw DataError("not enough " + split + " data for one sequence of train.seq_len + 1 = " +
                    std::to_string(seq_len + 1) + " tokens: " + sizes);
  }
}

}  // namespace

std::unique_ptr<Dataset> make_packed_dataset(const DataConfig& data, Split split, int64_t seq_len,
                                             int vocab_size, uint64_t seed) {
  if (seq_len < 1) throw DataError("sequence length must be >= 1, got " + std::to_string(seq_len));
  if (data.source == DataSource::text && vocab_size < kTextVocabSize) {
    throw DataError("model.vocab_size = " + std::to_string(vocab_size) +
                    " is too small for data.source text, which needs " +
                    std::to_string(kTextVocabSize) + " (256 bytes + end-of-document)");
  }
  // "order" in ASCII: keeps the shuffle's stream apart from other uses of the seed.
  uint64_t order_seed = hash_words(seed, split == Split::train ? 1 : 2, 0x6f72646572ull);
  const bool shuffled = data.order != DataOrder::sequential;
  const DocumentEnds ends = document_ends(data, vocab_size);

  if (split == Split::val && !data.val_path.empty()) {
    auto stream = load_stream(data, data.val_path, "data.val_path", vocab_size);
    check_fits(stream->size(), seq_len, "validation",
               "data.val_path " + stream->describe() + " holds " + std::to_string(stream->size()) +
                   " tokens");
    return std::make_unique<PackedDataset>(stream, 0, stream->size(), seq_len, shuffled, order_seed,
                                           ends);
  }

  auto stream = load_stream(data, data.path, "data.path", vocab_size);
  int64_t total = stream->size();
  int64_t val_tokens = data.val_path.empty() ? int64_t(double(total) * data.val_fraction) : 0;
  int64_t train_tokens = total - val_tokens;
  std::string sizes =
      "data.path " + stream->describe() + " holds " + std::to_string(total) + " tokens";
  if (data.val_path.empty()) {
    sizes += "; data.val_fraction " + format_number(data.val_fraction) + " leaves " +
             std::to_string(train_tokens) + " for training and " + std::to_string(val_tokens) +
             " for validation";
  }
  if (split == Split::train) {
    check_fits(train_tokens, seq_len, "training", sizes);
    return std::make_unique<PackedDataset>(stream, 0, train_tokens, seq_len, shuffled, order_seed,
                                           ends);
  }
  if (val_tokens == 0) {
    throw DataError("no validation data: data.val_path is empty and " + sizes +
                    "; set data.val_path or a larger data.val_fraction");
  }
  check_fits(val_tokens, seq_len, "validation", sizes);
  return std::make_unique<PackedDataset>(stream, train_tokens, total, seq_len, shuffled, order_seed,
                                         ends);
}

}  // namespace ulysses
