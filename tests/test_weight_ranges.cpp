// Weights by flat range (docs/memory.md, "Host memory per rank"): the counter-based initial
// weights, the table's split of a range into tensor pieces, a safetensors file written in
// place by pieces, ranged reads, and the host copy of a rank's stored weights.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/safetensors_placed.h"
#include "core/model/param_init.h"
#include "core/model/params.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
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

// The weights as the serial code before the parallel one made them: element by element from
// counter_normal (glibc's log, sqrt and cos), rounded to float once.
std::vector<float> serial_init(const ParamTable& table, int n_layers, uint64_t seed, int64_t begin,
                               int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  const double stddev = 0.02, residual_stddev = 0.02 / std::sqrt(2.0 * double(n_layers));
  for_each_tensor_piece(table, begin, count,
                        [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
                          for (int64_t i = 0; i < n; ++i) {
                            const uint64_t element = uint64_t(spec.offset + first + i);
                            float& value = values[size_t(done + i)];
                            switch (spec.init) {
                              case ParamSpec::Init::normal:
                                value = float(counter_normal(seed, element) * stddev);
                                break;
                              case ParamSpec::Init::residual_normal:
                                value = float(counter_normal(seed, element) * residual_stddev);
                                break;
                              case ParamSpec::Init::ones:
                                value = 1.0f;
                                break;
                              case ParamSpec::Init::zeros:
                                value = 0.0f;
                                break;
                            }
                          }
                        });
  return values;
}

// FNV-1a over the values' bits.
uint64_t checksum(const std::vector<float>& values) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (float value : values) {
    const uint32_t bits = bits_of(value);
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (bits >> (8 * byte)) & 0xffu;
      hash *= 0x100000001b3ull;
    }
  }
  return hash;
}

// Runs make with each of these OpenMP thread counts, restoring the count after.
void for_thread_counts(const std::function<void(int threads)>& make) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    make(threads);
  }
  omp_set_num_threads(before);
}

// The 253M-parameter Llama of scripts/bench-startup.sh.
ModelConfig llama_253m() {
  ModelConfig model;
  model.family = Family::llama;
  model.n_layers = 2;
  model.d_model = 2048;
  model.n_heads = 32;
  model.n_kv_heads = 8;
  model.d_ff = 8192;
  model.vocab_size = 32000;
  return model;
}

// Pinned: checksums of ranges of the 253M model as the serial code of ef04caa made them
// (before the weights were made in parallel and with approximate_cos). Every golden value of
// a training run stands on these bits.
TEST(InitialWeights, RangesOfA253MModelHaveTheSerialCodesChecksums) {
  const ModelConfig model = llama_253m();
  const ParamTable table(model);
  const int64_t total = table.total_numel();
  const int64_t norm = table.find(ParamRole::attn_norm_weight, 0).offset;
  const int64_t residual = table.find(ParamRole::o_weight, 1).offset;
  struct Pinned {
    uint64_t seed;
    int64_t begin, count;
    uint64_t checksum;
  };
  const Pinned pinned[] = {
      {1, 0, 1 << 20, 0xb96e0fd07824f29cull},
      {1, norm - 1000, 300001, 0xad5fa968b6f53c96ull},  // the embedding's end, norm weights (1), q
      {1, residual + 12345, 1 << 20, 0x4e53d27bcf72571bull},  // N(0, 0.02 / sqrt(4))
      {1, total - (1 << 20) - 7, (1 << 20) + 7, 0xde1267c857d03e76ull},
      {20240917, 0, 1 << 20, 0xafaf6d3952c83cf8ull},
      {20240917, residual + 12345, 1 << 20, 0x8d66e239ac2f211dull},
  };
  for_thread_counts([&](int threads) {
    for (const Pinned& range : pinned) {
      std::vector<float> values(size_t(range.count));
      initial_weights(table, model.n_layers, range.seed, range.begin, range.count, values.data());
      EXPECT_EQ(checksum(values), range.checksum)
          << "seed " << range.seed << ", [" << range.begin << ", " << range.begin + range.count
          << ") on " << threads << " threads";
    }
  });
}

// Bit for bit the serial formula, element by element, for every kind of tensor, several
// seeds, ranges that start and end anywhere, and any number of threads: about 2 samples in
// 10^4 take glibc's cos (a few hundred here), the rest approximate_cos.
TEST(InitialWeights, EqualTheSerialFormulaBitForBitOnAnyThreadCount) {
  ModelConfig model = small_llama();
  model.d_model = 256;
  model.d_ff = 704;
  model.n_layers = 3;
  model.vocab_size = 3001;
  const ParamTable table(model);
  const int64_t total = table.total_numel();
  ASSERT_GT(total, 2000000);
  for (uint64_t seed : {uint64_t(0), uint64_t(7), uint64_t(0xfeedfacecafebeefull)}) {
    const std::vector<float> serial = serial_init(table, model.n_layers, seed, 0, total);
    for_thread_counts([&](int threads) {
      for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
               {0, total}, {1, 12345}, {total / 3 + 17, total / 2}, {total - 999, 999}}) {
        std::vector<float> values(static_cast<size_t>(count));
        initial_weights(table, model.n_layers, seed, begin, count, values.data());
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(bits_of(values[size_t(i)]), bits_of(serial[size_t(begin + i)]))
              << "element " << begin + i << " of [" << begin << ", " << begin + count << "), seed "
              << seed << ", " << threads << " threads";
      }
    });
  }
}

