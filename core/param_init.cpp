#include "core/param_init.h"

#include <cmath>

namespace ulysses {

namespace {

// SplitMix64's output function: a bijection of 64-bit words whose outputs for consecutive
// inputs pass the usual statistical tests.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;

}  // namespace

double counter_normal(uint64_t seed, uint64_t counter) {
  // Two independent words per counter, from the SplitMix64 sequence of a key made of the seed.
  const uint64_t key = mix(seed + kGoldenGamma);
  const uint64_t first = mix(key + (2 * counter + 1) * kGoldenGamma);
  const uint64_t second = mix(key + (2 * counter + 2) * kGoldenGamma);
  const double u1 = (double(first >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: the log is finite
  const double u2 = double(second >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);  // Box-Muller
}

void initial_weights(const ParamTable& table, int n_layers, uint64_t seed, int64_t begin,
                     int64_t count, float* out) {
  const double stddev = 0.02;
  const double residual_stddev = stddev / std::sqrt(2.0 * double(n_layers));
  for_each_tensor_piece(table, begin, count,
                        [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
                          float* values = out + done;
                          for (int64_t i = 0; i < n; ++i) {
                            const uint64_t element = uint64_t(spec.offset + first + i);
                            switch (spec.init) {
                              case ParamSpec::Init::normal:
                                values[i] = float(counter_normal(seed, element) * stddev);
                                break;
                              case ParamSpec::Init::residual_normal:
                                values[i] = float(counter_normal(seed, element) * residual_stddev);
                                break;
                              case ParamSpec::Init::ones:
                                values[i] = 1.0f;
                                break;
                              case ParamSpec::Init::zeros:
                                values[i] = 0.0f;
                                break;
                            }
                          }
                        });
}

}  // namespace ulysses
