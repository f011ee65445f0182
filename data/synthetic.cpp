#include "data/synthetic.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/random.h"

namespace ulysses {

namespace {

// Where the pairs of one sequence are and what the queries ask: a few dozen numbers drawn
// from a generator seeded by (seed, index), so any slice can be generated on its own.
struct Plan {
  std::vector<int64_t> pair_starts;  // position of each PAIR marker, ascending
  std::vector<int32_t> keys;         // key token of each pair (distinct)
  std::vector<int32_t> values;       // value token of each pair
  std::vector<int> queried;          // pair asked by each query, in query order
};

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(const DataConfig& data, int64_t seq_len, uint64_t stream_seed)
      : vocab_(synthetic_vocab(data)),
        n_pairs_(data.n_pairs),
        n_queries_(data.n_queries),
        seq_len_(seq_len),
        query_begin_(seq_len - 3 * int64_t(data.n_queries)),
        stream_seed_(stream_seed) {
    // Pairs go in [1, plant_end_): at least room for them, at most up to the queries.
    int64_t plant_end = int64_t(data.plant_fraction * double(seq_len));
    plant_end_ = std::clamp<int64_t>(plant_end, 1 + 3 * int64_t(n_pairs_), query_begin_);
  }

  void read_slice(int64_t index, int64_t offset, int64_t length, int32_t* inputs,
                  int32_t* targets) override {
    if (index < 0 || offset < 0 || length < 0 || offset + length > seq_len_) {
      throw std::out_of_range("read_slice: sequence " + std::to_string(index) + ", tokens [" +
                              std::to_string(offset) + ", " + std::to_string(offset + length) +
                              ") of a sequence of " + std::to_string(seq_len_));
    }
    Plan plan = make_plan(index);
    for (int64_t i = 0; i < length; i++) {
      int64_t position = offset + i;
      inputs[i] = token_at(plan, index, position);
      targets[i] = target_at(plan, position);
    }
  }

  int64_t num_sequences() const override { return std::numeric_limits<int64_t>::max(); }
  bool has_answers() const override { return true; }
  std::vector<Query> queries(int64_t index) const override {
    const Plan plan = make_plan(index);
    std::vector<Query> result;
    for (int q = 0; q < n_queries_; ++q)
      // The key token follows the pair's marker; the query's key follows the query marker.
      result.push_back({query_begin_ + 3 * q + 1, plan.pair_starts[plan.queried[q]] + 1});
    return result;
  }

 private:
  Plan make_plan(int64_t index) const {
    SplitMix64 rng(hash_words(stream_seed_, uint64_t(index)));
    Plan plan;

    // Non-overlapping triples: n_pairs sorted gap offsets in [0, slack], the j-th triple
    // shifted by the 3·j tokens of the triples before it.
    int64_t slack = plant_end_ - 1 - 3 * int64_t(n_pairs_);
    for (int j = 0; j < n_pairs_; j++) plan.pair_starts.push_back(int64_t(rng.below(slack + 1)));
    std::sort(plan.pair_starts.begin(), plan.pair_starts.end());
    for (int j = 0; j < n_pairs_; j++) plan.pair_starts[j] += 1 + 3 * int64_t(j);

    // Distinct keys by Floyd's sampling (no table of all keys), then shuffled so the key
    // order along the sequence is random too.
    std::vector<int32_t> chosen;
    for (int candidate_limit = vocab_.n_keys - n_pairs_; candidate_limit < vocab_.n_keys;
         candidate_limit++) {
      int32_t key = int32_t(rng.below(uint64_t(candidate_limit) + 1));
      if (std::find(chosen.begin(), chosen.end(), key) != chosen.end()) key = candidate_limit;
      chosen.push_back(key);
    }
    for (int j = n_pairs_ - 1; j > 0; j--) std::swap(chosen[j], chosen[rng.below(j + 1)]);
    for (int j = 0; j < n_pairs_; j++) {
      plan.keys.push_back(vocab_.first_key() + chosen[j]);
      plan.values.push_back(vocab_.first_value() + int32_t(rng.below(vocab_.n_values)));
    }

    // Queries: the first n_queries of a random permutation of the pairs.
    std::vector<int> pairs(n_pairs_);
    for (int j = 0; j < n_pairs_; j++) pairs[j] = j;
    for (int q = 0; q < n_queries_; q++) {
      std::swap(pairs[q], pairs[q + rng.below(n_pairs_ - q)]);
      plan.queried.push_back(pairs[q]);
    }
    return plan;
  }

