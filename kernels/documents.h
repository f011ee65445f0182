// Packed documents (docs/parallelism.md, "Packed documents"): where the documents of each
// sequence begin. They are a few integers per sequence and every rank holds those of the whole
// sequence, so attention over all N tokens (after the Ulysses all-to-all) masks with them as
// they are, and each rank finds the positions of its own tokens from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses {

// starts[b]: the positions of sequence b at which a document begins, ascending, the first 0
// (one document: {0}). none(): no documents at all, and attention is plain causal attention,
// bit for bit as it always was.
struct Documents {
  std::vector<std::vector<int64_t>> starts;
  bool none() const { return starts.empty(); }
};

// The start of the document that holds position t.
int64_t document_start(const std::vector<int64_t>& starts, int64_t t);
// One past the last position of the document that holds position t, at most seq_len.
int64_t document_end(const std::vector<int64_t>& starts, int64_t t, int64_t seq_len);

// Per position t of one sequence of seq_len tokens: the start of its document.
std::vector<int64_t> document_start_of_each(const std::vector<int64_t>& starts, int64_t seq_len);

// Consecutive tokens [begin, end) of one sequence inside one document; position is the place
// of token `begin` inside its document (RoPE and learned positions restart per document).
struct DocumentPiece {
  int64_t begin = 0, end = 0, position = 0;
};
// Tokens [first, first + count) of a sequence cut at its document starts.
std::vector<DocumentPiece> document_pieces(const std::vector<int64_t>& starts, int64_t first,
                                           int64_t count);

// Empty when documents is none() or fits `batch` sequences of seq_len tokens (each list
// starts at 0, ascends strictly and stays below seq_len); else what is wrong, for an error.
std::string documents_problem(const Documents& documents, int64_t batch, int64_t seq_len);

}  // namespace ulysses
