// Initial weights (docs/design.md, "Initial weights"). Every element's value depends only
// on the seed and its position in the flat parameter buffer: a counter-based generator
// rather than a stream, so each rank makes exactly the ranges it stores, and the weights are
// the same for every world size, ZeRO stage and split of the work.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/params.h"

namespace ulysses {

// A standard normal sample that is a pure function of (seed, counter).
double counter_normal(uint64_t seed, uint64_t counter);

// Fills out[0, count) with the initial values of flat elements [begin, begin + count):
// matrices and embeddings N(0, 0.02), the projections into the residual stream N(0, 0.02 /
// sqrt(2 · n_layers)) as GPT-2 does, norm weights 1 and biases 0.
void initial_weights(const ParamTable& table, int n_layers, uint64_t seed, int64_t begin,
                     int64_t count, float* out);

}  // namespace ulysses
