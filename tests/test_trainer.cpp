// The single-rank trainer: learning, determinism, gradient accumulation, memory bounds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/train/optimizer.h"
#include "core/train/stop_signal.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace ulysses {
namespace {

Config tiny_config(const std::string& family) {
  std::string yaml =
      "model: {family: " + family +
      ", n_layers: 2, d_model: 32, n_heads: 4, d_ff: 64}\n"
      "train: {steps: 40, batch_size: 4, seq_len: 64, lr: 3.0e-3, warmup_steps: 5, seed: 7}\n"
      "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n";
  return parse_config(yaml, {}, "test.yaml");
}

struct TrainerRun {
  std::unique_ptr<Backend> backend = make_backend(BackendKind::cpu, 0);
  std::unique_ptr<Comm> world = make_local_comm();
  Mesh mesh;
  std::unique_ptr<Trainer> trainer;
  explicit TrainerRun(const Config& config) {
    backend->set_num_threads(2);
    mesh = make_mesh(*world, 1);
    trainer = std::make_unique<Trainer>(config, *backend, mesh);
  }
};

std::vector<double> losses(const Config& config, int steps) {
  TrainerRun run(config);
  std::vector<double> result;
  for (int i = 0; i < steps; ++i) result.push_back(run.trainer->train_step().loss);
  return result;
}

TEST(Trainer, LossFallsOnTheSyntheticTask) {
  for (const char* family : {"llama", "gpt2"}) {
    Config config = tiny_config(family);
    std::vector<double> history = losses(config, 40);
    double first = (history[0] + history[1] + history[2]) / 3;
    double last = (history[37] + history[38] + history[39]) / 3;
    EXPECT_LT(last, first - 0.5) << family << ": loss went from " << first << " to " << last;
  }
}

TEST(Trainer, SameSeedGivesBitIdenticalLosses) {
  Config config = tiny_config("llama");
  std::vector<double> a = losses(config, 8);
  std::vector<double> b = losses(config, 8);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  config.train.seed = 8;
  std::vector<double> c = losses(config, 1);
  EXPECT_NE(a[0], c[0]);
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  Config big = tiny_config("gpt2");
  big.train.batch_size = 4;
  Config accumulated = big;
  accumulated.train.batch_size = 2;
  accumulated.train.grad_accum = 2;
  TrainerRun a(big), b(accumulated);
  for (int step = 0; step < 3; ++step) {
    StepResult ra = a.trainer->train_step();
    StepResult rb = b.trainer->train_step();
    EXPECT_NEAR(ra.loss, rb.loss, 1e-5 * std::abs(ra.loss)) << "step " << step + 1;
    EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-4 * ra.grad_norm) << "step " << step + 1;
  }
}

TEST(Trainer, EvaluationReportsLossAndAccuracy) {
  Config config = tiny_config("llama");
  config.train.eval_every = 1;
  TrainerRun run(config);
  EvalResult eval = run.trainer->evaluate();
  EXPECT_GT(eval.tokens, 0);
  EXPECT_GT(eval.loss, 0.0);
  EXPECT_GE(eval.accuracy, 0.0);
  EXPECT_LE(eval.accuracy, 1.0);
  // Chance level at initialisation: loss near log(vocab).
  EXPECT_NEAR(eval.loss, std::log(double(config.model.vocab_size)), 1.0);
}

TEST(Trainer, LogitsForTheWholeSliceAreNeverAllocated) {
  Config config = tiny_config("llama");
  config.data.source = DataSource::synthetic;
  config.model.vocab_size = 4096;  // big vocabulary, few answer tokens
  config.memory.loss_tile_tokens = 16;
  TrainerRun run(config);
  run.backend->memory().reset_peaks();
  run.trainer->train_step();
  const int64_t rows = int64_t(config.train.batch_size) * config.train.seq_len;
  const int64_t logits_bytes = rows * config.model.vocab_size * 4;
  EXPECT_LT(run.backend->memory().peak(MemCategory::workspace), logits_bytes / 4);
  EXPECT_LT(run.backend->memory().stats().total_peak -
                run.backend->memory().current(MemCategory::params) -
                run.backend->memory().current(MemCategory::grads) -
                run.backend->memory().current(MemCategory::optimizer),
            logits_bytes);
}

