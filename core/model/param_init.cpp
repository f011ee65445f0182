#include "core/model/param_init.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// The key of the SplitMix64 sequence whose words make a seed's samples.
uint64_t key_of(uint64_t seed) {
  return mix(seed + kGoldenGamma);
}

constexpr double factorial(int n) {
  return n <= 1 ? 1.0 : double(n) * factorial(n - 1);
}

// approximate_cos, inlined where the samples' loop is vectorized.
[[gnu::always_inline]] inline double cos_of_angle(double angle) {
  // angle = quadrant · π/2 + r with |r| <= π/4 (and a rounding more). π/2 = kPio2High +
  // kPio2Low: the high part has 33 significant bits, so quadrant · kPio2High (quadrant <= 4)
  // is exact and r is off by a few 2^-54 at most.
  constexpr double kPio2High = 1.57079632673412561417e+00;
  constexpr double kPio2Low = 6.07710050650619224932e-11;
  const int quadrant = int(angle * (2.0 / M_PI) + 0.5);
  const double r = (angle - quadrant * kPio2High) - quadrant * kPio2Low;
  const double r2 = r * r;
  // Taylor series to r^14 and r^15: the terms left out are below (π/4)^16/16! < 1.2e-15 and
  // (π/4)^17/17! < 1e-16, the roundings of the coefficients and of the 16 steps below
  // 2.5e-15: together less than kApproximateCosError (7.1e-15).
  const double cos_r =
      1.0 +
      r2 * (-1.0 / factorial(2) +
            r2 * (1.0 / factorial(4) +
                  r2 * (-1.0 / factorial(6) +
                        r2 * (1.0 / factorial(8) +
                              r2 * (-1.0 / factorial(10) +
                                    r2 * (1.0 / factorial(12) + r2 * (-1.0 / factorial(14))))))));
  const double sin_r =
      r *
      (1.0 +
       r2 * (-1.0 / factorial(3) +
             r2 * (1.0 / factorial(5) +
                   r2 * (-1.0 / factorial(7) +
                         r2 * (1.0 / factorial(9) +
                               r2 * (-1.0 / factorial(11) +
                                     r2 * (1.0 / factorial(13) + r2 * (-1.0 / factorial(15)))))))));
  // cos(q·π/2 + r) is cos r, -sin r, -cos r, sin r for q = 0, 1, 2, 3 (and 4 as 0). Chosen by
  // exact products rather than branches, which the quadrant's randomness would mispredict.
  const double odd = double(quadrant & 1);
  const double sign = 1.0 - double((quadrant + 1) & 2);
  return sign * (odd * sin_r + (1.0 - odd) * cos_r);
}

// Samples made together: their radii (a glibc log each) in one loop, then their cosines and
// roundings in one the compiler vectorizes.
constexpr int64_t kBlock = 256;

// Room around approximate_cos's value that holds glibc's cos: approximate_cos is within
// kApproximateCosError of the exact cosine and glibc's cos within an ulp (2^-53 on [-1, 1]).
// The margin is over 64 times their sum, and costs a fallback to glibc for about 2 samples in
// 10^4.
constexpr double kCosMargin = 0x1p-40;
static_assert(kApproximateCosError + 0x1p-53 < kCosMargin / 64);

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// out[i] = float(counter_normal(seed, counter + i) · stddev) for i < n <= kBlock, bit for bit.
// Rounding to nearest is monotonic, the radius is >= 0 and stddev > 0, so that weight lies
// between the ones made from the two ends of the margin around approximate_cos's value:
// where they round to the same float it is that float, and elsewhere glibc's cos decides. A
// zero radius (u1 = 1, whose -2 log is -0.0) gives a zero whose sign is the cosine's: glibc
// decides too.
//
// Built for AVX-512, AVX2 and the baseline, chosen at load time: wider vectors for the
// cosines. The contractions into FMA that AVX2 allows touch only approximate_cos's polynomial
// (their single rounding keeps it within its bound); the weight's own products have no sum.
[[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]] void normal_block(
    uint64_t key, uint64_t counter, int64_t n, double stddev, float* out) {
  double radius[kBlock], angle[kBlock];
  int32_t undecided[kBlock];
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t at = counter + uint64_t(i);
    const uint64_t first = mix(key + (2 * at + 1) * kGoldenGamma);
    const uint64_t second = mix(key + (2 * at + 2) * kGoldenGamma);
    // Below 2^53 the signed conversion, the one x86-64 has an instruction for, is exact too.
    const double u1 = (double(int64_t(first >> 11)) + 1.0) * 0x1.0p-53;
    const double u2 = double(int64_t(second >> 11)) * 0x1.0p-53;
    radius[i] = std::sqrt(-2.0 * std::log(u1));
    angle[i] = 2.0 * M_PI * u2;
  }
  for (int64_t i = 0; i < n; ++i) {
    const double cosine = cos_of_angle(angle[i]);
    const float low = float(radius[i] * (cosine - kCosMargin) * stddev);
    const float high = float(radius[i] * (cosine + kCosMargin) * stddev);
    out[i] = low;
    undecided[i] = int32_t(bits_of(low) != bits_of(high)) | int32_t(radius[i] == 0.0);
  }
  for (int64_t i = 0; i < n; ++i)
    if (undecided[i]) out[i] = float(radius[i] * std::cos(angle[i]) * stddev);
}

// float(counter_normal(seed, counter + i) · stddev) for i < n. Each block's values depend on
// its counters only, so the threads' split leaves every bit as one thread makes it.
void normal_values(uint64_t key, uint64_t counter, int64_t n, double stddev, float* out) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 8)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kBlock;
    normal_block(key, counter + uint64_t(first), std::min(kBlock, n - first), stddev, out + first);
  }
}

}  // namespace

double counter_normal(uint64_t seed, uint64_t counter) {
  // Two independent words per counter, from the SplitMix64 sequence of a key made of the seed.
  const uint64_t key = key_of(seed);
  const uint64_t first = mix(key + (2 * counter + 1) * kGoldenGamma);
  const uint64_t second = mix(key + (2 * counter + 2) * kGoldenGamma);
  const double u1 = (double(first >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: the log is finite
  const double u2 = double(second >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);  // Box-Muller
}

double approximate_cos(double angle) {
  return cos_of_angle(angle);
}

void initial_weights(const ParamTable& table, int n_layers, uint64_t seed, int64_t begin,
                     int64_t count, float* out) {
  const double stddev = 0.02;
  const double residual_stddev = stddev / std::sqrt(2.0 * double(n_layers));
  const uint64_t key = key_of(seed);
  for_each_tensor_piece(table, begin, count,
                        [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
                          float* values = out + done;
                          const uint64_t counter = uint64_t(spec.offset + first);
                          switch (spec.init) {
                            case ParamSpec::Init::normal:
                              normal_values(key, counter, n, stddev, values);
                              break;
                            case ParamSpec::Init::residual_normal:
                              normal_values(key, counter, n, residual_stddev, values);
                              break;
                            case ParamSpec::Init::ones:
                              std::fill_n(values, n, 1.0f);
                              break;
                            case ParamSpec::Init::zeros:
                              std::fill_n(values, n, 0.0f);
                              break;
                          }
                        });
}

}  // namespace ulysses
