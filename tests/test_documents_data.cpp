// data.documents eos (docs/parallelism.md, "Packed documents"): token shards and text are cut
// after each end-of-text token (text also after a blank line) and packed into the same
// windows as without documents; a document's last token has no target; the synthetic task
// packs passkey documents with their own keys; and a micro-batch of a length sp does not
// divide is padded, the padding unscored and a document of its own.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/train/evaluate.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "data/token_stream.h"
#include "parallel/sequence_padding.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;
using testing::write_text_file;

struct Window {
  std::vector<int32_t> inputs, targets;
};

Window read_window(Dataset& dataset, int64_t index, int64_t seq_len) {
  Window w{std::vector<int32_t>(static_cast<size_t>(seq_len)),
           std::vector<int32_t>(static_cast<size_t>(seq_len))};
  dataset.read_slice(index, 0, seq_len, w.inputs.data(), w.targets.data());
  return w;
}

DataConfig tokens_config(const std::string& path, DataDocuments documents, int eos_id) {
  DataConfig data;
  data.source = DataSource::tokens;
  data.path = path;
  data.val_fraction = 0.0;
  data.order = DataOrder::sequential;
  data.documents = documents;
  data.eos_id = eos_id;
  return data;
}

TEST(DocumentData, TokenShardsAreCutAfterEachEndOfText) {
  TempDir dir;
  // eos = 9: documents [5 6 9] [7 9] [1 2 3 4 9] [8 8 ...
  const std::vector<int32_t> stream = {5, 6, 9, 7, 9, 1, 2, 3, 4, 9, 8, 8, 8};
  write_token_shard(dir.file("shard.bin"), stream, 1);
  auto none = make_dataset(tokens_config(dir.file("shard.bin"), DataDocuments::none, -1),
                           Split::train, 6, 20, 1);
  auto eos = make_dataset(tokens_config(dir.file("shard.bin"), DataDocuments::eos, 9), Split::train,
                          6, 20, 1);
  EXPECT_FALSE(none->has_documents());
  ASSERT_TRUE(eos->has_documents());
  // Window 0 is tokens [0, 6), window 1 [6, 12): the same windows as without documents.
  const Window plain0 = read_window(*none, 0, 6), packed0 = read_window(*eos, 0, 6);
  EXPECT_EQ(packed0.inputs, plain0.inputs);
  EXPECT_EQ(packed0.targets, (std::vector<int32_t>{6, 9, -1, 9, -1, 2}));
  EXPECT_EQ(eos->document_starts(0), (std::vector<int64_t>{0, 3, 5}));
  // Window 1 begins inside the document [1 2 3 4 9]: its rest is the window's first document.
  EXPECT_EQ(read_window(*eos, 1, 6).targets, (std::vector<int32_t>{3, 4, 9, -1, 8, 8}));
  EXPECT_EQ(eos->document_starts(1), (std::vector<int64_t>{0, 4}));
  // A slice sees the same targets as the whole window.
  std::vector<int32_t> inputs(2), targets(2);
  eos->read_slice(0, 2, 2, inputs.data(), targets.data());
  EXPECT_EQ(targets, (std::vector<int32_t>{-1, 9}));
}

TEST(DocumentData, TextIsCutAtFileEndsAndBlankLines) {
  TempDir dir;
  write_text_file(dir.file("a.txt"), "ab\n\ncd");
  write_text_file(dir.file("b.txt"), "ef");
  DataConfig data;
  data.source = DataSource::text;
  data.path = dir.path();
  data.val_fraction = 0.0;
  data.order = DataOrder::sequential;
  data.documents = DataDocuments::eos;
  // Stream: a b \n \n c d <eod> e f <eod>; documents "ab\n\n", "cd<eod>", "ef<eod>".
  auto dataset = make_dataset(data, Split::train, 9, kTextVocabSize, 1);
  EXPECT_EQ(dataset->document_starts(0), (std::vector<int64_t>{0, 4, 7}));
  const Window w = read_window(*dataset, 0, 9);
  EXPECT_EQ(w.targets[3], -1);  // the blank line's second newline
  EXPECT_EQ(w.targets[6], -1);  // end of the first file
  EXPECT_EQ(w.targets[2], '\n');
  EXPECT_EQ(w.targets[4], 'd');
}

