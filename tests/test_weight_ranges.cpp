// Weights by flat range (docs/memory.md, "Host memory per rank"): the counter-based initial
// weights, the table's split of a range into tensor pieces, a safetensors file written in
// place by pieces, ranged reads, and the host copy of a rank's stored weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/param_init.h"
#include "core/params.h"
#include "core/safetensors.h"
#include "core/safetensors_placed.h"
#include "kernels/backend.h"
#include "parallel/local_comm.h"
#include "parallel/zero_state.h"

namespace ulysses {
namespace {

ModelConfig small_llama() {
  ModelConfig model;
  model.family = Family::llama;
  model.n_layers = 2;
  model.d_model = 16;
  model.n_heads = 4;
  model.n_kv_heads = 2;
  model.d_ff = 24;
  model.vocab_size = 50;
  model.max_seq_len = 64;
  return model;
}

std::vector<float> whole_init(const ParamTable& table, int n_layers, uint64_t seed) {
  std::vector<float> values(size_t(table.total_numel()));
  initial_weights(table, n_layers, seed, 0, table.total_numel(), values.data());
  return values;
}

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

TEST(TensorPieces, SplitARangeAtTensorBoundariesInFlatOrder) {
  const ParamTable table(small_llama());
  const ParamSpec& embedding = table.specs()[0];
  const ParamSpec& norm = table.specs()[1];
  std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> pieces;
  // The last 3 elements of the embedding, the whole norm weight, 2 of the q weight.
  const int64_t begin = embedding.numel - 3;
  for_each_tensor_piece(table, begin, 3 + norm.numel + 2,
                        [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
                          pieces.emplace_back(spec.name, first, n, done);
                        });
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0],
            std::make_tuple(embedding.name, embedding.numel - 3, int64_t(3), int64_t(0)));
  EXPECT_EQ(pieces[1], std::make_tuple(norm.name, int64_t(0), norm.numel, int64_t(3)));
  EXPECT_EQ(pieces[2],
            std::make_tuple(table.specs()[2].name, int64_t(0), int64_t(2), 3 + norm.numel));
  EXPECT_THROW(for_each_tensor_piece(table, table.total_numel() - 1, 2,
                                     [](const ParamSpec&, int64_t, int64_t, int64_t) {}),
               std::out_of_range);
}

// The values are pinned: a change of generator changes every run's initial weights.
TEST(InitialWeights, ArePinnedForASeed) {
  EXPECT_EQ(bits_of(float(counter_normal(1234, 0))), 0x3f27c051u);
  EXPECT_EQ(bits_of(float(counter_normal(1234, 1))), 0xc0035d6eu);
  EXPECT_EQ(bits_of(float(counter_normal(1234, 1000000))), 0xbd86cafeu);
  EXPECT_EQ(bits_of(float(counter_normal(99, 0))), 0x3f5a4c48u);
}

TEST(InitialWeights, AnyRangeEqualsThatPartOfTheWhole) {
  const ModelConfig model = small_llama();
  const ParamTable table(model);
  const std::vector<float> whole = whole_init(table, model.n_layers, 7);
  for (int64_t begin : {int64_t(0), int64_t(1), int64_t(799), table.total_numel() - 5}) {
    for (int64_t count : {int64_t(1), int64_t(5), int64_t(333)}) {
      if (begin + count > table.total_numel()) continue;
      std::vector<float> part(static_cast<size_t>(count));
      initial_weights(table, model.n_layers, 7, begin, count, part.data());
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(bits_of(part[size_t(i)]), bits_of(whole[size_t(begin + i)]))
            << "element " << begin + i << " made from [" << begin << ", " << begin + count << ")";
    }
  }
  EXPECT_NE(whole_init(table, model.n_layers, 8), whole);
}

