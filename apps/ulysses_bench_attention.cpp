// ulysses-bench-attention: causal attention forward and backward on the cuda backend, the
// native kernels against cuDNN's, device-timed apart (docs/cuda.md, "Attention on tensor
// cores"): per head dim and sequence length, ms per call, TFLOP/s and native's throughput as
// a share of cuDNN's. scripts/gpu-check.sh runs it. With --device cpu: the cpu backend's
// kernels alone, host-timed, in GFLOP/s (docs/performance.md, "Where the time goes").
//   ulysses-bench-attention [--device cpu|cuda] [seq,seq,...] [dim,dim,...]
// Defaults: cuda, 8192,32768 tokens, head dims 64 and 128, batch 1, the Llama-1B width (2048 =
// q heads · head dim) with 4 q heads per kv head.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace {

using namespace ulysses;

std::vector<int64_t> parse_list(const char* text) {
  std::vector<int64_t> values;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) values.push_back(std::atoll(item.c_str()));
  return values;
}

struct Timing {
  double forward_ms = 0.0, backward_ms = 0.0;
  bool device_timed = false;
};

// The best of three calls after a warm-up, each in its own profiler phase so that its time is
// where the device ran it.
Timing time_attention(BackendKind device, AttentionKernel kernel, int64_t seq, int64_t dim) {
  const int64_t q_heads = 2048 / dim, kv_heads = std::max<int64_t>(1, q_heads / 4);
  auto backend = make_backend(device, 0, kernel);
  const DType dtype = backend->compute_dtype();
  auto alloc = [&](int64_t heads, const char* name) {
    return backend->alloc(MemCategory::activations, dtype, {1, seq, heads, dim}, name);
  };
  Buffer q = alloc(q_heads, "q"), k = alloc(kv_heads, "k"), v = alloc(kv_heads, "v");
  Buffer out = alloc(q_heads, "out"), dout = alloc(q_heads, "dout"), dq = alloc(q_heads, "dq");
  Buffer dk = alloc(kv_heads, "dk"), dv = alloc(kv_heads, "dv");
  Buffer lse = backend->alloc(MemCategory::activations, DType::f32, {1, q_heads, seq}, "lse");
  std::vector<float> values(size_t(seq * q_heads * dim));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
  Buffer staging =
      backend->alloc(MemCategory::workspace, DType::f32, {1, seq, q_heads, dim}, "staging");
  backend->upload(staging, values.data());
  backend->cast(q, staging.tensor());
  backend->cast(dout, staging.tensor());
  const Tensor kv_part =
      staging.tensor().reshape({seq * q_heads * dim}).slice_rows(0, seq * kv_heads * dim);
  backend->cast(k, kv_part.reshape({1, seq, kv_heads, dim}));
  backend->cast(v, kv_part.reshape({1, seq, kv_heads, dim}));
  staging.reset();

  Profiler& profiler = backend->profiler();
  profiler.set_device_timing(true);
  Timing best{1e30, 1e30, false};
  for (int call = 0; call < 4; ++call) {
    {
      Profiler::Scope phase(profiler, phase::kAttentionForward);
      backend->attention_forward(out, lse, q, k, v);
    }
    {
      Profiler::Scope phase(profiler, phase::kAttentionBackward);
      backend->attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    }
    backend->synchronize();
    const ProfileTotals totals = profiler.take_totals();
    if (call == 0) continue;  // the warm-up: plans, graphs and the memory pool
    best.device_timed = totals.device_timed;
    best.forward_ms =
        std::min(best.forward_ms, 1e3 * totals.phases.at(phase::kAttentionForward).seconds);
    best.backward_ms =
        std::min(best.backward_ms, 1e3 * totals.phases.at(phase::kAttentionBackward).seconds);
  }
  return best;
}

constexpr const char* kUsage = "usage: ulysses-bench-attention [--device cpu|cuda] [seqs] [dims]\n";

