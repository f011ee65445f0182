#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/input_file.h"
#include "data/synthetic.h"
#include "data/token_stream.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;
using testing::write_text_file;

struct Sequence {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  bool operator==(const Sequence&) const = default;
};

Sequence read_range(Dataset& dataset, int64_t index, int64_t offset, int64_t length) {
  Sequence s{std::vector<int32_t>(length), std::vector<int32_t>(length)};
  dataset.read_slice(index, offset, length, s.inputs.data(), s.targets.data());
  return s;
}

// The sequence assembled from consecutive slices with the given boundaries.
Sequence read_in_slices(Dataset& dataset, int64_t index, const std::vector<int64_t>& bounds) {
  Sequence whole;
  for (size_t i = 0; i + 1 < bounds.size(); i++) {
    Sequence part = read_range(dataset, index, bounds[i], bounds[i + 1] - bounds[i]);
    whole.inputs.insert(whole.inputs.end(), part.inputs.begin(), part.inputs.end());
    whole.targets.insert(whole.targets.end(), part.targets.begin(), part.targets.end());
  }
  return whole;
}

template <typename Fn>
std::string data_error_message(Fn&& fn) {
  try {
    fn();
  } catch (const DataError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a DataError";
  return "";
}

// ---- synthetic ------------------------------------------------------------------------

DataConfig synthetic_config() {
  DataConfig data;
  data.source = DataSource::synthetic;
  return data;
}

TEST(SyntheticData, VocabularyIsSpecialsFillerKeysValues) {
  DataConfig data = synthetic_config();
  data.n_filler = 5;
  data.n_keys = 7;
  data.n_values = 11;
  EXPECT_EQ(default_vocab_size(data), 3 + 5 + 7 + 11);
  SyntheticVocab vocab = synthetic_vocab(data);
  EXPECT_EQ(vocab.first_filler(), 3);
  EXPECT_EQ(vocab.first_key(), 8);
  EXPECT_EQ(vocab.first_value(), 15);
}

TEST(SyntheticData, SlicesConcatenateToTheWholeSequence) {
  DataConfig data = synthetic_config();
  const int64_t seq_len = 240;
  auto dataset = make_dataset(data, Split::train, seq_len, default_vocab_size(data), 7);
  const std::vector<std::vector<int64_t>> slicings = {{0, 120, 240},
                                                      {0, 60, 120, 180, 240},
                                                      {0, 30, 60, 90, 120, 150, 180, 210, 240},
                                                      {0, 1, 2, 239, 240},
                                                      {0, 77, 78, 200, 240}};
  for (int64_t index : {0, 1, 5, 123456789}) {
    Sequence whole = read_range(*dataset, index, 0, seq_len);
    for (const auto& bounds : slicings) {
      EXPECT_EQ(read_in_slices(*dataset, index, bounds), whole)
          << "index " << index << ", " << bounds.size() - 1 << " slices";
    }
  }
}

TEST(SyntheticData, AnswersSitAtQueriedKeysAndMatchThePlantedValue) {
  DataConfig data = synthetic_config();
  data.n_pairs = 6;
  data.n_queries = 3;
  const int64_t seq_len = 300;
  SyntheticVocab vocab = synthetic_vocab(data);
  auto dataset = make_dataset(data, Split::train, seq_len, vocab.size(), 11);
  EXPECT_TRUE(dataset->has_answers());
  const int64_t query_begin = seq_len - 3 * data.n_queries;
  const int64_t plant_end = int64_t(data.plant_fraction * seq_len);

  for (int64_t index = 0; index < 50; index++) {
    Sequence s = read_range(*dataset, index, 0, seq_len);
    ASSERT_EQ(s.inputs[0], SyntheticVocab::kBos);

    // The planted pairs: every PAIR marker in the body, followed by a key and a value.
    std::map<int32_t, int32_t> planted;
    for (int64_t p = 1; p < query_begin; p++) {
      if (s.inputs[p] != SyntheticVocab::kPair) {
        EXPECT_GE(s.inputs[p], vocab.first_filler()) << "position " << p;
        continue;
      }
      ASSERT_LT(p + 2, plant_end) << "pair planted outside the plant region";
      ASSERT_TRUE(vocab.is_key(s.inputs[p + 1]));
      ASSERT_TRUE(vocab.is_value(s.inputs[p + 2]));
      EXPECT_EQ(planted.count(s.inputs[p + 1]), 0u) << "key planted twice";
      planted[s.inputs[p + 1]] = s.inputs[p + 2];
      p += 2;
    }
    EXPECT_EQ(int(planted.size()), data.n_pairs) << "index " << index;

    int answers = 0;
    std::set<int32_t> asked;
    for (int64_t p = 0; p < seq_len; p++) {
      if (s.targets[p] == -1) continue;
      answers++;
      ASSERT_GE(p, query_begin);
      EXPECT_EQ((p - query_begin) % 3, 1);
      EXPECT_EQ(s.inputs[p - 1], SyntheticVocab::kQuery);
      int32_t key = s.inputs[p];
      ASSERT_TRUE(planted.count(key)) << "queried key " << key << " was never planted";
      EXPECT_EQ(s.targets[p], planted[key]);
      if (p + 1 < seq_len) {
        EXPECT_EQ(s.inputs[p + 1], s.targets[p]);
      }
      asked.insert(key);
    }
    EXPECT_EQ(answers, data.n_queries);
    EXPECT_EQ(int(asked.size()), data.n_queries) << "queries repeat a key";
  }
}

TEST(SyntheticData, PlantingVariesAcrossSequences) {
  DataConfig data = synthetic_config();
  const int64_t seq_len = 200;
  auto dataset = make_dataset(data, Split::train, seq_len, default_vocab_size(data), 3);
  std::set<int64_t> first_pair_positions;
  for (int64_t index = 0; index < 40; index++) {
    Sequence s = read_range(*dataset, index, 0, seq_len);
    auto first = std::find(s.inputs.begin(), s.inputs.end(), SyntheticVocab::kPair);
    first_pair_positions.insert(first - s.inputs.begin());
  }
  EXPECT_GT(first_pair_positions.size(), 10u);
}

TEST(SyntheticData, DeterministicAndDependsOnSeedSplitAndIndex) {
  DataConfig data = synthetic_config();
  const int64_t seq_len = 128;
  const int vocab = default_vocab_size(data);
  auto a = make_dataset(data, Split::train, seq_len, vocab, 42);
  auto b = make_dataset(data, Split::train, seq_len, vocab, 42);
  auto other_seed = make_dataset(data, Split::train, seq_len, vocab, 43);
  auto val = make_dataset(data, Split::val, seq_len, vocab, 42);
  Sequence reference = read_range(*a, 9, 0, seq_len);
  EXPECT_EQ(read_range(*b, 9, 0, seq_len), reference);
  EXPECT_EQ(read_range(*a, 9, 0, seq_len), reference);
  EXPECT_NE(read_range(*other_seed, 9, 0, seq_len), reference);
  EXPECT_NE(read_range(*val, 9, 0, seq_len), reference);
  EXPECT_NE(read_range(*a, 10, 0, seq_len), reference);
}

TEST(SyntheticData, RejectsSequencesTooShortAndSmallVocabularies) {
  DataConfig data = synthetic_config();
  data.n_pairs = 4;
  data.n_queries = 4;
  const int vocab = default_vocab_size(data);
  // BOS + 3·(4 + 4) = 25 tokens fit exactly; 24 do not.
  EXPECT_NO_THROW(make_dataset(data, Split::train, 25, vocab, 1));
  std::string message = data_error_message([&] { make_dataset(data, Split::train, 24, vocab, 1); });
  EXPECT_NE(message.find("25"), std::string::npos) << message;
  message = data_error_message([&] { make_dataset(data, Split::train, 64, vocab - 1, 1); });
  EXPECT_NE(message.find("vocab_size"), std::string::npos) << message;
  data.n_queries = 5;
  message = data_error_message([&] { make_dataset(data, Split::train, 64, vocab, 1); });
  EXPECT_NE(message.find("n_queries"), std::string::npos) << message;
}

TEST(SyntheticData, ShortestSequenceIsValid) {
  DataConfig data = synthetic_config();
  data.n_pairs = 2;
  data.n_queries = 2;
  const int64_t seq_len = synthetic_min_seq_len(data);
  auto dataset = make_dataset(data, Split::train, seq_len, default_vocab_size(data), 5);
  Sequence s = read_range(*dataset, 0, 0, seq_len);
  EXPECT_EQ(s.inputs[0], SyntheticVocab::kBos);
  EXPECT_EQ(s.inputs[1], SyntheticVocab::kPair);
  EXPECT_EQ(s.inputs[4], SyntheticVocab::kPair);
  EXPECT_EQ(s.inputs[7], SyntheticVocab::kQuery);
}

// ---- text -----------------------------------------------------------------------------

DataConfig text_config(const std::string& path, double val_fraction) {
  DataConfig data;
  data.source = DataSource::text;
  data.path = path;
  data.val_fraction = val_fraction;
  return data;
}

std::vector<int32_t> bytes_of(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());
}