TEST(DocumentData, AnEndOfTextOutsideTheVocabularyIsRefused) {
  TempDir dir;
  write_token_shard(dir.file("shard.bin"), {1, 2, 3, 4, 5}, 1);
  try {
    make_dataset(tokens_config(dir.file("shard.bin"), DataDocuments::eos, -1), Split::train, 2, 100,
                 1);
    ADD_FAILURE() << "GPT-2's end of text 50256 accepted with a vocabulary of 100";
  } catch (const DataError& error) {
    EXPECT_EQ(std::string(error.what()),
              "data.documents eos: the end-of-text token 50256 (the source's default) is not "
              "below model.vocab_size = 100; set data.eos_id to your tokenizer's end-of-text id");
  }
}

TEST(DocumentData, SyntheticPacksPasskeyDocumentsWithTheirOwnKeys) {
  DataConfig data;
  data.documents = DataDocuments::eos;
  data.documents_per_sequence = 3;
  data.n_pairs = 2;
  data.n_queries = 2;
  const int64_t seq_len = 100;  // documents of 33, 33 and 34 tokens
  auto dataset = make_dataset(data, Split::train, seq_len, default_vocab_size(data), 3);
  ASSERT_TRUE(dataset->has_documents());
  const std::vector<int64_t> starts = dataset->document_starts(7);
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 33, 66}));
  const Window w = read_window(*dataset, 7, seq_len);
  std::set<std::vector<int32_t>> documents;
  for (size_t d = 0; d < starts.size(); ++d) {
    const int64_t end = d + 1 < starts.size() ? starts[d + 1] : seq_len;
    EXPECT_EQ(w.inputs[size_t(starts[d])], SyntheticVocab::kBos);
    documents.insert(std::vector<int32_t>(w.inputs.begin() + starts[d], w.inputs.begin() + end));
  }
  EXPECT_EQ(documents.size(), 3u) << "the documents share a plan";
  // Every query asks for a key planted in its own document, and is answered there.
  const std::vector<Dataset::Query> queries = dataset->queries(7);
  ASSERT_EQ(queries.size(), 6u);
  for (const Dataset::Query& query : queries) {
    EXPECT_EQ(document_start(starts, query.asked_at), document_start(starts, query.key_at));
    EXPECT_EQ(w.inputs[size_t(query.asked_at)], w.inputs[size_t(query.key_at)]);
    EXPECT_EQ(w.targets[size_t(query.asked_at)], w.inputs[size_t(query.key_at + 1)]);
  }
}

// The leakage probe: each document after the first asks the previous one's questions, read
// in any slices; its own pairs and BOS stay, and the answers lie across a boundary only.
TEST(DocumentData, AskPreviousDocumentAsksAcrossTheBoundaryInAnySlices) {
  DataConfig data;
  data.documents = DataDocuments::eos;
  data.documents_per_sequence = 3;
  data.n_pairs = 2;
  data.n_queries = 2;
  data.ask_previous_document = true;
  const int64_t seq_len = 100;  // documents of 33, 33 and 34 tokens
  auto dataset = make_dataset(data, Split::train, seq_len, default_vocab_size(data), 3);
  DataConfig own_data = data;
  own_data.ask_previous_document = false;
  auto own = make_dataset(own_data, Split::train, seq_len, default_vocab_size(data), 3);
  const std::vector<int64_t> starts = dataset->document_starts(7);
  const Window w = read_window(*dataset, 7, seq_len), o = read_window(*own, 7, seq_len);
  const std::vector<Dataset::Query> queries = dataset->queries(7);
  ASSERT_EQ(queries.size(), 6u);
  for (size_t q = 0; q < queries.size(); ++q) {
    const Dataset::Query& query = queries[q];
    const int64_t asked_in = document_start(starts, query.asked_at);
    const int64_t planted_in = document_start(starts, query.key_at);
    EXPECT_EQ(planted_in, asked_in == 0 ? 0 : document_start(starts, asked_in - 1)) << q;
    EXPECT_EQ(w.inputs[size_t(query.asked_at)], w.inputs[size_t(query.key_at)]) << q;
    EXPECT_EQ(w.targets[size_t(query.asked_at)], w.inputs[size_t(query.key_at + 1)]) << q;
  }
  // Only the question triples of documents 1 and 2 (the last 6 tokens of each) changed.
  std::vector<int64_t> changed;
  for (int64_t t = 0; t < seq_len; ++t)
    if (w.inputs[size_t(t)] != o.inputs[size_t(t)] || w.targets[size_t(t)] != o.targets[size_t(t)])
      changed.push_back(t);
  for (int64_t t : changed)
    EXPECT_TRUE((t >= 60 && t < 66) || t >= 94) << "position " << t << " changed";
  EXPECT_FALSE(changed.empty());
  // Any slicing reads the same tokens (as ranks and micro-batches read them).
  for (int64_t cut : {1, 29, 61, 63, 95, 99}) {
    Window parts{std::vector<int32_t>(size_t(seq_len)), std::vector<int32_t>(size_t(seq_len))};
    dataset->read_slice(7, 0, cut, parts.inputs.data(), parts.targets.data());
    dataset->read_slice(7, cut, seq_len - cut, parts.inputs.data() + cut,
                        parts.targets.data() + cut);
    EXPECT_EQ(parts.inputs, w.inputs) << "cut at " << cut;
    EXPECT_EQ(parts.targets, w.targets) << "cut at " << cut;
  }
}

