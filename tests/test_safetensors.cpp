#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;

// A file with the given header text and data, written byte by byte: lets the tests
// build files the writer would never produce.
void write_raw_file(const std::string& path, const std::string& header,
                    const std::vector<uint8_t>& data, uint64_t header_length) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_length), sizeof(header_length));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good());
}

void write_raw_file(const std::string& path, const std::string& header,
                    const std::vector<uint8_t>& data) {
  write_raw_file(path, header, data, header.size());
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Runs fn and checks it throws a std::runtime_error naming the file and the problem.
void expect_error(const std::function<void()>& fn, const std::string& path,
                  const std::string& problem) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << problem << "'";
  } catch (const std::runtime_error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << message;
  }
}

void expect_open_error(const std::string& path, const std::string& problem) {
  expect_error([&] { SafetensorsReader reader(path); }, path, problem);
}

// Float value of a bf16 / f16 bit pattern from sign, exponent and mantissa fields with
// ldexp: a formulation independent of the bit manipulation in the library.
double decode_float_fields(uint32_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const double sign = (bits >> (exponent_bits + mantissa_bits)) & 1 ? -1.0 : 1.0;
  if (exponent == (1u << exponent_bits) - 1) {
    return mantissa ? std::nan("") : sign * INFINITY;
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mantissa_bits);
  return sign * std::ldexp((1u << mantissa_bits) + mantissa,
                           static_cast<int>(exponent) - bias - mantissa_bits);
}

std::vector<float> ramp(size_t count, float scale) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = scale * (static_cast<float>(i) - 3.25f);
  return values;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Safetensors, RoundTripF32) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<float> matrix = ramp(12, 0.37f);
  matrix[5] = -0.0f;
  matrix[6] = std::numeric_limits<float>::denorm_min();
  matrix[7] = std::numeric_limits<float>::infinity();
  matrix[8] = std::nanf("");
  std::vector<float> vector = ramp(5, -1e-3f);
  float scalar = 42.5f;

  SafetensorsWriter writer;
  writer.add("layers.0.weight", {3, 4}, matrix.data());
  writer.add("layers.0.bias", {5}, vector.data());
  writer.add("scale", {}, &scalar);
  writer.add("empty", {0, 7}, nullptr);
  writer.set_metadata("loss", "2.5");
  writer.set_metadata("format", "pt");
  writer.write(path);

  SafetensorsReader reader(path);
  ASSERT_EQ(reader.entries().size(), 4u);
  EXPECT_EQ(reader.metadata(),
            (std::map<std::string, std::string>{{"loss", "2.5"}, {"format", "pt"}}));
  EXPECT_TRUE(reader.contains("scale"));
  EXPECT_FALSE(reader.contains("missing"));
  EXPECT_EQ(reader.entry("layers.0.weight").dtype, "F32");
  EXPECT_EQ(reader.entry("layers.0.weight").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(reader.entry("empty").numel(), 0);

  std::vector<float> matrix_back(12), vector_back(5), scalar_back(1);
  reader.read_f32("layers.0.weight", {3, 4}, matrix_back.data());
  reader.read_f32("layers.0.bias", {5}, vector_back.data());
  reader.read_f32("scale", {}, scalar_back.data());
  reader.read_f32("empty", {0, 7}, nullptr);
  EXPECT_TRUE(same_bits(matrix, matrix_back));
  EXPECT_TRUE(same_bits(vector, vector_back));
  EXPECT_EQ(scalar_back[0], scalar);

  // Layout: data starts 8-byte aligned and tensors follow in the order they were added.
  std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t header_length;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_length + (12 + 5 + 1) * sizeof(float));
  EXPECT_EQ(reader.entries()[0].name, "layers.0.weight");
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + header_length, matrix.data(), 12 * sizeof(float)), 0);
}