// The cpu backend's attention alone: one kernel, timed on the host.
int bench_cpu(const std::vector<int64_t>& seqs, const std::vector<int64_t>& dims) {
  int status = 0;
  std::printf(
      "causal attention on the cpu backend, batch 1, q heads · head dim = 2048, 4 q heads per kv "
      "head; best of 3 calls\n");
  std::printf("%5s %7s | %10s %8s | %10s %8s\n", "dim", "tokens", "fwd ms", "GFLOP/s", "bwd ms",
              "GFLOP/s");
  for (int64_t dim : dims)
    for (int64_t seq : seqs) {
      const double forward_flops = 2.0 * double(seq) * double(seq) * 2048.0;
      try {
        const Timing cpu = time_attention(BackendKind::cpu, AttentionKernel::native, seq, dim);
        std::printf("%5lld %7lld | %10.1f %8.1f | %10.1f %8.1f\n", (long long)dim, (long long)seq,
                    cpu.forward_ms, forward_flops / cpu.forward_ms * 1e-6, cpu.backward_ms,
                    2.5 * forward_flops / cpu.backward_ms * 1e-6);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "ulysses-bench-attention: d %lld, T %lld: %s\n", (long long)dim,
                     (long long)seq, error.what());
        status = 1;
      }
    }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  BackendKind device = BackendKind::cuda;
  if (!args.empty() && args[0] == "--device") {
    if (args.size() < 2 || (args[1] != "cpu" && args[1] != "cuda"))
      return std::fprintf(stderr, "%s", kUsage), 2;
    device = args[1] == "cpu" ? BackendKind::cpu : BackendKind::cuda;
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.size() > 2) return std::fprintf(stderr, "%s", kUsage), 2;
  const std::vector<int64_t> seqs = parse_list(args.size() > 0 ? args[0].c_str() : "8192,32768");
  const std::vector<int64_t> dims = parse_list(args.size() > 1 ? args[1].c_str() : "64,128");
  for (int64_t value : seqs)
    if (value < 1) return std::fprintf(stderr, "%s", kUsage), 2;
  for (int64_t value : dims)
    if (value < 8 || value > 128 || 2048 % value != 0)
      return std::fprintf(stderr,
                          "ulysses-bench-attention: head dim %lld does not divide 2048 "
                          "or is outside 8..128\n",
                          (long long)value),
             2;
  if (device == BackendKind::cpu) return bench_cpu(seqs, dims);
  std::printf(
      "causal attention, batch 1, q heads · head dim = 2048, 4 q heads per kv head; "
      "best of 3 calls, device time\n");
  std::printf("%5s %7s | %10s %10s %8s %6s | %10s %10s %8s %6s\n", "dim", "tokens", "native fwd",
              "cudnn fwd", "TFLOP/s", "share", "native bwd", "cudnn bwd", "TFLOP/s", "share");
  int status = 0;
  for (int64_t dim : dims)
    for (int64_t seq : seqs) {
      // Causal: half of the 4·T²·d·H multiply-adds of Q·Kᵀ and P·V; backward 2.5× forward.
      const double forward_flops = 2.0 * double(seq) * double(seq) * 2048.0;
      try {
        const Timing native = time_attention(BackendKind::cuda, AttentionKernel::native, seq, dim);
        Timing cudnn{0.0, 0.0, false};
        std::string cudnn_problem;
        try {
          cudnn = time_attention(BackendKind::cuda, AttentionKernel::cudnn, seq, dim);
        } catch (const std::exception& error) {
          cudnn_problem = error.what();
        }
        auto share = [&](double native_ms, double cudnn_ms) {
          return cudnn_problem.empty() ? 100.0 * cudnn_ms / native_ms : 0.0;
        };
        std::printf("%5lld %7lld | %10.3f %10.3f %8.1f %5.0f%% | %10.3f %10.3f %8.1f %5.0f%%%s\n",
                    (long long)dim, (long long)seq, native.forward_ms, cudnn.forward_ms,
                    forward_flops / native.forward_ms * 1e-9,
                    share(native.forward_ms, cudnn.forward_ms), native.backward_ms,
                    cudnn.backward_ms, 2.5 * forward_flops / native.backward_ms * 1e-9,
                    share(native.backward_ms, cudnn.backward_ms),
                    native.device_timed ? "" : " (host-timed)");
        if (!cudnn_problem.empty()) std::printf("      cudnn: %s\n", cudnn_problem.c_str());
      } catch (const std::exception& error) {
        std::fprintf(stderr, "ulysses-bench-attention: d %lld, T %lld: %s\n", (long long)dim,
                     (long long)seq, error.what());
        status = 1;
      }
    }
  return status;
}