// Weights that one approximation alone would round one ulp off, each found by a search of
// seed 1's first 4·10^8 samples (the only one there): with approximate_cos and glibc's log,
// element 327505975 would be 0xbc53046d; with approximate_log and glibc's cos, element
// 396153433 would be 0xbbd7f059. The margin leaves both to glibc.
TEST(InitialWeights, TakeGlibcsFunctionsWhereAnApproximationWouldRoundOtherwise) {
  ModelConfig model = small_llama();
  model.d_model = 2048;
  model.vocab_size = 200000;  // an embedding of 409.6M elements, N(0, 0.02)
  const ParamTable table(model);
  const std::pair<int64_t, uint32_t> cases[] = {{327505975, 0xbc53046eu}, {396153433, 0xbbd7f058u}};
  for (const auto& [case_element, glibc_bits] : cases) {
    const int64_t element = case_element;  // clang 14 cannot capture a structured binding
    ASSERT_LT(element, table.find(ParamRole::token_embedding).numel);
    const uint32_t glibc = bits_of(float(counter_normal(1, element) * 0.02));
    EXPECT_EQ(glibc, glibc_bits) << "element " << element;
    for_thread_counts([&](int threads) {
      for (int64_t before : {0, 1, 255, 300}) {  // where the element falls in its block
        std::vector<float> values(size_t(before + 1));
        initial_weights(table, model.n_layers, 1, element - before, before + 1, values.data());
        EXPECT_EQ(bits_of(values.back()), glibc)
            << "element " << element << ", " << before << " before, " << threads << " threads";
      }
    });
  }
}

// The bound that initial_weights's choice between approximate_cos and glibc's cos rests on,
// over the whole range of angles, densely near the quadrant boundaries (where the reduction
// changes polynomial) and near the zeros of the cosine.
TEST(InitialWeights, ApproximateCosIsWithinItsBound) {
  double worst = 0.0, worst_angle = 0.0;
  auto check = [&](double angle) {
    if (angle < 0.0 || angle > 2.0 * M_PI) return;
    const double error = std::abs(approximate_cos(angle) - std::cos(angle));
    if (error > worst) worst = error, worst_angle = angle;
  };
  const int steps = 4000000;
  for (int i = 0; i <= steps; ++i) check(2.0 * M_PI * double(i) / steps);
  for (int eighth = 0; eighth <= 16; ++eighth)
    for (int i = -20000; i <= 20000; ++i) {
      check(double(eighth) * M_PI / 4.0 + double(i) * 1e-15);
      check(double(eighth) * M_PI / 4.0 + double(i) * 1e-9);
    }
  // glibc's cos is within an ulp (2^-53 here) of the exact value.
  EXPECT_LE(worst, kApproximateCosError + 0x1p-53) << "at angle " << worst_angle;
}

// The same for approximate_log, relative to the log, over the radii's inputs (multiples of
// 2^-53 in (0, 1]): densely just below 1 (where the log is tiny and only a relative bound
// helps), around every power of two and every √2 · 2^e (where the split changes exponent),
// and spread over each binade.
TEST(InitialWeights, ApproximateLogIsWithinItsBound) {
  double worst = 0.0, worst_u = 0.0;
  auto check = [&](double u) {
    if (!(u > 0.0 && u <= 1.0)) return;
    const double exact = std::log(u);
    const double error = exact == 0.0 ? std::abs(approximate_log(u))
                                      : std::abs((approximate_log(u) - exact) / exact);
    if (error > worst) worst = error, worst_u = u;
  };
  for (int64_t k = 0; k < 2000000; ++k) check(1.0 - double(k) * 0x1p-53);
  for (int binade = 0; binade <= 53; ++binade) {
    const double power = std::ldexp(1.0, -binade);
    for (double edge : {power, power * M_SQRT2})
      for (int i = -20000; i <= 20000; ++i) check(edge + double(i) * 0x1p-53 * power);
    for (int i = 0; i < 100000; ++i) check(power * (1.0 + double(i) / 100000.0));
  }
  // glibc's log is within an ulp (2^-52 of it) of the exact value.
  EXPECT_LE(worst, kApproximateLogError + 0x1p-52) << "at u = " << worst_u;
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

// Where host memory is apart from the backend's, the weights travel through two halves of a
// staging block, the next piece made while the last one travels. This backend's uploads land
// only when waited for: a half refilled before its upload was waited for would land the
// wrong values.
TEST(StagedUpload, WeightsThroughStagingHalvesLandWhereTheyBelong) {
  CpuBackend backend;
  backend.treat_host_memory_as_separate();
  std::unique_ptr<Comm> world = make_local_comm(backend);
  const std::vector<int64_t> unit_ends = {10, 25, 31};  // the largest unit: 15 elements
  std::vector<float> host(31);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.5f - 3.0f;
  ZeroState state(backend, *world, 0, unit_ends);
  std::vector<std::pair<int64_t, int64_t>> asked;
  state.upload_weights([&](int64_t begin, int64_t count, float* out) {
    asked.emplace_back(begin, count);
    std::copy_n(host.begin() + begin, count, out);
  });
  std::vector<float> back(31);
  state.download_weights(back.data());
  EXPECT_EQ(back, host);
  // Halves of 7 floats (two of them make at most one unit), in flat order, each inside one
  // of the pieces of a unit that download_stored_weights hands out.
  const std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 7},  {7, 7},  {14, 1}, {15, 7},
                                                           {22, 7}, {29, 1}, {30, 1}};
  EXPECT_EQ(asked, pieces);
}

}  // namespace
}  // namespace ulysses
