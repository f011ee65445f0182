// The whole model against an independent PyTorch implementation (tests/reference):
// the same weights and batch give the same loss and every parameter gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;

bool torch_available() {
  return testing::run_command("/usr/bin/python3 -c 'import torch'").exit_code == 0;
}

Config reference_config(const std::string& family) {
  std::string kv = family == "llama" ? ", n_kv_heads: 2" : "";
  return parse_config("model: {family: " + family + ", n_layers: 2, d_model: 32, n_heads: 4" + kv +
                          ", d_ff: 48, vocab_size: 61, max_seq_len: 24, rope_theta: 500}\n"
                          "train: {batch_size: 2, seq_len: 24}\n"
                          "data: {source: synthetic, n_pairs: 1, n_queries: 1, n_keys: 4, "
                          "n_values: 4, n_filler: 4}\n",
                      {}, "reference.yaml");
}

// Weights large enough that attention, RoPE and the norms visibly shape the loss.
std::vector<float> random_weights(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> weights(size_t(table.total_numel()));
  for (const ParamSpec& spec : table.specs()) {
    float scale = spec.shape.size() == 2 ? 1.0f / std::sqrt(float(spec.shape[1])) : 0.2f;
    if (spec.role == ParamRole::token_embedding || spec.role == ParamRole::position_embedding)
      scale = 0.5f;
    float center = spec.init == ParamSpec::Init::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < spec.numel; ++i)
      weights[size_t(spec.offset + i)] = center + scale * normal(engine);
  }
  return weights;
}

// With documents, PyTorch gets them as "document_starts" and masks block-diagonally, with
// positions restarting per document (tests/reference/reference_model.py).
void expect_matches_pytorch(const std::string& family, const Documents& documents) {
  Config config = reference_config(family);
  const ModelConfig& m = config.model;
  const int64_t batch = 2, seq = 24;

  auto backend = make_backend(BackendKind::cpu, 0);
  auto sp = make_local_comm("sp");
  Model model(config, *backend, *sp, *sp, batch, seq);
  std::vector<float> weights = random_weights(model.table(), 11);
  model.load_weights(weights.data());

  MicroBatch micro;
  micro.batch = batch;
  micro.seq_local = seq;
  micro.documents = documents;
  std::mt19937 engine(3);
  nlohmann::json inputs = nlohmann::json::array(), targets = nlohmann::json::array();
  for (int64_t b = 0; b < batch; ++b) {
    nlohmann::json row_in = nlohmann::json::array(), row_target = nlohmann::json::array();
    for (int64_t t = 0; t < seq; ++t) {
      int32_t token = int32_t(engine() % uint32_t(m.vocab_size));
      int32_t target = (t % 5 == 3) ? -1 : int32_t(engine() % uint32_t(m.vocab_size));
      micro.inputs.push_back(token);
      micro.targets.push_back(target);
      row_in.push_back(token);
      row_target.push_back(target);
    }
    inputs.push_back(row_in);
    targets.push_back(row_target);
  }
  int64_t counted = 0;
  for (int32_t t : micro.targets) counted += t >= 0;

  model.zero_grads();
  LossResult loss = model.forward_backward(micro, 1.0f / float(counted));
  const double our_loss = loss.loss_sum / double(loss.count);

  TempDir dir;
  nlohmann::json config_json = {{"family", name_of(m.family)}, {"n_layers", m.n_layers},
                                {"d_model", m.d_model},        {"n_heads", m.n_heads},
                                {"n_kv_heads", m.n_kv_heads},  {"d_ff", m.d_ff},
                                {"vocab_size", m.vocab_size},  {"max_seq_len", m.max_seq_len},
                                {"rope_theta", m.rope_theta},  {"norm_eps", m.norm_eps}};
  testing::write_text_file(dir.file("config.json"), config_json.dump());
  nlohmann::json batch_json = {{"inputs", inputs}, {"targets", targets}};
  if (!documents.none()) batch_json["document_starts"] = documents.starts;
  testing::write_text_file(dir.file("batch.json"), batch_json.dump());
  SafetensorsWriter writer;
  for (const ParamSpec& spec : model.table().specs())
    writer.add(spec.name, spec.shape, weights.data() + spec.offset);
  writer.write(dir.file("weights.safetensors"));

  auto result = testing::run_command(
      "/usr/bin/python3 " ULYSSES_SOURCE_DIR "/tests/reference/reference_model.py " + dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  SafetensorsReader reference(dir.file("reference.safetensors"));
  const double reference_loss = std::stod(reference.metadata().at("loss"));
  EXPECT_NEAR(our_loss, reference_loss, 1e-4 * std::abs(reference_loss));

  std::vector<float> grads(size_t(model.num_params()));
  model.download_gradients(grads.data());
  for (const ParamSpec& spec : model.table().specs()) {
    std::vector<float> expected(size_t(spec.numel));
    reference.read_f32(spec.name, spec.shape, expected.data());
    double max_error = 0.0, max_expected = 0.0;
    for (int64_t i = 0; i < spec.numel; ++i) {
      max_error = std::max(max_error,
                           double(std::abs(grads[size_t(spec.offset + i)] - expected[size_t(i)])));
      max_expected = std::max(max_expected, double(std::abs(expected[size_t(i)])));
    }
    EXPECT_GT(max_expected, 0.0) << spec.name << " has a zero reference gradient";
    EXPECT_LE(max_error, 1e-4 * max_expected) << spec.name << ": max |ours - torch| = " << max_error
                                              << ", max |torch| = " << max_expected;
  }
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, LossAndEveryGradientMatchPyTorch) {
  if (!torch_available()) GTEST_SKIP() << "/usr/bin/python3 with torch (python3-torch) is absent";
  expect_matches_pytorch(GetParam(), Documents{});
}

TEST_P(ReferenceTest, PackedDocumentsMatchPyTorch) {
  if (!torch_available()) GTEST_SKIP() << "/usr/bin/python3 with torch (python3-torch) is absent";
  // Three documents in the first sequence, two in the second; one of a single token.
  expect_matches_pytorch(GetParam(), Documents{{{0, 7, 15, 16}, {0, 11}}});
}

INSTANTIATE_TEST_SUITE_P(Families, ReferenceTest, ::testing::Values("llama", "gpt2"));

}  // namespace
}  // namespace ulysses