TEST(Safetensors, ReadsEveryBf16AndF16ValueExactly) {
  TempDir dir;
  const std::string path = dir.file("halves.safetensors");
  std::vector<uint8_t> data(2 * 65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t bits = static_cast<uint16_t>(i);
    std::memcpy(data.data() + 2 * i, &bits, 2);
    std::memcpy(data.data() + 2 * (65536 + i), &bits, 2);
  }
  // Odd-sized leading tensor: the halves start at an offset that is not 4-byte aligned.
  data.insert(data.begin(), 2, 0);
  const std::string header =
      R"({"pad":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
      R"("b":{"dtype":"BF16","shape":[256,256],"data_offsets":[2,131074]},)"
      R"("h":{"dtype":"F16","shape":[65536],"data_offsets":[131074,262146]}})";
  write_raw_file(path, header, data);

  SafetensorsReader reader(path);
  std::vector<float> bf16(65536), f16(65536);
  reader.read_f32("b", {256, 256}, bf16.data());
  reader.read_f32("h", {65536}, f16.data());
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    double want_bf16 = decode_float_fields(i, 8, 7);
    double want_f16 = decode_float_fields(i, 5, 10);
    bool bf16_ok = std::isnan(want_bf16) ? std::isnan(bf16[i]) : bf16[i] == want_bf16;
    bool f16_ok = std::isnan(want_f16) ? std::isnan(f16[i]) : f16[i] == want_f16;
    // Zeros must keep their sign.
    bf16_ok = bf16_ok && std::signbit(bf16[i]) == bool(i & 0x8000);
    f16_ok = f16_ok && std::signbit(f16[i]) == bool(i & 0x8000);
    if (!bf16_ok || !f16_ok) {
      if (++mismatches < 10) {
        ADD_FAILURE() << "bits 0x" << std::hex << i << ": bf16 " << bf16[i] << " want " << want_bf16
                      << ", f16 " << f16[i] << " want " << want_f16;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(f16[0x3c00], 1.0f);
  EXPECT_EQ(f16[0x7bff], 65504.0f);
  EXPECT_EQ(f16[0x0001], std::ldexp(1.0f, -24));
  EXPECT_EQ(bf16[0x3f80], 1.0f);
  EXPECT_EQ(bf16[0xc040], -3.0f);
}

TEST(Safetensors, Bf16WriterRoundsToNearestEven) {
  const float one = 1.0f;
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing in [1, 2)
  struct Case {
    float input, expected;
  };
  const std::vector<Case> cases = {
      {one, one},
      {one + ulp / 2, one},                                // tie, 1.0 is even
      {one + 3 * ulp / 2, one + 2 * ulp},                  // tie, rounds up to even
      {one + ulp / 2 + std::ldexp(1.0f, -20), one + ulp},  // just above the tie
      {one + ulp / 2 - std::ldexp(1.0f, -20), one},        // just below the tie
      {-2.0f - ulp, -2.0f},                                // tie at [2, 4) spacing 2·ulp
      {std::numeric_limits<float>::max(), INFINITY},       // overflows like any rounding
      {-INFINITY, -INFINITY},
      {std::ldexp(1.0f, -133), std::ldexp(1.0f, -133)},  // bf16 subnormal, exact
  };
  std::vector<float> inputs;
  for (const Case& c : cases) inputs.push_back(c.input);
  inputs.push_back(std::nanf(""));

  TempDir dir;
  const std::string path = dir.file("bf16.safetensors");
  SafetensorsWriter writer;
  writer.add_bf16("w", {static_cast<int64_t>(inputs.size())}, inputs.data());
  writer.write(path);
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.entry("w").dtype, "BF16");
  std::vector<float> back(inputs.size());
  reader.read_f32("w", {static_cast<int64_t>(inputs.size())}, back.data());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(back[i], cases[i].expected) << "input " << cases[i].input;
  }
  EXPECT_TRUE(std::isnan(back.back()));
}

