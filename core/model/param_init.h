// Initial weights (docs/design.md, "Initial weights"). Every element's value depends only
// on the seed and its position in the flat parameter buffer: a counter-based generator
// rather than a stream, so each rank makes exactly the ranges it stores, and the weights are
// the same for every world size, ZeRO stage and split of the work.
#pragma once

#include <cstdint>

#include "core/config/config.h"
#include "core/model/params.h"

namespace ulysses {

// A standard normal sample that is a pure function of (seed, counter): the definition of the
// initial weights, std::sqrt(-2 log u1) · std::cos(2π u2) of glibc's libm.
double counter_normal(uint64_t seed, uint64_t counter);

// Fills out[0, count) with the initial values of flat elements [begin, begin + count):
// matrices and embeddings float(counter_normal(seed, element) · 0.02), the projections into
// the residual stream with 0.02 / sqrt(2 · n_layers) as GPT-2 does, norm weights 1 and biases
// 0. The same bits as that formula element by element, made faster (see approximate_cos and
// approximate_log) and on every OpenMP thread: the split of the range changes nothing.
void initial_weights(const ParamTable& table, int n_layers, uint64_t seed, int64_t begin,
                     int64_t count, float* out);

// cos(angle) for angle in [0, 2π], within kApproximateCosError of the exact value: a quadrant
// reduction and Taylor polynomials in a form the compiler vectorizes. initial_weights takes
// it where no cosine that close could round a weight otherwise, and glibc's cos elsewhere.
double approximate_cos(double angle);
constexpr double kApproximateCosError = 0x1p-47;

// log(u) for u in (0, 1] (normal floats), within kApproximateLogError · |log u| of the exact
// value: an exponent split and the atanh series, in a form the compiler vectorizes. Taken
// for the radii as approximate_cos is for the cosines.
double approximate_log(double u);
constexpr double kApproximateLogError = 0x1p-47;

}  // namespace ulysses