// Reads sequences [first, first + count) whole and returns the stream position each
// starts at, found by matching against the expected stream.
std::vector<int64_t> sequence_starts(Dataset& dataset, const std::vector<int32_t>& stream,
                                     int64_t seq_len, int64_t first, int64_t count) {
  std::vector<int64_t> starts;
  for (int64_t index = first; index < first + count; index++) {
    Sequence s = read_range(dataset, index, 0, seq_len);
    int64_t found = -1;
    for (int64_t start = 0; start + seq_len < int64_t(stream.size()); start += seq_len) {
      bool inputs_match = std::equal(s.inputs.begin(), s.inputs.end(), stream.begin() + start);
      bool targets_match =
          std::equal(s.targets.begin(), s.targets.end(), stream.begin() + start + 1);
      if (inputs_match && targets_match) {
        found = start;
        break;
      }
    }
    EXPECT_GE(found, 0) << "sequence " << index << " is not a window of the stream";
    starts.push_back(found);
  }
  return starts;
}

TEST(TextData, PacksFilesInOrderWithEndOfDocumentBetween) {
  TempDir dir;
  write_text_file(dir.file("b.txt"), "world!");
  write_text_file(dir.file("a.txt"), "hello");
  write_text_file(dir.file("c.txt"), "");  // empty documents are skipped
  std::vector<int32_t> expected = bytes_of("hello");
  expected.push_back(kEndOfDocument);
  for (int32_t byte : bytes_of("world!")) expected.push_back(byte);
  expected.push_back(kEndOfDocument);

  TokenStream stream = TokenStream::from_text_files(resolve_data_files(dir.path(), "data.path"));
  ASSERT_EQ(stream.size(), int64_t(expected.size()));
  std::vector<int32_t> tokens(expected.size());
  stream.read(0, stream.size(), tokens.data());
  EXPECT_EQ(tokens, expected);

  // Sequences of 4: starts 0, 4, 8 (each reads 5 tokens of the 13).
  DataConfig data = text_config(dir.path(), 0.0);
  EXPECT_EQ(default_vocab_size(data), 257);
  auto dataset = make_dataset(data, Split::train, 4, 257, 1);
  ASSERT_EQ(dataset->num_sequences(), 3);
  std::vector<int64_t> starts = sequence_starts(*dataset, expected, 4, 0, 3);
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 4, 8}));
}