TEST(Safetensors, ReadErrorsNameTheFileAndTheProblem) {
  TempDir dir;
  const std::vector<uint8_t> four_floats(16, 0);
  std::string path;
  auto next = [&](const std::string& name) { return path = dir.file(name); };

  expect_open_error(next("missing.safetensors"), "missing.safetensors' does not exist");

  write_bytes(next("empty.safetensors"), {});
  expect_open_error(path, "shorter than the 8-byte header length");
  write_bytes(next("short.safetensors"), {1, 0, 0, 0, 0});
  expect_open_error(path, "shorter than the 8-byte header length");

  write_raw_file(next("long_header.safetensors"), "{}", {}, 3);
  expect_open_error(path, "header length 3 is larger");
  write_raw_file(next("huge_header.safetensors"), "{}", {}, UINT64_MAX);
  expect_open_error(path, "is larger");

  write_raw_file(next("bad_json.safetensors"), R"({"w": {"dtype": )", four_floats);
  expect_open_error(path, "invalid JSON");
  write_raw_file(next("array.safetensors"), "[1, 2]", four_floats);
  expect_open_error(path, "not an object");
  write_raw_file(next("not_entry.safetensors"), R"({"w": 3})", four_floats);
  expect_open_error(path, "'w' is not a JSON object");
  write_raw_file(next("no_offsets.safetensors"), R"({"w": {"dtype": "F32", "shape": [4]}})",
                 four_floats);
  expect_open_error(path, "no \"data_offsets\"");

  write_raw_file(next("dtype.safetensors"),
                 R"({"w": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", four_floats);
  expect_open_error(path, "unsupported dtype 'I64'");
  write_raw_file(next("negative_dim.safetensors"),
                 R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", four_floats);
  expect_open_error(path, "dims must be non-negative integers");
  write_raw_file(next("overflow.safetensors"),
                 R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],)"
                 R"( "data_offsets": [0, 16]}})",
                 four_floats);
  expect_open_error(path, "too large");
  write_raw_file(next("reversed.safetensors"),
                 R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [16, 0]}})", four_floats);
  expect_open_error(path, "begin after end");
  write_raw_file(next("size.safetensors"),
                 R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", four_floats);
  expect_open_error(path, "spanning 16 bytes, but shape [3] of F32 needs 12 bytes");
  write_raw_file(next("bounds.safetensors"),
                 R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", four_floats);
  expect_open_error(path, "'w' ends at data byte 24 but the file holds only 16 bytes");
  write_raw_file(next("overlap.safetensors"),
                 R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                 R"( "b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}})",
                 four_floats);
  expect_open_error(path, "tensors 'a' and 'b' overlap");
  write_raw_file(next("metadata.safetensors"), R"({"__metadata__": {"step": 3}})", {});
  expect_open_error(path, "__metadata__ value of 'step' is not a string");

  // A valid file cut short loses the end of its last tensor.
  std::vector<float> values = ramp(6, 1.0f);
  SafetensorsWriter writer;
  writer.add("w", {6}, values.data());
  writer.write(next("truncated.safetensors"));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  expect_open_error(path, "truncated");

  writer.write(next("good.safetensors"));
  SafetensorsReader reader(path);
  std::vector<float> out(6);
  expect_error([&] { reader.read_f32("v", {6}, out.data()); }, path, "no tensor named 'v'");
  expect_error(
      [&] {
        reader.read_f32("w", {2, 3}, out.data());
      },
      path, "'w' has shape [6] but [2, 3] was expected");
  expect_error([&] { reader.entry("v"); }, path, "no tensor named 'v'");
}

// Every prefix and many random corruptions of a valid file either load or throw
// std::runtime_error; nothing else escapes and nothing crashes.
TEST(Safetensors, MalformedFilesNeverCrash) {
  TempDir dir;
  const std::string path = dir.file("fuzz.safetensors");
  std::vector<float> a = ramp(10, 0.5f), b = ramp(6, 2.0f);
  SafetensorsWriter writer;
  writer.add("a", {2, 5}, a.data());
  writer.add_bf16("b", {6}, b.data());
  writer.set_metadata("note", "fuzz");
  writer.write(path);
  const std::vector<uint8_t> good = read_bytes(path);

  auto try_load = [&](const std::vector<uint8_t>& bytes) {
    write_bytes(path, bytes);
    try {
      SafetensorsReader reader(path);
      std::vector<float> out;
      for (const auto& entry : reader.entries()) {
        out.resize(static_cast<size_t>(entry.numel()));
        reader.read_f32(entry.name, entry.shape, out.data());
      }
      return true;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      return false;
    }
  };

  for (size_t length = 0; length < good.size(); ++length) {
    std::vector<uint8_t> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_FALSE(try_load(prefix)) << "prefix of " << length << " bytes loaded";
  }
  std::mt19937 rng(20240601);
  uint64_t header_length;
  std::memcpy(&header_length, good.data(), 8);
  std::uniform_int_distribution<size_t> position(0, 8 + header_length - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes = good;
    for (int flips = 1 + trial % 3; flips > 0; --flips) {
      bytes[position(rng)] = static_cast<uint8_t>(byte(rng));
    }
    try_load(bytes);
  }
  EXPECT_TRUE(try_load(good));
}

