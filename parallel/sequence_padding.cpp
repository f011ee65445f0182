#include "parallel/sequence_padding.h"

#include <numeric>

namespace ulysses {

int64_t padding_multiple(int sp, int ring) {
  return ring > 1 ? std::lcm(int64_t(sp), int64_t(2 * ring)) : int64_t(sp);
}

int64_t padded_seq_len(int64_t seq_len, int sp, int ring) {
  const int64_t multiple = padding_multiple(sp, ring);
  return (seq_len + multiple - 1) / multiple * multiple;
}

int64_t padded_seq_local(int64_t seq_len, int sp, int ring) {
  return padded_seq_len(seq_len, sp, ring) / sp;
}

std::string tokens_per_rank_text(int64_t seq_len, int sp, int ring) {
  const int64_t padded = padded_seq_len(seq_len, sp, ring);
  const std::string per_rank = std::to_string(padded / sp) + " tokens per rank";
  return padded == seq_len ? per_rank : "padded to " + std::to_string(padded) + ", " + per_rank;
}

}  // namespace ulysses