  int32_t token_at(const Plan& plan, int64_t index, int64_t position) const {
    if (position == 0) return SyntheticVocab::kBos;
    if (position >= query_begin_) {
      int64_t query = (position - query_begin_) / 3;
      int pair = plan.queried[query];
      switch ((position - query_begin_) % 3) {
        case 0:
          return SyntheticVocab::kQuery;
        case 1:
          return plan.keys[pair];
        default:
          return plan.values[pair];
      }
    }
    // The last triple starting at or before `position`, if it covers it.
    auto after = std::upper_bound(plan.pair_starts.begin(), plan.pair_starts.end(), position);
    if (after != plan.pair_starts.begin()) {
      int pair = int(after - plan.pair_starts.begin()) - 1;
      int64_t within = position - plan.pair_starts[pair];
      if (within == 0) return SyntheticVocab::kPair;
      if (within == 1) return plan.keys[pair];
      if (within == 2) return plan.values[pair];
    }
    uint64_t bits = hash_words(stream_seed_, uint64_t(index), uint64_t(position));
    return vocab_.first_filler() + int32_t(scale_to(bits, vocab_.n_filler));
  }

  // The answer is the target of the queried key: the value that follows it.
  int32_t target_at(const Plan& plan, int64_t position) const {
    if (position < query_begin_ || (position - query_begin_) % 3 != 1) return -1;
    return plan.values[plan.queried[(position - query_begin_) / 3]];
  }

  SyntheticVocab vocab_;
  int n_pairs_;
  int n_queries_;
  int64_t seq_len_;
  int64_t query_begin_;
  int64_t plant_end_ = 0;
  uint64_t stream_seed_;
};

// data.documents eos: data.documents_per_sequence passkey documents side by side, each a
// whole task of its own (BOS, its pairs, its queries) with its own keys; document d of
// sequence i is sequence i·k + d of a task of that document's length, so no two documents
// share a plan. The documents split the sequence evenly, the last one taking the remainder.
// With data.ask_previous_document, document d > 0 ends with document d−1's question triples
// (its own pairs stay planted): the answer lies only across a boundary, so a model that
// answers above chance sees through the document mask (tests/test_document_leakage.cpp).
class PackedSyntheticDataset : public Dataset {
 public:
  PackedSyntheticDataset(const DataConfig& data, int64_t seq_len, uint64_t stream_seed)
      : question_tokens_(3 * int64_t(data.n_queries)), ask_previous_(data.ask_previous_document) {
    const int64_t k = data.documents_per_sequence, length = seq_len / k;
    for (int64_t d = 0; d < k; ++d) {
      starts_.push_back(d * length);
      const int64_t doc_len = d + 1 < k ? length : seq_len - d * length;
      documents_.push_back(std::make_unique<SyntheticDataset>(data, doc_len, stream_seed));
    }
    starts_.push_back(seq_len);
  }

  void read_slice(int64_t index, int64_t offset, int64_t length, int32_t* inputs,
                  int32_t* targets) override {
    if (index < 0 || offset < 0 || length < 0 || offset + length > starts_.back())
      throw std::out_of_range("read_slice: sequence " + std::to_string(index) + ", tokens [" +
                              std::to_string(offset) + ", " + std::to_string(offset + length) +
                              ") of a sequence of " + std::to_string(starts_.back()));
    for (size_t d = 0; d < documents_.size(); ++d) {
      const int64_t first = std::max(offset, starts_[d]);
      const int64_t end = std::min(offset + length, starts_[d + 1]);
      if (first >= end) continue;
      documents_[d]->read_slice(document_index(index, d), first - starts_[d], end - first,
                                inputs + (first - offset), targets + (first - offset));
      if (ask_previous_ && d > 0)
        copy_previous_questions(index, d, first, end, inputs + (first - offset),
                                targets + (first - offset));
    }
  }

  int64_t num_sequences() const override { return std::numeric_limits<int64_t>::max(); }
  bool has_answers() const override { return true; }
  std::vector<Query> queries(int64_t index) const override {
    std::vector<Query> result;
    for (size_t d = 0; d < documents_.size(); ++d) {
      const std::vector<Query> own = documents_[d]->queries(document_index(index, d));
      if (!ask_previous_ || d == 0) {
        for (const Query& query : own)
          result.push_back({query.asked_at + starts_[d], query.key_at + starts_[d]});
        continue;
      }
      // Asked where this document asks, about a key planted in the previous document.
      const std::vector<Query> previous = documents_[d - 1]->queries(document_index(index, d - 1));
      for (size_t q = 0; q < own.size(); ++q)
        result.push_back({own[q].asked_at + starts_[d], previous[q].key_at + starts_[d - 1]});
    }
    return result;
  }
  bool has_documents() const override { return true; }
  std::vector<int64_t> document_starts(int64_t) override {
    return std::vector<int64_t>(starts_.begin(), starts_.end() - 1);
  }