TEST(Trainer, AttentionMemoryGrowsLinearlyWithSequenceLength) {
  auto attention_peak = [](int seq_len) {
    Config config = tiny_config("llama");
    config.train.seq_len = seq_len;
    config.model.max_seq_len = seq_len;
    config.train.batch_size = 1;
    TrainerRun run(config);
    run.backend->memory().reset_peaks();
    run.trainer->train_step();
    return run.backend->memory().peak(MemCategory::attention);
  };
  int64_t at_512 = attention_peak(512), at_1024 = attention_peak(1024);
  EXPECT_LE(double(at_1024) / double(at_512), 2.05) << at_512 << " -> " << at_1024;
  EXPECT_GT(double(at_1024) / double(at_512), 1.5);
}

TEST(Trainer, LayerCheckpointingGivesBitIdenticalTraining) {
  for (const char* family : {"llama", "gpt2"}) {
    Config plain = tiny_config(family);
    Config recomputed = plain;
    recomputed.memory.activation_checkpointing = ActivationCheckpointing::layer;
    TrainerRun a(plain), b(recomputed);
    for (int step = 0; step < 3; ++step)
      EXPECT_EQ(a.trainer->train_step().loss, b.trainer->train_step().loss) << family;
    std::vector<float> pa(size_t(a.trainer->model().num_params())), pb(pa.size());
    a.trainer->model().download_weights(pa.data());
    b.trainer->model().download_weights(pb.data());
    EXPECT_EQ(pa, pb) << family;
  }
}

// The trainer tests of tests/mpi compare bits (tests/mpi/schedule_test.cpp) and bounds on one
// thread, where other machines may run more. With the portable GEMM every cpu op, and so a
// whole step, gives the same bits for any thread count (docs/design.md, "Bits that do not
// depend on the machine").
TEST(Trainer, WithThePortableGemmTheThreadCountChangesNoBit) {
  for (const char* family : {"llama", "gpt2"}) {
    const Config config = tiny_config(family);
    std::vector<double> first_losses;
    std::vector<float> first_weights;
    for (const int threads : {1, 2, 3}) {
      CpuBackend backend(0);
      backend.use_gemm(CpuGemm::portable);
      backend.set_num_threads(threads);
      std::unique_ptr<Comm> world = make_local_comm();
      Mesh mesh = make_mesh(*world, 1);
      Trainer trainer(config, backend, mesh);
      std::vector<double> losses;
      for (int step = 0; step < 3; ++step) losses.push_back(trainer.train_step().loss);
      std::vector<float> weights(size_t(trainer.model().num_params()));
      trainer.model().download_weights(weights.data());
      if (threads == 1) {
        first_losses = losses;
        first_weights = weights;
        continue;
      }
      EXPECT_EQ(losses, first_losses) << family << ", " << threads << " threads against 1";
      EXPECT_EQ(weights, first_weights) << family << ", " << threads << " threads against 1";
    }
  }
}

