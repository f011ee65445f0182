// ulysses-bench-gemm: the machine's measured fp32 GEMM rate through the backend (the
// denominator of model-FLOP utilisation in scripts/bench-cpu.sh).
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/stopwatch.h"

int main(int argc, char** argv) {
  using namespace ulysses;
  const int64_t size = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  auto backend = make_backend(BackendKind::cpu, 0);
  backend->set_num_threads(int(std::thread::hardware_concurrency()));
  Buffer a = backend->alloc(MemCategory::workspace, DType::f32, {size, size}, "a");
  Buffer b = backend->alloc(MemCategory::workspace, DType::f32, {size, size}, "b");
  Buffer c = backend->alloc(MemCategory::workspace, DType::f32, {size, size}, "c");
  std::vector<float> host(size_t(size * size));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 97) / 97.0f - 0.5f;
  backend->upload(a, host.data());
  backend->upload(b, host.data());
  backend->gemm(a, false, b, true, c, 1.0f, 0.0f);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const Stopwatch clock;
    backend->gemm(a, false, b, true, c, 1.0f, 0.0f);
    double seconds = clock.seconds();
    if (seconds < best) best = seconds;
  }
  double flops = 2.0 * double(size) * double(size) * double(size) / best;
  std::printf("sgemm %lldx%lldx%lld: %.1f GFLOP/s (best of %d)\n", (long long)size, (long long)size,
              (long long)size, flops / 1e9, repeats);
  return 0;
}