TEST(Safetensors, WriterErrors) {
  TempDir dir;
  float value = 1.0f;
  SafetensorsWriter writer;
  writer.add("w", {1}, &value);
  EXPECT_THROW(writer.add("w", {1}, &value), std::runtime_error);
  EXPECT_THROW(writer.add("__metadata__", {1}, &value), std::runtime_error);
  EXPECT_THROW(writer.add("n", {-1}, &value), std::runtime_error);
  EXPECT_THROW(writer.add("x", {2}, nullptr), std::runtime_error);
  const std::string path = dir.file("no/such/dir/out.safetensors");
  expect_error([&] { writer.write(path); }, path, "cannot create");
}

// The pure-python reader/writer in tests/reference is what reference_model.py uses: files
// must cross between it and the C++ code in both directions, bit for bit.
class SafetensorsPython : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPython)) GTEST_SKIP() << kPython << " is not installed";
  }
  std::string python(const std::string& code) const {
    const std::string module_dir = std::string(ULYSSES_SOURCE_DIR) + "/tests/reference";
    auto result =
        testing::run_command(std::string(kPython) + " -c \"import sys; sys.path.insert(0, '" +
                             module_dir + "'); import safetensors_io as st; " + code + "\"");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }
  static constexpr const char* kPython = "/usr/bin/python3";
};

TEST_F(SafetensorsPython, PythonReadsWhatTheWriterWrote) {
  TempDir dir;
  const std::string path = dir.file("cpp.safetensors");
  std::vector<float> weight = ramp(6, 0.1f), bias = ramp(3, -7.0f);
  weight[0] = std::ldexp(1.0f, -140);  // subnormal survives the trip
  SafetensorsWriter writer;
  writer.add("model.weight", {2, 3}, weight.data());
  writer.add_bf16("model.bias", {3}, bias.data());
  writer.set_metadata("loss", "0.1");
  writer.write(path);

  const std::string output =
      python("import json; t, m = st.read_file('" + path +
             "'); print(json.dumps({'metadata': m, 'tensors': {k: {'dtype': d, 'shape': s, "
             "'values': list(v)} for k, (d, s, v) in t.items()}}))");
  nlohmann::json parsed = nlohmann::json::parse(output);
  EXPECT_EQ(parsed["metadata"], (nlohmann::json{{"loss", "0.1"}}));
  const auto& w = parsed["tensors"]["model.weight"];
  EXPECT_EQ(w["dtype"], "F32");
  EXPECT_EQ(w["shape"], (nlohmann::json{2, 3}));
  ASSERT_EQ(w["values"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(w["values"][i].get<double>(), weight[i]);
  const auto& b = parsed["tensors"]["model.bias"];
  EXPECT_EQ(b["dtype"], "BF16");
  ASSERT_EQ(b["values"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b["values"][i].get<double>(), bf16_to_float(float_to_bf16(bias[i])));
  }
}

TEST_F(SafetensorsPython, WriterReadsWhatPythonWrote) {
  TempDir dir;
  const std::string path = dir.file("py.safetensors");
  python("st.write_file('" + path +
         "', [('a', 'F32', [4, 3], [i * 0.37 - 1.5 for i in range(12)]), "
         "('b', 'BF16', [5], [i * 0.37 - 1.5 for i in range(5)])], {'loss': '1.25'})");
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata().at("loss"), "1.25");
  std::vector<float> a(12), b(5);
  reader.read_f32("a", {4, 3}, a.data());
  reader.read_f32("b", {5}, b.data());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a[i], static_cast<float>(i * 0.37 - 1.5));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(b[i], bf16_to_float(float_to_bf16(static_cast<float>(i * 0.37 - 1.5))));
  }
}

}  // namespace
}  // namespace ulysses
