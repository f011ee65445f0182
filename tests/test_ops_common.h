// Helpers for the op tests (tests/test_ops_*.cpp): random inputs, host <-> backend copies,
// error measures against double-precision references, and central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace ulysses::ops_test {

inline std::vector<float> random_floats(size_t count, uint64_t seed, float low = -1.0f,
                                        float high = 1.0f) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

inline std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// A tracked f32 buffer holding `values`.
inline Buffer make_f32(Backend& backend, std::initializer_list<int64_t> dims,
                       const std::vector<float>& values,
                       MemCategory category = MemCategory::activations) {
  Buffer buffer = backend.alloc(category, DType::f32, dims, "test tensor");
  EXPECT_EQ(size_t(buffer.tensor().numel()), values.size());
  backend.upload(buffer, values.data());
  return buffer;
}

inline Buffer make_i32(Backend& backend, std::initializer_list<int64_t> dims,
                       const std::vector<int32_t>& values) {
  Buffer buffer = backend.alloc(MemCategory::activations, DType::i32, dims, "test ids");
  EXPECT_EQ(size_t(buffer.tensor().numel()), values.size());
  backend.upload(buffer, values.data());
  return buffer;
}

inline std::vector<float> read_f32(Backend& backend, const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  backend.download(values.data(), tensor);
  return values;
}

// max |actual - expected| / max |expected|: the error relative to the tensor's scale, which
// stays meaningful where single elements cancel to near zero.
inline double relative_error(const std::vector<float>& actual,
                             const std::vector<double>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double max_error = 0.0, max_expected = 0.0;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    // std::max would pass over a NaN: a non-finite result is an infinite error.
    if (!std::isfinite(actual[i])) return std::numeric_limits<double>::infinity();
    max_error = std::max(max_error, std::abs(double(actual[i]) - expected[i]));
    max_expected = std::max(max_expected, std::abs(expected[i]));
  }
  return max_error / std::max(max_expected, 1e-30);
}

// A scalar function of one input tensor (the others held fixed), in double precision.
using ScalarFunction = std::function<double(const std::vector<double>&)>;

// Checks `gradient` (from the backend) against central differences of `loss` around `point`
// at every coordinate, or at `max_checks` random ones (plus the first and last) for large
// tensors. The error is relative to the largest finite-difference value checked.
inline void expect_gradient_matches(const std::vector<float>& gradient,
                                    const std::vector<double>& point, const ScalarFunction& loss,
                                    double tolerance, const std::string& name,
                                    size_t max_checks = 400, uint64_t seed = 7) {
  ASSERT_EQ(gradient.size(), point.size()) << name;
  std::vector<size_t> coordinates;
  if (point.size() <= max_checks) {
    for (size_t i = 0; i < point.size(); ++i) coordinates.push_back(i);
  } else {
    std::mt19937_64 generator(seed);
    std::uniform_int_distribution<size_t> pick(0, point.size() - 1);
    coordinates.push_back(0);
    coordinates.push_back(point.size() - 1);
    while (coordinates.size() < max_checks) coordinates.push_back(pick(generator));
  }
  const double step = 1e-4;
  std::vector<double> shifted = point;
  std::vector<double> numeric(coordinates.size());
  double max_numeric = 0.0;
  for (size_t n = 0; n < coordinates.size(); ++n) {
    const size_t i = coordinates[n];
    shifted[i] = point[i] + step;
    const double up = loss(shifted);
    shifted[i] = point[i] - step;
    const double down = loss(shifted);
    shifted[i] = point[i];
    numeric[n] = (up - down) / (2.0 * step);
    max_numeric = std::max(max_numeric, std::abs(numeric[n]));
  }
  ASSERT_GT(max_numeric, 0.0) << name << ": the loss does not depend on this input";
  double max_error = 0.0;
  size_t worst = 0;
  for (size_t n = 0; n < coordinates.size(); ++n) {
    const double difference = std::abs(double(gradient[coordinates[n]]) - numeric[n]);
    const double error =
        std::isfinite(difference) ? difference : std::numeric_limits<double>::infinity();
    if (error > max_error) max_error = error, worst = n;
  }
  EXPECT_LE(max_error / max_numeric, tolerance)
      << name << ": worst at index " << coordinates[worst] << " backend "
      << gradient[coordinates[worst]] << " vs finite difference " << numeric[worst];
}

// Σ weights · values: turns a tensor-valued reference into a scalar loss.
inline double weighted_sum(const std::vector<double>& values, const std::vector<float>& weights) {
  double sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) sum += double(weights[i]) * values[i];
  return sum;
}

}  // namespace ulysses::ops_test
