#include "core/model/param_init.h"

#include <algorithm>
#include <bit>
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

// double(x) for x < 2^52, exactly: the double 2^52 + x has x as its fraction bits. AVX2 has no
// instruction that converts 64-bit integers (AVX-512 has), so a loop that converts them with a
// cast is not vectorized for it.
[[gnu::always_inline]] inline double small_to_double(uint64_t x) {
  return std::bit_cast<double>(x | std::bit_cast<uint64_t>(0x1p52)) - 0x1p52;
}

// double(x) for x < 2^53, exactly: twice its top 52 bits plus its last, each part and the sum
// exact below 2^53.
[[gnu::always_inline]] inline double exact_double(uint64_t x) {
  return 2.0 * small_to_double(x >> 1) + small_to_double(x & 1);
}

// approximate_log, inlined where the samples' loop is vectorized. u = m · 2^e with m in
// (√2/2, √2], and log m = 2 atanh f = 2 (f + f^3/3 + f^5/5 + ...) with f = (m - 1)/(m + 1),
// |f| <= 0.1716. For u in (0, 1] (normal): m - 1 is exact, f off by two roundings, the series
// to f^19 (the terms left out are below 0.1716^20/21 < 2.4e-17 of the first) and its
// roundings keep log m within a few roundings (about 2^-50) of itself; for e != 0,
// |log u| >= log √2 >= |log m|, so the sum with e · log 2 (its high part exact, 32
// significant bits) adds no more than a rounding or two of log u. Together well inside
// kApproximateLogError.
[[gnu::always_inline]] inline double log_of_unit(double u) {
  constexpr double kLn2High = 6.93147180369123816490e-01;
  constexpr double kLn2Low = 1.90821492927058770002e-10;
  constexpr uint64_t kFractionBits = (uint64_t(1) << 52) - 1;
  constexpr uint64_t kExponentOfOne = uint64_t(1023) << 52;
  const uint64_t bits = std::bit_cast<uint64_t>(u);
  const uint64_t fraction_bits = (bits & kFractionBits) | kExponentOfOne;
  const uint64_t above_sqrt2 = uint64_t(std::bit_cast<double>(fraction_bits) > M_SQRT2);
  // Halved by lowering its exponent: the same double as 0.5 · fraction, without a select that
  // keeps AVX2 from vectorizing the loop.
  const double m = std::bit_cast<double>(fraction_bits - (above_sqrt2 << 52));
  const double exponent = small_to_double((bits >> 52) + above_sqrt2) - 1023.0;
  const double f = (m - 1.0) / (m + 1.0);
  const double f2 = f * f;
  const double series =
      1.0 +
      f2 * (1.0 / 3 +
            f2 * (1.0 / 5 +
                  f2 * (1.0 / 7 +
                        f2 * (1.0 / 9 +
                              f2 * (1.0 / 11 +
                                    f2 * (1.0 / 13 +
                                          f2 * (1.0 / 15 + f2 * (1.0 / 17 + f2 * (1.0 / 19)))))))));
  return exponent * kLn2High + (2.0 * f * series + exponent * kLn2Low);
}

// Samples made together, in one loop the compiler vectorizes, then the few it leaves
// undecided with glibc's log and cos.
constexpr int64_t kBlock = 256;

// Room around the approximate cosine that holds glibc's cos scaled by the two radii's ratio:
// approximate_cos is within kApproximateCosError of the exact cosine and glibc's cos within
// an ulp (2^-53 on [-1, 1]); the radius from approximate_log is within kApproximateLogError / 2
// of the exact one and glibc's within 2^-52 (half of its log's ulp, a rounding of the sqrt),
// and |cos| <= 1 makes that relative error one on the cosine too. The margin is over 64 times
// their sum (with another rounding of the sqrt), and costs a fallback to glibc for about 2
// samples in 10^4.
constexpr double kMargin = 0x1p-40;
static_assert(kApproximateCosError + 0x1p-53 + kApproximateLogError / 2 + 0x1p-51 < kMargin / 64);

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// counter_normal of a seed's key: std::sqrt(-2 log u1) · std::cos(2π u2) of glibc's libm.
double normal_of_key(uint64_t key, uint64_t counter) {
  // Two independent words per counter, from the SplitMix64 sequence of the key.
  const uint64_t first = mix(key + (2 * counter + 1) * kGoldenGamma);
  const uint64_t second = mix(key + (2 * counter + 2) * kGoldenGamma);
  const double u1 = (double(first >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: the log is finite
  const double u2 = double(second >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);  // Box-Muller
}

// out[i] = float(counter_normal(seed, counter + i) · stddev) for i < n <= kBlock, bit for bit.
// That weight is float((r · c) · stddev), glibc's radius r >= 0 and cosine c, each operation
// rounded to nearest. With the approximate radius r' (r = r' / (1 + e)) and cosine c', the
// margin puts the exact product r · c = r' · c / (1 + e) between r' · (c' - kMargin) and
// r' · (c' + kMargin); rounding to nearest is monotonic and stddev > 0, so where the weights
// made from those two ends round to the same float it is that float, and elsewhere glibc
// decides. A zero radius (u1 = 1, whose -2 log is -0.0) gives a zero whose sign is the
// cosine's: glibc decides too.
//
// Built for AVX-512, AVX2 and the baseline, chosen at load time. The contractions into FMA
// that AVX2 allows touch only the polynomials (their single rounding keeps them within their
// bounds) and exact_double (exact either way); the weight's own products have no sum.
[[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]] void normal_block(
    uint64_t key, uint64_t counter, int64_t n, double stddev, float* out) {
  int32_t undecided[kBlock];
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t at = counter + uint64_t(i);
    const uint64_t first = mix(key + (2 * at + 1) * kGoldenGamma);
    const uint64_t second = mix(key + (2 * at + 2) * kGoldenGamma);
    const double u1 = (exact_double(first >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = exact_double(second >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * log_of_unit(u1));
    const double cosine = cos_of_angle(2.0 * M_PI * u2);
    const float low = float(radius * (cosine - kMargin) * stddev);
    const float high = float(radius * (cosine + kMargin) * stddev);
    out[i] = low;
    undecided[i] = int32_t(bits_of(low) != bits_of(high)) | int32_t(radius == 0.0);
  }
  for (int64_t i = 0; i < n; ++i)
    if (undecided[i]) out[i] = float(normal_of_key(key, counter + uint64_t(i)) * stddev);
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
  return normal_of_key(key_of(seed), counter);
}

double approximate_cos(double angle) {
  return cos_of_angle(angle);
}

double approximate_log(double u) {
  return log_of_unit(u);
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