 private:
  int64_t document_index(int64_t index, size_t d) const {
    return index * int64_t(documents_.size()) + int64_t(d);
  }

  // Overwrites the part of document d's question triples that lies in [first, end) (sequence
  // positions; inputs and targets start at first) with document d−1's: both end their
  // document, so triple q sits at the same distance from each document's end.
  void copy_previous_questions(int64_t index, size_t d, int64_t first, int64_t end, int32_t* inputs,
                               int32_t* targets) {
    const int64_t questions_begin = std::max(first, starts_[d + 1] - question_tokens_);
    if (questions_begin >= end) return;
    const int64_t shift = starts_[d + 1] - starts_[d];  // from document d's end to d−1's end
    const int64_t count = end - questions_begin;
    documents_[d - 1]->read_slice(
        document_index(index, d - 1), questions_begin - shift - starts_[d - 1], count,
        inputs + (questions_begin - first), targets + (questions_begin - first));
  }

  int64_t question_tokens_;  // 3 per query: QUERY, key, value
  bool ask_previous_;
  std::vector<int64_t> starts_;  // of each document, then the sequence length
  std::vector<std::unique_ptr<SyntheticDataset>> documents_;
};

void require(bool ok, const std::string& message) {
  if (!ok) throw DataError("data.source synthetic: " + message);
}

}  // namespace

SyntheticVocab synthetic_vocab(const DataConfig& data) {
  SyntheticVocab vocab;
  vocab.n_filler = data.n_filler;
  vocab.n_keys = data.n_keys;
  vocab.n_values = data.n_values;
  return vocab;
}

int64_t synthetic_min_seq_len(const DataConfig& data) {
  return 1 + 3 * (int64_t(data.n_pairs) + int64_t(data.n_queries));
}

std::unique_ptr<Dataset> make_synthetic_dataset(const DataConfig& data, Split split,
                                                int64_t seq_len, int vocab_size, uint64_t seed) {
  require(data.n_pairs >= 1, "data.n_pairs must be >= 1, got " + std::to_string(data.n_pairs));
  require(data.n_queries >= 1 && data.n_queries <= data.n_pairs,
          "data.n_queries must be between 1 and data.n_pairs = " + std::to_string(data.n_pairs) +
              ", got " + std::to_string(data.n_queries));
  require(data.n_keys >= data.n_pairs, "data.n_keys = " + std::to_string(data.n_keys) +
                                           " is fewer than the " + std::to_string(data.n_pairs) +
                                           " distinct keys data.n_pairs plants");
  require(data.n_values >= 1, "data.n_values must be >= 1, got " + std::to_string(data.n_values));
  require(data.n_filler >= 1, "data.n_filler must be >= 1, got " + std::to_string(data.n_filler));
  require(data.plant_fraction > 0.0 && data.plant_fraction <= 1.0,
          "data.plant_fraction must be in (0, 1], got " + std::to_string(data.plant_fraction));
  int needed_vocab = synthetic_vocab(data).size();
  require(vocab_size >= needed_vocab, "model.vocab_size = " + std::to_string(vocab_size) +
                                          " is smaller than the " + std::to_string(needed_vocab) +
                                          " tokens the task uses");
  int64_t min_len = synthetic_min_seq_len(data);
  // "synth" in ASCII: keeps the task's stream apart from other uses of the seed.
  uint64_t stream_seed = hash_words(seed, split == Split::train ? 1 : 2, 0x73796e7468ull);
  if (data.documents == DataDocuments::eos) {
    const int64_t k = data.documents_per_sequence;
    require(k >= 1 && seq_len / k >= min_len,
            "a sequence of " + std::to_string(seq_len) + " tokens cannot hold " +
                std::to_string(k) + " passkey documents (data.documents_per_sequence) of " +
                std::to_string(min_len) + " tokens or more (BOS, " + std::to_string(data.n_pairs) +
                " pairs and " + std::to_string(data.n_queries) + " queries): it needs at least " +
                std::to_string(k * min_len));
    return std::make_unique<PackedSyntheticDataset>(data, seq_len, stream_seed);
  }
  require(seq_len >= min_len,
          "a sequence of " + std::to_string(seq_len) + " tokens cannot hold BOS, " +
              std::to_string(data.n_pairs) + " pairs and " + std::to_string(data.n_queries) +
              " queries (3 tokens each): it needs at least " + std::to_string(min_len));
  return std::make_unique<SyntheticDataset>(data, seq_len, stream_seed);
}

}  // namespace ulysses