TEST(TextData, FolderGlobAndFileResolveToTheSameSortedFiles) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("sub"));
  write_text_file(dir.file("sub/b.txt"), "b");
  write_text_file(dir.file("a.txt"), "a");
  write_text_file(dir.file(".hidden"), "h");
  EXPECT_EQ(resolve_data_files(dir.path(), "data.path"),
            (std::vector<std::string>{dir.file("a.txt"), dir.file("sub/b.txt")}));
  EXPECT_EQ(resolve_data_files(dir.file("*/*.txt"), "data.path"),
            (std::vector<std::string>{dir.file("sub/b.txt")}));
  EXPECT_EQ(resolve_data_files(dir.file("a.txt"), "data.path"),
            (std::vector<std::string>{dir.file("a.txt")}));
  std::string message =
      data_error_message([&] { resolve_data_files(dir.file("*.bin"), "data.path"); });
  EXPECT_NE(message.find("*.bin"), std::string::npos) << message;
  message = data_error_message([&] { resolve_data_files(dir.file("nope.txt"), "data.path"); });
  EXPECT_NE(message.find("nope.txt"), std::string::npos) << message;
}

TEST(TextData, SlicesConcatenateToTheWholeSequence) {
  TempDir dir;
  std::mt19937 rng(3);
  std::string text(3000, ' ');
  for (char& c : text) c = char(rng() % 256);
  write_text_file(dir.file("corpus.bin"), text);
  auto dataset = make_dataset(text_config(dir.file("corpus.bin"), 0.1), Split::train, 64, 257, 2);
  for (int64_t index : {0, 3, 17, 1000}) {
    Sequence whole = read_range(*dataset, index, 0, 64);
    EXPECT_EQ(read_in_slices(*dataset, index, {0, 16, 32, 48, 64}), whole);
    EXPECT_EQ(read_in_slices(*dataset, index, {0, 1, 63, 64}), whole);
  }
}

