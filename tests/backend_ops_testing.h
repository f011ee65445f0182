// The op table's fixture (tests/test_backend_ops.cpp, which says what the columns and the
// tolerances are; tests/backend_ops_attention.cpp): one backend per column, inputs rounded to
// the dtype the reference sees, and uploads and downloads in either dtype.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/emulated_cuda_backend.h"
#include "tests/test_ops_common.h"

namespace ulysses::backend_ops {

using ops_test::expect_gradient_matches;
using ops_test::ScalarFunction;
using ops_test::weighted_sum;

enum class Column { cpu, emulated_cuda, gpu };

inline std::string column_name(Column column) {
  switch (column) {
    case Column::cpu:
      return "cpu";
    case Column::emulated_cuda:
      return "cuda_kernels_on_host";
    case Column::gpu:
      return "cuda_on_gpu";
  }
  return "?";
}

inline float round_to(DType dtype, float value) {
  return dtype == DType::bf16 ? bf16_to_float(float_to_bf16(value)) : value;
}

inline std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

inline double relative_error(const std::vector<float>& actual,
                             const std::vector<double>& expected) {
  return ops_test::relative_error(actual, expected);
}

class BackendOps : public ::testing::TestWithParam<Column> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Column::cpu:
        backend_ = make_backend(BackendKind::cpu, 0);
        break;
      case Column::emulated_cuda:
        backend_ = make_emulated_cuda_backend();
        break;
      case Column::gpu:
        try {
          backend_ = make_backend(BackendKind::cuda, 0);
        } catch (const DeviceUnavailableError& error) {
          GTEST_SKIP() << "the real-GPU column needs a GPU (scripts/gpu-check.sh): "
                       << error.what();
        }
        break;
    }
  }

  Backend& backend() { return *backend_; }
  bool is_cpu() const { return GetParam() == Column::cpu; }
  // The cpu backend is f32 only; the cuda kernels take f32 and bf16.
  std::vector<DType> float_dtypes() const {
    return is_cpu() ? std::vector<DType>{DType::f32} : std::vector<DType>{DType::f32, DType::bf16};
  }
  // Attention is f32 on the cpu and bf16 on cuda.
  DType attention_dtype() const { return is_cpu() ? DType::f32 : DType::bf16; }

  // Uniform in [-scale, scale], rounded to dtype so that the reference sees the same values.
  static std::vector<float> values(size_t count, uint64_t seed, DType dtype, float scale = 1.0f) {
    std::vector<float> result = ops_test::random_floats(count, seed, -scale, scale);
    for (float& value : result) value = round_to(dtype, value);
    return result;
  }

  Buffer put(DType dtype, std::initializer_list<int64_t> dims, const std::vector<float>& host) {
    Buffer buffer = backend().alloc(MemCategory::activations, dtype, dims, "test tensor");
    EXPECT_EQ(size_t(buffer.tensor().numel()), host.size());
    if (dtype == DType::f32) {
      backend().upload(buffer, host.data());
    } else {
      std::vector<uint16_t> bits(host.size());
      for (size_t i = 0; i < host.size(); ++i) bits[i] = float_to_bf16(host[i]);
      backend().upload(buffer, bits.data());
    }
    return buffer;
  }

  Buffer put_i32(std::initializer_list<int64_t> dims, const std::vector<int32_t>& host) {
    Buffer buffer = backend().alloc(MemCategory::activations, DType::i32, dims, "test ids");
    backend().upload(buffer, host.data());
    return buffer;
  }

  std::vector<float> get(const Tensor& tensor) {
    std::vector<float> host(size_t(tensor.numel()));
    if (tensor.dtype == DType::f32) {
      backend().download(host.data(), tensor);
    } else {
      std::vector<uint16_t> bits(host.size());
      backend().download(bits.data(), tensor);
      for (size_t i = 0; i < host.size(); ++i) host[i] = bf16_to_float(bits[i]);
    }
    return host;
  }

  // f32 against double: summation order only. bf16 outputs: a rounding of 2^-9 relative and
  // bf16 inputs to the gradient kernels.
  static double forward_tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 1e-5; }
  static double gradient_tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 1e-4; }

 private:
  std::unique_ptr<Backend> backend_;
};

inline std::string describe(DType dtype, const std::vector<int64_t>& shape) {
  std::string text = std::string(dtype_name(dtype)) + " shape";
  for (int64_t extent : shape) text += " " + std::to_string(extent);
  return text;
}

}  // namespace ulysses::backend_ops
