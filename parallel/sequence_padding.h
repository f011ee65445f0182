// How long a sequence is once split over an SP group: lengths the ranks (and a ring's zigzag)
// cannot split evenly are padded (docs/parallelism.md, "Any length under any sp"). Apart from
// the mesh, so that the config's rules can use it without communicators.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

// The multiple a sequence is padded to on an SP group of sp ranks, ring of them in a ring
// (ring divides sp): sp, and with ring > 1 also 2·ring, the zigzag's equal chunks, so
// lcm(sp, 2·ring).
int64_t padding_multiple(int sp, int ring);
// The length a sequence of seq_len tokens is padded to on an SP group of sp ranks, ring of
// them in a ring: the next multiple of padding_multiple(sp, ring) (docs/parallelism.md, "Any
// length under any sp"). The padding is a document of its own, so any length trains as it
// would on one rank.
int64_t padded_seq_len(int64_t seq_len, int sp, int ring);
// Tokens each rank of the SP group holds: padded_seq_len / sp.
int64_t padded_seq_local(int64_t seq_len, int sp, int ring);
// For the log: "63 tokens per rank", and where the length is padded "padded to 252, 63 tokens
// per rank", so a user sees the padding they did not ask for.
std::string tokens_per_rank_text(int64_t seq_len, int sp, int ring);

}  // namespace ulysses
