// Device time on a GPU (docs/profiling.md, "Device time"): the phases of a training step, timed
// by CUDA events on the stream where their work runs, add up to the step; and the attention
// phases of a small run with the native kernels take what the same attention ops take timed
// alone with CUDA events. Built with the CUDA backend; skipped, with the reason, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/report/step_report.h"
#include "core/train/trainer.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "parallel/local_comm.h"
#include "parallel/mesh.h"
#include "testing.h"

namespace ulysses {
namespace {

using testing::cuda_backend_or_reason;

// A llama of one batch row of seq_len tokens with the native attention kernels.
Config llama_config(int layers, int d_model, int heads, int kv_heads, int seq_len) {
  const std::string T = std::to_string(seq_len);
  return parse_config(
      "model: {family: llama, n_layers: " + std::to_string(layers) +
          ", d_model: " + std::to_string(d_model) + ", n_heads: " + std::to_string(heads) +
          ", n_kv_heads: " + std::to_string(kv_heads) + ", d_ff: " + std::to_string(2 * d_model) +
          ", vocab_size: 512, max_seq_len: " + T +
          "}\n"
          "train: {steps: 4, batch_size: 1, seq_len: " +
          T +
          ", seed: 3}\n"
          "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
          "kernels: {attention: native}\n",
      {}, "cuda-profiling.yaml");
}

struct TimedStep {
  StepResult result;
  ProfileTotals totals;
};

// `steps` training steps, each with the phases the profiler read back after it.
std::vector<TimedStep> timed_steps(Backend& backend, const Config& config, int steps) {
  auto world = make_local_comm(backend);
  Mesh mesh = make_mesh(*world, 1);
  Trainer trainer(config, backend, mesh);
  Profiler& profiler = backend.profiler();
  profiler.set_device_timing(true);  // as Trainer::run does
  std::vector<TimedStep> out;
  for (int step = 0; step < steps; ++step) {
    profiler.take_totals();  // what building the model enqueued is not a step's
    TimedStep timed;
    timed.result = trainer.train_step();
    timed.totals = profiler.take_totals();
    out.push_back(timed);
  }
  return out;
}

double step_phase_seconds(const ProfileTotals& totals, const std::string& name) {
  auto found = totals.phases.find(name);
  return found == totals.phases.end() ? 0.0 : found->second.seconds;
}

TEST(CudaProfiling, PhasesDeviceTimesAddUpToTheStep) {
  std::string reason;
  std::unique_ptr<Backend> gpu = cuda_backend_or_reason(reason);
  if (!gpu) GTEST_SKIP() << reason;
  const std::vector<TimedStep> steps = timed_steps(*gpu, llama_config(2, 256, 4, 2, 1024), 4);
  for (size_t i = 1; i < steps.size(); ++i) {  // the first pays for cuBLASLt's plans
    SCOPED_TRACE("step " + std::to_string(i + 1));
    const ProfileTotals& totals = steps[i].totals;
    const double step_seconds = steps[i].result.step_seconds;
    ASSERT_TRUE(totals.device_timed);
    double sum = 0.0;
    for (const std::string& name : step_phases()) {
      sum += step_phase_seconds(totals, name);
      auto found = totals.phases.find(name);
      if (found != totals.phases.end())
        EXPECT_LE(found->second.busy_seconds, found->second.seconds + 1e-6) << name;
    }
    EXPECT_NEAR(sum, step_seconds, 0.05 * step_seconds);
    EXPECT_GT(totals.device_busy_seconds, 0.0);
    EXPECT_LE(totals.device_busy_seconds, 1.05 * step_seconds);
    EXPECT_GT(totals.launches, 0);
    EXPECT_GT(step_phase_seconds(totals, "mlp"), 0.0);
  }
}

std::vector<uint16_t> random_bf16(int64_t count, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<uint16_t> bits(static_cast<size_t>(count));
  for (uint16_t& value : bits) value = float_to_bf16(uniform(engine));
  return bits;
}

TEST(CudaProfiling, AttentionPhasesTakeWhatTheOpsTakeAlone) {
  std::string reason;
  std::unique_ptr<Backend> gpu = cuda_backend_or_reason(reason);
  if (!gpu) GTEST_SKIP() << reason;
  // One layer; d 512 in 8 heads of 64, 2 kv heads; 4096 tokens: the native attention is most of
  // the step, so the stream runs ahead of the host and the phases hold only its kernels.
  constexpr int64_t T = 4096, heads = 8, kv_heads = 2, head_dim = 64;
  const std::vector<TimedStep> steps =
      timed_steps(*gpu, llama_config(1, int(heads * head_dim), heads, kv_heads, T), 4);
  double in_run = 0.0;
  for (size_t i = 1; i < steps.size(); ++i)
    in_run += step_phase_seconds(steps[i].totals, phase::kAttentionForward) +
              step_phase_seconds(steps[i].totals, phase::kAttentionBackward);
  in_run /= double(steps.size() - 1);

  // The same ops on tensors of the run's shapes, timed alone by events on the backend's stream.
  const DType dtype = gpu->compute_dtype();
  auto make = [&](int64_t h, const char* what) {
    Buffer buffer = gpu->alloc(MemCategory::activations, dtype, {1, T, h, head_dim}, what);
    gpu->upload(buffer, random_bf16(T * h * head_dim, uint64_t(h) * 7 + T).data());
    return buffer;
  };
  Buffer q = make(heads, "q"), k = make(kv_heads, "k"), v = make(kv_heads, "v");
  Buffer dout = make(heads, "dout"), out = make(heads, "out");
  Buffer dq = make(heads, "dq"), dk = make(kv_heads, "dk"), dv = make(kv_heads, "dv");
  Buffer lse = gpu->alloc(MemCategory::activations, DType::f32, {1, heads, T}, "lse");
  auto attention = [&] {
    gpu->attention_forward(out, lse, q, k, v);
    gpu->attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  };
  attention();  // warm-up
  gpu->synchronize();
  constexpr int kRepetitions = 10;
  auto stream = static_cast<cudaStream_t>(cuda_backend_stream(*gpu));
  cudaEvent_t begin = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&begin), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(begin, stream), cudaSuccess);
  for (int i = 0; i < kRepetitions; ++i) attention();
  ASSERT_EQ(cudaEventRecord(end, stream), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float milliseconds = 0.0f;
  ASSERT_EQ(cudaEventElapsedTime(&milliseconds, begin, end), cudaSuccess);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  const double alone = double(milliseconds) * 1e-3 / kRepetitions;
  EXPECT_NEAR(in_run, alone, 0.10 * alone)
      << "attention phases " << in_run * 1e3 << " ms per step, the ops alone " << alone * 1e3
      << " ms";
}

}  // namespace
}  // namespace ulysses
