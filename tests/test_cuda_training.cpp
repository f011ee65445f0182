// One whole training step (Model forward/backward + AdamW) on the cuda backend against the
// cpu backend, from the same fp32 weights and batch. The cuda model computes in bf16 (weights
// cast from the fp32 masters, bf16 activations, fp32 gradients), so agreement is within
// stated bf16 tolerances rather than round-off. Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/config.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "kernels/backend.h"
#include "parallel/comm.h"

namespace ulysses {
namespace {

// Loss: relative difference of the mean loss.
constexpr double kLossTolerance = 1e-2;
// Each gradient tensor: max |cuda − cpu| / max |cpu| over the tensor.
constexpr double kGradTolerance = 1e-1;
// All gradients together: cosine similarity of the flat gradient vectors.
constexpr double kMinGradCosine = 0.995;

std::unique_ptr<Backend> cuda_backend_or_reason(std::string& reason, const std::string& attention) {
  try {
    return make_backend("cuda", 0, attention);
  } catch (const std::exception& error) {
    reason = error.what();
    if (reason.find("no CUDA device") == std::string::npos &&
        reason.find("no CUDA backend") == std::string::npos)
      throw;
    return nullptr;
  }
}

Config training_config(const std::string& family) {
  const std::string kv = family == "llama" ? ", n_kv_heads: 2" : "";
  return parse_config("model: {family: " + family + ", n_layers: 2, d_model: 128, n_heads: 4" + kv +
                          ", d_ff: 256, vocab_size: 300, max_seq_len: 160, rope_theta: 10000}\n"
                          "train: {batch_size: 2, seq_len: 160, lr: 0.001, weight_decay: 0.1}\n"
                          "memory: {loss_tile_tokens: 64}\n"
                          "data: {source: synthetic, n_pairs: 1, n_queries: 1, n_keys: 4, "
                          "n_values: 4, n_filler: 4}\n",
                      {}, "cuda-training.yaml");
}

std::vector<float> random_weights(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> weights(size_t(table.total_numel()));
  for (const ParamSpec& spec : table.specs()) {
    const float scale = spec.shape.size() == 2 ? 1.0f / std::sqrt(float(spec.shape[1])) : 0.1f;
    const float center = spec.init == ParamSpec::Init::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < spec.numel; ++i)
      weights[size_t(spec.offset + i)] = center + scale * normal(engine);
  }
  return weights;
}

struct StepOutcome {
  double loss = 0.0;
  std::vector<float> grads, params_after;
};

StepOutcome train_one_step(Backend& backend, const Config& config, const MicroBatch& micro,
                           const std::vector<float>& weights) {
  auto sp = make_local_comm("sp");
  Model model(config, backend, *sp, *sp, micro.batch, micro.seq_local);
  model.load_weights(weights.data());
  int64_t counted = 0;
  for (int32_t target : micro.targets) counted += target >= 0;
  model.zero_grads();
  LossResult loss = model.forward_backward(micro, 1.0f / float(counted));
  StepOutcome outcome;
  outcome.loss = loss.loss_sum / double(loss.count);
  outcome.grads.resize(size_t(model.num_params()));
  model.download_gradients(outcome.grads.data());
  AdamW optimizer(backend, model.table(), config.train, model.state().layout());
  optimizer.update(model.state().master(), model.state().gradient_shard(), float(config.train.lr),
                   1.0f, 1);
  outcome.params_after.resize(size_t(model.num_params()));
  model.download_weights(outcome.params_after.data());
  return outcome;
}

// (family, kernels.attention)
class CudaTraining : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaTraining, OneStepMatchesCpuWithinBf16Tolerances) {
  std::string reason;
  std::unique_ptr<Backend> gpu = cuda_backend_or_reason(reason, std::get<1>(GetParam()));
  if (!gpu) GTEST_SKIP() << reason;
  auto cpu = make_backend("cpu", 0);
  const Config config = training_config(std::get<0>(GetParam()));
  const ParamTable table(config.model);
  const std::vector<float> weights = random_weights(table, 21);

  MicroBatch micro;
  micro.batch = config.train.batch_size;
  micro.seq_local = config.train.seq_len;
  std::mt19937 engine(5);
  for (int64_t i = 0; i < micro.batch * micro.seq_local; ++i) {
    micro.inputs.push_back(int32_t(engine() % uint32_t(config.model.vocab_size)));
    micro.targets.push_back(i % 9 == 4 ? -1
                                       : int32_t(engine() % uint32_t(config.model.vocab_size)));
  }

  const StepOutcome expected = train_one_step(*cpu, config, micro, weights);
  const StepOutcome actual = train_one_step(*gpu, config, micro, weights);

  EXPECT_NEAR(actual.loss, expected.loss, kLossTolerance * expected.loss);
  double dot = 0.0, norm_actual = 0.0, norm_expected = 0.0;
  for (const ParamSpec& spec : table.specs()) {
    double max_error = 0.0, max_expected = 0.0;
    for (int64_t i = spec.offset; i < spec.offset + spec.numel; ++i) {
      const double a = actual.grads[size_t(i)], e = expected.grads[size_t(i)];
      max_error = std::max(max_error, std::abs(a - e));
      max_expected = std::max(max_expected, std::abs(e));
      dot += a * e;
      norm_actual += a * a;
      norm_expected += e * e;
    }
    EXPECT_LT(max_error / std::max(max_expected, 1e-30), kGradTolerance) << spec.name;
  }
  EXPECT_GT(dot / std::sqrt(norm_actual * norm_expected), kMinGradCosine);

  // At step 1 AdamW moves every weight by at most lr (plus decay), whatever the gradient:
  // where the backends' gradients differ in sign the updates differ by at most 2·lr.
  const double lr = config.train.lr;
  double max_param_difference = 0.0;
  for (size_t i = 0; i < actual.params_after.size(); ++i)
    max_param_difference = std::max(
        max_param_difference, std::abs(double(actual.params_after[i]) - expected.params_after[i]));
  EXPECT_LE(max_param_difference, 2.5 * lr);
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndAttention, CudaTraining,
    ::testing::Combine(::testing::Values(std::string("llama"), std::string("gpt2")),
                       ::testing::Values(std::string("native"), std::string("cudnn"))),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

}  // namespace
}  // namespace ulysses