TEST(TextData, ValidationTailIsDisjointFromTraining) {
  TempDir dir;
  std::mt19937 rng(5);
  std::string text(999, ' ');
  for (char& c : text) c = char(rng() % 256);
  write_text_file(dir.file("corpus.bin"), text);
  std::vector<int32_t> stream = bytes_of(text);
  for (int32_t& token : stream) token &= 0xff;
  stream.push_back(kEndOfDocument);  // 1000 tokens: 800 train, 200 val

  const int64_t seq_len = 16;
  DataConfig data = text_config(dir.file("corpus.bin"), 0.2);
  auto train = make_dataset(data, Split::train, seq_len, 257, 9);
  auto val = make_dataset(data, Split::val, seq_len, 257, 9);
  EXPECT_EQ(train->num_sequences(), (800 - 1) / seq_len);
  EXPECT_EQ(val->num_sequences(), (200 - 1) / seq_len);
  for (int64_t start : sequence_starts(*train, stream, seq_len, 0, train->num_sequences())) {
    EXPECT_LT(start + seq_len, 800) << "train reads validation tokens";
  }
  // Validation windows start at 800 + k·seq_len.
  std::vector<int64_t> val_starts =
      sequence_starts(*val, std::vector<int32_t>(stream.begin() + 800, stream.end()), seq_len, 0,
                      val->num_sequences());
  std::sort(val_starts.begin(), val_starts.end());
  for (size_t k = 0; k < val_starts.size(); k++) EXPECT_EQ(val_starts[k], int64_t(k) * seq_len);
}

TEST(TextData, SeparateValidationPath) {
  TempDir dir;
  write_text_file(dir.file("train.txt"), std::string(100, 't'));
  write_text_file(dir.file("val.txt"), std::string(50, 'v'));
  DataConfig data = text_config(dir.file("train.txt"), 0.5);
  data.val_path = dir.file("val.txt");
  auto train = make_dataset(data, Split::train, 10, 257, 1);
  auto val = make_dataset(data, Split::val, 10, 257, 1);
  EXPECT_EQ(train->num_sequences(), 10);  // all 101 tokens: val_fraction is ignored
  EXPECT_EQ(val->num_sequences(), 5);
  EXPECT_EQ(read_range(*val, 2, 0, 10).inputs, std::vector<int32_t>(10, 'v'));
}

TEST(TextData, EveryEpochVisitsEverySequenceInANewOrder) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 64 * 20; i++) text += char('a' + (i / 64) % 26);
  write_text_file(dir.file("c.txt"), text);
  auto dataset = make_dataset(text_config(dir.file("c.txt"), 0.0), Split::train, 64, 257, 4);
  const int64_t n = dataset->num_sequences();
  ASSERT_EQ(n, 20);
  std::vector<int32_t> epoch0, epoch1, epoch3;
  for (int64_t i = 0; i < n; i++) {
    epoch0.push_back(read_range(*dataset, i, 0, 64).inputs[0]);
    epoch1.push_back(read_range(*dataset, n + i, 0, 64).inputs[0]);
    epoch3.push_back(read_range(*dataset, 3 * n + i, 0, 64).inputs[0]);
  }
  std::vector<int32_t> all;
  for (int i = 0; i < 20; i++) all.push_back('a' + i);
  for (auto* epoch : {&epoch0, &epoch1, &epoch3}) {
    std::vector<int32_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all);
  }
  EXPECT_NE(epoch0, all) << "the first epoch is not shuffled";
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch1, epoch3);
  auto again = make_dataset(text_config(dir.file("c.txt"), 0.0), Split::train, 64, 257, 4);
  EXPECT_EQ(read_range(*again, n + 7, 0, 64), read_range(*dataset, n + 7, 0, 64));
}