TEST(DocumentData, LengthsSpDoesNotDivideArePaddedUnscoredAndADocumentOfTheirOwn) {
  DataConfig data;
  data.n_pairs = 1;
  data.n_queries = 1;
  auto dataset = make_dataset(data, Split::train, 10, default_vocab_size(data), 3);
  const Window whole = read_window(*dataset, 0, 10);
  // 10 tokens over 4 ranks: 3 each, the last rank holds token 9 and two padding tokens.
  EXPECT_EQ(padded_seq_local(10, 4, 1), 3);
  std::vector<int32_t> inputs, targets;
  for (int rank = 0; rank < 4; ++rank) {
    const MicroBatch micro = read_micro_batch(*dataset, 0, 1, 10, 4, 1, rank);
    EXPECT_EQ(micro.seq_local, 3);
    EXPECT_EQ(micro.pos_offset, 3 * rank);
    EXPECT_EQ(micro.documents.starts, (std::vector<std::vector<int64_t>>{{0, 10}}));
    inputs.insert(inputs.end(), micro.inputs.begin(), micro.inputs.end());
    targets.insert(targets.end(), micro.targets.begin(), micro.targets.end());
  }
  std::vector<int32_t> expected_inputs = whole.inputs, expected_targets = whole.targets;
  expected_inputs.insert(expected_inputs.end(), {0, 0});
  expected_targets.insert(expected_targets.end(), {-1, -1});
  EXPECT_EQ(inputs, expected_inputs);
  EXPECT_EQ(targets, expected_targets);
  // A length sp divides reads as it always did: no documents.
  EXPECT_TRUE(read_micro_batch(*dataset, 0, 1, 10, 2, 1, 1).documents.none());
  // With a ring the length is also padded to a multiple of 2·ring, the zigzag's chunks: 10 on
  // sp 2 x ring 2 is held as 12 (6 per rank), on sp 4 x ring 4 as 16 (lcm(4, 8) = 8).
  EXPECT_EQ(padded_seq_len(10, 2, 2), 12);
  EXPECT_EQ(padded_seq_len(10, 4, 4), 16);
  EXPECT_EQ(padded_seq_len(16, 4, 4), 16);
  EXPECT_EQ(padded_seq_len(12, 6, 3), 12);
  EXPECT_EQ(padding_multiple(4, 1), 4);
  EXPECT_EQ(padding_multiple(4, 4), 8);
  EXPECT_EQ(padding_multiple(6, 3), 6);
  EXPECT_EQ(padding_multiple(6, 2), 12);
  EXPECT_EQ(tokens_per_rank_text(16, 4, 1), "4 tokens per rank");
  EXPECT_EQ(tokens_per_rank_text(10, 4, 4), "padded to 16, 4 tokens per rank");
  const MicroBatch ring_micro = read_micro_batch(*dataset, 0, 1, 10, 2, 2, 1);
  EXPECT_EQ(ring_micro.seq_local, 6);
  EXPECT_EQ(ring_micro.pos_offset, 6);
  EXPECT_EQ(ring_micro.documents.starts, (std::vector<std::vector<int64_t>>{{0, 10}}));
  EXPECT_EQ(ring_micro.targets[4], -1);
  EXPECT_EQ(ring_micro.targets[5], -1);
}

}  // namespace
}  // namespace ulysses
