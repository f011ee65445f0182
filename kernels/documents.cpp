#include "kernels/documents.h"

#include <algorithm>

namespace ulysses {

int64_t document_start(const std::vector<int64_t>& starts, int64_t t) {
  // The last start at or before t; starts[0] is 0, so there is one.
  const auto after = std::upper_bound(starts.begin(), starts.end(), t);
  return after == starts.begin() ? 0 : *(after - 1);
}

int64_t document_end(const std::vector<int64_t>& starts, int64_t t, int64_t seq_len) {
  const auto after = std::upper_bound(starts.begin(), starts.end(), t);
  return after == starts.end() ? seq_len : std::min(*after, seq_len);
}

std::vector<int64_t> document_start_of_each(const std::vector<int64_t>& starts, int64_t seq_len) {
  std::vector<int64_t> start_of(size_t(seq_len), 0);
  int64_t current = 0;
  size_t next = 0;
  for (int64_t t = 0; t < seq_len; ++t) {
    while (next < starts.size() && starts[next] <= t) current = starts[next++];
    start_of[size_t(t)] = current;
  }
  return start_of;
}

std::vector<DocumentPiece> document_pieces(const std::vector<int64_t>& starts, int64_t first,
                                           int64_t count) {
  std::vector<DocumentPiece> pieces;
  const int64_t last = first + count;
  for (int64_t begin = first; begin < last;) {
    const int64_t end = std::min(last, document_end(starts, begin, last));
    pieces.push_back({begin, end, begin - document_start(starts, begin)});
    begin = end;
  }
  return pieces;
}

std::string documents_problem(const Documents& documents, int64_t batch, int64_t seq_len) {
  if (documents.none()) return "";
  if (int64_t(documents.starts.size()) != batch)
    return "document starts for " + std::to_string(documents.starts.size()) +
           " sequences, but the batch has " + std::to_string(batch);
  for (size_t b = 0; b < documents.starts.size(); ++b) {
    const std::vector<int64_t>& starts = documents.starts[b];
    const std::string which = "document starts of sequence " + std::to_string(b);
    if (starts.empty() || starts[0] != 0) return which + " do not begin at 0";
    for (size_t i = 1; i < starts.size(); ++i)
      if (starts[i] <= starts[i - 1]) return which + " do not ascend";
    if (starts.back() >= seq_len)
      return which + " reach " + std::to_string(starts.back()) + ", past the sequence of " +
             std::to_string(seq_len) + " tokens";
  }
  return "";
}

}  // namespace ulysses