TEST(InitialWeights, FollowEachTensorsKind) {
  ModelConfig model = small_llama();
  model.d_model = 64;
  model.vocab_size = 2000;
  model.n_layers = 8;
  const ParamTable table(model);
  const std::vector<float> values = whole_init(table, model.n_layers, 3);
  auto stddev_of = [&](ParamRole role, int layer) {
    const ParamSpec& spec = table.find(role, layer);
    double sum = 0.0, squares = 0.0;
    for (int64_t i = 0; i < spec.numel; ++i) {
      sum += values[size_t(spec.offset + i)];
      squares += double(values[size_t(spec.offset + i)]) * values[size_t(spec.offset + i)];
    }
    EXPECT_LT(std::abs(sum / double(spec.numel)), 0.002) << spec.name;
    return std::sqrt(squares / double(spec.numel));
  };
  // 128000 samples: the sample deviation is within 1% of the true one with near certainty.
  EXPECT_NEAR(stddev_of(ParamRole::token_embedding, -1), 0.02, 0.0002);
  EXPECT_NEAR(stddev_of(ParamRole::lm_head, -1), 0.02, 0.0002);
  // Residual projections: 0.02 / sqrt(2 · 8) = 0.005 (4096 samples: within 5%).
  EXPECT_NEAR(stddev_of(ParamRole::o_weight, 3), 0.005, 0.00025);
  const ParamSpec& norm = table.find(ParamRole::attn_norm_weight, 1);
  for (int64_t i = 0; i < norm.numel; ++i) ASSERT_EQ(values[size_t(norm.offset + i)], 1.0f);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(PlacedSafetensors, PiecesWrittenInAnyOrderMakeTheSameFileAsTheWriter) {
  const std::string dir = ::testing::TempDir() + "/placed_safetensors";
  std::filesystem::create_directories(dir);
  std::vector<float> a(12), b(7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * float(i) - 2.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f / float(i + 1);
  SafetensorsWriter writer;
  writer.add("a", {3, 4}, a.data());
  writer.add("b", {7}, b.data());
  writer.set_metadata("format", "ulysses");
  writer.write(dir + "/whole.safetensors");

  const std::string path = dir + "/placed.safetensors";
  const std::string header =
      placed_safetensors_header({{"a", {3, 4}}, {"b", {7}}}, {{"format", "ulysses"}}, path);
  create_placed_safetensors(path, header, (a.size() + b.size()) * sizeof(float));
  std::vector<float> flat(a);
  flat.insert(flat.end(), b.begin(), b.end());
  PlacedSafetensorsWriter placed(path, header.size());
  placed.write(10, 9, flat.data() + 10);  // across the two tensors
  placed.write(0, 10, flat.data());
  placed.finish();
  EXPECT_EQ(file_bytes(path), file_bytes(dir + "/whole.safetensors"));

  const SafetensorsReader reader(path);
  std::vector<float> part(3);
  reader.read_f32_range("a", 5, 3, part.data());
  EXPECT_EQ(part, std::vector<float>(a.begin() + 5, a.begin() + 8));
  EXPECT_THROW(reader.read_f32_range("b", 5, 3, part.data()), std::logic_error);
  std::filesystem::remove_all(dir);
}

TEST(StoredWeights, GiveBackWhatARankStoredToAStateOfTheSameLayout) {
  auto backend = make_backend(BackendKind::cpu, 0);
  std::unique_ptr<Comm> world = make_local_comm(*backend);
  const std::vector<int64_t> unit_ends = {10, 25, 31};
  std::vector<float> host(31);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.25f;
  ZeroState first(*backend, *world, 0, unit_ends);
  first.upload_weights(host.data());
  StoredWeights stored;
  first.download_stored_weights(
      [&](int64_t begin, int64_t count, const float* values) { stored.add(begin, count, values); });
  ZeroState second(*backend, *world, 0, unit_ends);
  second.upload_weights(
      [&](int64_t begin, int64_t count, float* out) { stored.read(begin, count, out); });
  std::vector<float> back(31);
  second.download_weights(back.data());
  EXPECT_EQ(back, host);
  float out[4];
  EXPECT_THROW(stored.read(29, 4, out), std::logic_error);
}

}  // namespace
}  // namespace ulysses
