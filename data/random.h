// Deterministic, platform-independent randomness for the data readers. Everything here is
// a pure function of its inputs (no std:: distributions, whose output differs between
// standard libraries), so every rank and every resumed run sees the same data.
#pragma once

#include <cstdint>

namespace ulysses {

// SplitMix64's finaliser: a strong 64-bit mixing function.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Counter-based hash of a few words: the same inputs always give the same value.
inline uint64_t hash_words(uint64_t a, uint64_t b) {
  return mix64(mix64(a) ^ b);
}
inline uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(hash_words(a, b) ^ c);
}

// Uniform integer in [0, n) from 64 random bits (Lemire's multiply-shift; the bias is
// below 2^-40 for the small n used here).
inline uint64_t scale_to(uint64_t bits, uint64_t n) {
  return uint64_t((static_cast<unsigned __int128>(bits) * n) >> 64);
}

// A small sequential generator for plans that need a handful of draws.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  // Uniform in [0, n), n > 0.
  uint64_t below(uint64_t n) { return scale_to(next(), n); }

 private:
  uint64_t state_;
};

// A seeded permutation of [0, n) evaluated one element at a time in O(1) memory: a
// balanced Feistel network on the smallest even-bit power of two >= n, with cycle
// walking to stay inside [0, n). Expected walk length is below 4.
class Permutation {
 public:
  Permutation(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
    while ((int64_t(1) << (2 * half_bits_)) < n_) half_bits_++;
    half_mask_ = (uint64_t(1) << half_bits_) - 1;
  }

  int64_t operator()(int64_t position) const {
    uint64_t x = uint64_t(position);
    do {
      x = encrypt(x);
    } while (x >= uint64_t(n_));
    return int64_t(x);
  }

 private:
  static constexpr int kRounds = 6;

  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & half_mask_;
    for (int round = 0; round < kRounds; round++) {
      uint64_t next_right = left ^ (hash_words(seed_, round, right) & half_mask_);
      left = right;
      right = next_right;
    }
    return (left << half_bits_) | right;
  }

  int64_t n_;
  uint64_t seed_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 0;
};

}  // namespace ulysses
