// Which parallel.head_chunks (UPipe stages, docs/memory.md) fit a model's heads on sp ranks:
// a pure rule, shared by config validation and Ulysses attention.
#pragma once

#include <vector>

namespace ulysses {

// Whether the heads fit a Ulysses degree of `ulysses` ranks (sp, or sp / ring with a ring):
// it divides the q heads, and the kv heads are split over the ranks (it divides them) or
// replicated (they divide it).
bool heads_fit_ulysses(int n_heads, int n_kv_heads, int ulysses);

// The head_chunks that work for these head counts on sp ranks, ascending: U divides the
// n_heads / sp heads per rank, and a stage's h/U q heads cover whole groups of
// n_heads / n_kv_heads q heads per kv head, or lie inside one.
std::vector<int> valid_head_chunks(int n_heads, int n_kv_heads, int sp);

}  // namespace ulysses
