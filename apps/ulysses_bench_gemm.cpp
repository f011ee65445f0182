// ulysses-bench-gemm [size] [repeats] [openblas|portable]: the machine's measured fp32 GEMM
// rate through the cpu backend (the denominator of model-FLOP utilisation in
// scripts/bench-cpu.sh), with OpenBLAS or the portable GEMM the trainer tests use.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/stopwatch.h"

int main(int argc, char** argv) {
  using namespace ulysses;
  const int64_t size = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string gemm = argc > 3 ? argv[3] : "openblas";
  if (gemm != "openblas" && gemm != "portable") {
    std::fprintf(stderr, "ulysses-bench-gemm: the GEMM must be openblas or portable, got '%s'\n",
                 gemm.c_str());
    return 2;
  }
  auto backend = std::make_unique<CpuBackend>(0);
  backend->use_gemm(gemm == "portable" ? CpuGemm::portable : CpuGemm::openblas);
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
  std::printf("sgemm %lldx%lldx%lld: %.1f GFLOP/s (best of %d, %s)\n", (long long)size,
              (long long)size, (long long)size, flops / 1e9, repeats, gemm.c_str());
  return 0;
}