// A mesh made without the config's ring (make_mesh's default) trained plain Ulysses under a
// config that says ring 2; plan_test's ring points compared the plan with such a run.
TEST(Trainer, RefusesAMeshMadeForAnotherSpOrRing) {
  std::unique_ptr<Backend> backend = make_backend(BackendKind::cpu, 0);
  std::unique_ptr<Comm> world = make_local_comm();
  Mesh mesh = make_mesh(*world, 1);
  for (const char* parallel : {"parallel.sp=2", "parallel.ring=2"}) {
    Config config = tiny_config("llama");
    config = parse_config(config_to_yaml(config), {parallel}, "test.yaml");
    try {
      Trainer trainer(config, *backend, mesh);
      ADD_FAILURE() << parallel << " on a mesh of sp 1 x ring 1 was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("the trainer's mesh is sp 1 x ring 1"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(Trainer, LayerCheckpointingKeepsOneBlockOfActivations) {
  struct Peaks {
    int64_t activations, attention, checkpoints;
  };
  auto peaks = [](int layers, ActivationCheckpointing checkpointing) {
    Config config = tiny_config("llama");
    config.model.n_layers = layers;
    config.memory.activation_checkpointing = checkpointing;
    TrainerRun run(config);
    run.backend->memory().reset_peaks();
    run.trainer->train_step();
    const MemoryTracker& memory = run.backend->memory();
    return Peaks{memory.peak(MemCategory::activations), memory.peak(MemCategory::attention),
                 memory.peak(MemCategory::checkpoints)};
  };
  Config config = tiny_config("llama");
  const int64_t block_input_bytes =
      int64_t(config.train.batch_size) * config.train.seq_len * config.model.d_model * 4;
  Peaks two = peaks(2, ActivationCheckpointing::layer),
        four = peaks(4, ActivationCheckpointing::layer);
  EXPECT_EQ(four.activations, two.activations);
  EXPECT_EQ(four.attention, two.attention);
  EXPECT_EQ(four.checkpoints - two.checkpoints, 2 * block_input_bytes);
  // Without checkpointing every block keeps its activations.
  Peaks plain_two = peaks(2, ActivationCheckpointing::none),
        plain_four = peaks(4, ActivationCheckpointing::none);
  EXPECT_GT(plain_four.activations - plain_two.activations, 2 * block_input_bytes);
  EXPECT_EQ(plain_four.checkpoints, 0);
}

TEST(Schedule, WarmupThenCosineLinearOrConstant) {
  TrainConfig train;
  train.steps = 110;
  train.lr = 1.0;
  train.min_lr = 0.1;
  train.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(learning_rate(train, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(train, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(train, 10), 1.0);
  EXPECT_NEAR(learning_rate(train, 109), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(train, 10 + 99 / 2.0), 0.55, 1e-2);
  train.schedule = LrSchedule::linear;
  EXPECT_DOUBLE_EQ(learning_rate(train, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(train, 10), 1.0);
  EXPECT_NEAR(learning_rate(train, 10 + 33), 1.0 - 0.9 * 33.0 / 99.0, 1e-12);
  EXPECT_NEAR(learning_rate(train, 109), 0.1, 1e-12);
  train.schedule = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(learning_rate(train, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(train, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(train, 109), 1.0);
  EXPECT_FLOAT_EQ(clip_scale(2.0, 1.0), float(1.0 / (2.0 + 1e-6)));
  EXPECT_FLOAT_EQ(clip_scale(0.5, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(5.0, 0.0), 1.0f);
}

// A stop signal before the first step (start-up of a large model takes minutes): nothing was
// trained, so the run ends without a step and without a checkpoint (docs/checkpoints.md,
// "Preemption: SIGTERM and SIGINT"). In a child process, since the signal's flag stays set.
TEST(TrainerDeathTest, AStopSignalBeforeTheFirstStepEndsTheRunWithoutTrainingOrSaving) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const auto folder = std::filesystem::temp_directory_path() /
                            ("ulysses-stop-test-" + std::to_string(getpid()));
        std::filesystem::create_directories(folder);
        Config config = tiny_config("llama");
        config.train.steps = 3;
        config.train.checkpoint.dir = folder.string();
        config.train.checkpoint.every = 1;
        TrainerRun run(config);
        install_stop_handlers();
        std::raise(SIGTERM);
        run.trainer->run();
        const bool nothing_done = run.trainer->step() == 0 && std::filesystem::is_empty(folder);
        std::filesystem::remove_all(folder);
        std::exit(nothing_done ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ulysses