TEST(TextData, SequentialOrderReadsSequencesInTheirPlaceEveryEpoch) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 64 * 20; i++) text += char('a' + (i / 64) % 26);
  write_text_file(dir.file("c.txt"), text);
  DataConfig data = text_config(dir.file("c.txt"), 0.0);
  data.order = DataOrder::sequential;
  auto dataset = make_dataset(data, Split::train, 64, 257, 4);
  const int64_t n = dataset->num_sequences();
  ASSERT_EQ(n, 20);
  for (int64_t epoch : {0, 1, 5}) {
    for (int64_t i = 0; i < n; i++) {
      EXPECT_EQ(read_range(*dataset, epoch * n + i, 0, 64).inputs[0], 'a' + i)
          << "epoch " << epoch << ", sequence " << i;
    }
  }
  // The seed does not matter in order.
  auto other_seed = make_dataset(data, Split::train, 64, 257, 99);
  EXPECT_EQ(read_range(*other_seed, 3, 0, 64), read_range(*dataset, 3, 0, 64));
}

TEST(TextData, TooSmallCorpusNamesTheSizes) {
  TempDir dir;
  write_text_file(dir.file("tiny.txt"), std::string(99, 'x'));  // 100 tokens
  std::string message = data_error_message(
      [&] { make_dataset(text_config(dir.file("tiny.txt"), 0.1), Split::val, 32, 257, 1); });
  EXPECT_NE(message.find("100 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("33"), std::string::npos) << message;
  EXPECT_NE(message.find("tiny.txt"), std::string::npos) << message;
  message = data_error_message(
      [&] { make_dataset(text_config(dir.file("tiny.txt"), 0.0), Split::val, 32, 257, 1); });
  EXPECT_NE(message.find("val_path"), std::string::npos) << message;
  message = data_error_message(
      [&] { make_dataset(text_config(dir.file("missing.txt"), 0.0), Split::train, 8, 257, 1); });
  EXPECT_NE(message.find("missing.txt"), std::string::npos) << message;
}

// ---- tokens ---------------------------------------------------------------------------

DataConfig tokens_config(const std::string& path) {
  DataConfig data;
  data.source = DataSource::tokens;
  data.path = path;
  data.val_fraction = 0.0;
  return data;
}

void patch_header(const std::string& path, int slot, int32_t value) {
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekp(slot * 4);
  file.write(reinterpret_cast<const char*>(&value), 4);
}

TEST(TokenData, Uint16AndUint32ShardsRoundTrip) {
  TempDir dir;
  std::vector<int32_t> first = {1, 2, 3, 65535, 0, 7};
  std::vector<int32_t> second = {65536, 99999, 5, 70000};
  write_token_shard(dir.file("shard_000.bin"), first, 1);
  write_token_shard(dir.file("shard_001.bin"), second, 2);
  EXPECT_EQ(std::filesystem::file_size(dir.file("shard_000.bin")), 1024u + 2 * first.size());
  EXPECT_EQ(std::filesystem::file_size(dir.file("shard_001.bin")), 1024u + 4 * second.size());

  std::vector<int32_t> expected = first;
  expected.insert(expected.end(), second.begin(), second.end());
  TokenStream stream = TokenStream::from_token_shards(
      resolve_data_files(dir.file("shard_*.bin"), "data.path"), 100000);
  ASSERT_EQ(stream.size(), int64_t(expected.size()));
  std::vector<int32_t> tokens(expected.size());
  stream.read(0, stream.size(), tokens.data());
  EXPECT_EQ(tokens, expected);

  DataConfig data = tokens_config(dir.file("shard_*.bin"));
  EXPECT_EQ(default_vocab_size(data), 0);
  auto dataset = make_dataset(data, Split::train, 3, 100000, 1);
  std::vector<int64_t> starts = sequence_starts(*dataset, expected, 3, 0, 3);
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(read_in_slices(*dataset, 1, {0, 1, 3}), read_range(*dataset, 1, 0, 3));
}

TEST(TokenData, MalformedShardsNameTheFileAndTheProblem) {
  TempDir dir;
  std::vector<int32_t> tokens(100, 3);
  struct Case {
    std::string name;
    std::string expected;
    void (*damage)(const std::string& path);
  };
  const std::vector<Case> cases = {
      {"magic.bin", "magic", [](const std::string& p) { patch_header(p, 0, 12345); }},
      {"version.bin", "version 7", [](const std::string& p) { patch_header(p, 1, 7); }},
      {"truncated.bin", "truncated",
       [](const std::string& p) { std::filesystem::resize_file(p, 1024 + 2 * 99); }},
      {"oversized.bin", "oversized",
       [](const std::string& p) { std::filesystem::resize_file(p, 1024 + 2 * 101); }},
      {"short_header.bin", "truncated",
       [](const std::string& p) { std::filesystem::resize_file(p, 100); }},
      {"count.bin", "truncated", [](const std::string& p) { patch_header(p, 2, 1000); }},
  };
  for (const Case& c : cases) {
    std::string path = dir.file(c.name);
    write_token_shard(path, tokens, 1);
    c.damage(path);
    std::string message =
        data_error_message([&] { make_dataset(tokens_config(path), Split::train, 8, 50, 1); });
    EXPECT_NE(message.find(c.name), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

// Data that changes under a running job ends it with an error naming the file and both
// sizes; it is never memory-mapped, so a shrinking file cannot raise SIGBUS.
TEST(TokenData, ShardThatChangesDuringTheRunIsAnErrorNamingItAndBothSizes) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, std::vector<int32_t>(5000, 3), 1);
  auto dataset = make_dataset(tokens_config(path), Split::train, 64, 50, 1);
  std::vector<int32_t> inputs(64), targets(64);
  dataset->read_slice(0, 0, 64, inputs.data(), targets.data());
  const std::string was = std::to_string(1024 + 2 * 5000) + " bytes when the run started";

  std::filesystem::resize_file(path, 3000);
  std::string message =
      data_error_message([&] { dataset->read_slice(1, 0, 64, inputs.data(), targets.data()); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(was + ", now 3000"), std::string::npos) << message;

  std::filesystem::remove(path);
  message =
      data_error_message([&] { dataset->read_slice(2, 0, 64, inputs.data(), targets.data()); });
  EXPECT_NE(message.find(was + ", and now '" + path + "' does not exist"), std::string::npos)
      << message;
}

TEST(TextData, FileThatGrowsDuringTheRunIsAnError) {
  TempDir dir;
  const std::string path = dir.file("a.txt");
  write_text_file(path, std::string(4000, 'x'));
  DataConfig config;
  config.source = DataSource::text;
  config.path = path;
  auto dataset = make_dataset(config, Split::train, 64, 257, 1);
  std::vector<int32_t> inputs(64), targets(64);
  dataset->read_slice(0, 0, 64, inputs.data(), targets.data());
  write_text_file(path, std::string(5000, 'x'));
  const std::string message =
      data_error_message([&] { dataset->read_slice(1, 0, 64, inputs.data(), targets.data()); });
  EXPECT_NE(message.find("4000 bytes when the run started, now 5000"), std::string::npos)
      << message;
}

TEST(TokenData, MissingFilesAndEmptyGlobsAreErrors) {
  TempDir dir;
  std::string message = data_error_message(
      [&] { make_dataset(tokens_config(dir.file("absent.bin")), Split::train, 8, 50, 1); });
  EXPECT_NE(message.find("absent.bin"), std::string::npos) << message;
  message = data_error_message(
      [&] { make_dataset(tokens_config(dir.file("train_*.bin")), Split::train, 8, 50, 1); });
  EXPECT_NE(message.find("train_*.bin"), std::string::npos) << message;
}

// Every file a run reads goes through InputFile: a FIFO with no writer used to block open(2)
// forever, and a symbolic link loop was reported as a path that does not exist.
TEST(InputFile, RefusesWhatIsNotARegularFileWithoutBlockingAndNamesIt) {
  TempDir dir;
  ASSERT_EQ(mkfifo(dir.file("fifo").c_str(), 0600), 0);
  std::filesystem::create_symlink("loop", dir.file("loop"));
  std::filesystem::create_symlink(dir.file("nowhere"), dir.file("dangling"));
  write_text_file(dir.file("text"), "abc");
  const std::pair<std::string, std::string> refused[] = {
      {dir.file("fifo"), "is a FIFO (named pipe), not a regular file"},
      {dir.file("loop"), "is a symbolic link loop (too many levels of symbolic links)"},
      {dir.file("dangling"), "is a symbolic link to a path that does not exist"},
      {dir.file("missing"), "does not exist"},
      {dir.file("text/below"), "does not exist (a part of the path is a file, not a folder)"},
      {dir.path(), "is a folder, not a file"},
      {"/dev/null", "is a character device, not a regular file"},
  };
  for (const auto& [path, problem] : refused) {
    InputFile file(path);
    EXPECT_FALSE(file.is_open()) << path;
    EXPECT_EQ(file.problem(), "'" + path + "' " + problem);
    EXPECT_EQ(input_file_problem(path), file.problem());
  }
  InputFile text(dir.file("text"));
  std::string content;
  ASSERT_TRUE(text.read_all(content)) << text.problem();
  EXPECT_EQ(content, "abc");
  EXPECT_EQ(text.size(), 3);
  EXPECT_EQ(input_folder_problem(dir.path()), "");
  EXPECT_EQ(input_folder_problem(dir.file("text")),
            "'" + dir.file("text") + "' is a file, not a folder");
  EXPECT_EQ(
      input_folder_problem(dir.file("loop")),
      "'" + dir.file("loop") + "' is a symbolic link loop (too many levels of symbolic links)");
}

TEST(TokenData, DataPathsThatAreNotRegularFilesAreNamedAsWhatTheyAre) {
  TempDir dir;
  ASSERT_EQ(mkfifo(dir.file("fifo.bin").c_str(), 0600), 0);
  std::filesystem::create_symlink("loop.bin", dir.file("loop.bin"));
  auto message = [](const std::string& path) {
    try {
      resolve_data_files(path, "data.path");
    } catch (const DataError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(dir.file("fifo.bin")),
            "data.path: '" + dir.file("fifo.bin") + "' is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(message(dir.file("loop.bin")), "data.path: '" + dir.file("loop.bin") +
                                               "' is a symbolic link loop (too many levels of "
                                               "symbolic links)");
  // In a folder, what is not a regular file is not data: the folder's files are.
  write_token_shard(dir.file("shard.bin"), std::vector<int32_t>(10, 1), 1);
  EXPECT_EQ(resolve_data_files(dir.path(), "data.path"),
            std::vector<std::string>{dir.file("shard.bin")});
}

TEST(TokenData, TokenAboveVocabularyIsReportedWhenItsSliceIsRead) {
  TempDir dir;
  std::vector<int32_t> tokens(40, 1);
  tokens[25] = 300;
  write_token_shard(dir.file("bad.bin"), tokens, 1);
  auto dataset = make_dataset(tokens_config(dir.file("bad.bin")), Split::train, 39, 256, 1);
  // The slice before the bad token reads fine: only what a slice needs is read.
  std::vector<int32_t> inputs(39), targets(39);
  EXPECT_NO_THROW(dataset->read_slice(0, 0, 20, inputs.data(), targets.data()));
  std::string message =
      data_error_message([&] { dataset->read_slice(0, 20, 19, inputs.data(), targets.data()); });
  EXPECT_NE(message.find("bad.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("position 25"), std::string::npos) << message;
  EXPECT_NE(message.find("300"), std::string::npos) << message;
}

TEST(TokenData, ShardsPastFourGibibytesUseSixtyFourBitOffsets) {
  TempDir dir;
  std::string path = dir.file("huge.bin");
  const int64_t count = 1'500'000'000;  // uint32 tokens: a 6 GB sparse file
  write_token_shard(path, {}, 2);
  patch_header(path, 2, int32_t(count));
  std::filesystem::resize_file(path, 1024 + 4 * count);
  const uint32_t last_tokens[3] = {11, 22, 33};
  {
    std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(1024 + 4 * (count - 3));
    file.write(reinterpret_cast<const char*>(last_tokens), sizeof(last_tokens));
  }
  TokenStream stream = TokenStream::from_token_shards({path}, 64);
  ASSERT_EQ(stream.size(), count);
  std::vector<int32_t> tokens(4);
  stream.read(count - 4, 4, tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0, 11, 22, 33}));
}

}  // namespace
}  // namespace ulysses
