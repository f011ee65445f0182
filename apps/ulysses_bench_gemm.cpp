// ulysses-bench-gemm: a backend's measured GEMM rate, in two forms.
//   ulysses-bench-gemm [size] [repeats] [openblas|portable]
//     fp32 size³ on the cpu backend (the denominator of model-FLOP utilisation in
//     scripts/bench-cpu.sh), with OpenBLAS or the portable GEMM the trainer tests use.
//   ulysses-bench-gemm --device cpu|cuda --shapes MxNxK:ab[,...] [--repeats R]
//     the products c[M, N] = op(a)·op(b) over K, a and b each stored as used (n) or transposed
//     (t), in the backend's compute dtype (bf16 on cuda: cuBLASLt), each the best of R calls
//     after a warm-up, timed in a profiler phase (device time on cuda); then their FLOP-weighted
//     rate. scripts/gpu_table.py measures the shapes of a training step's GEMMs with it, the
//     rate the step's GEMM phases are held against (docs/cuda.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/stopwatch.h"

namespace {

using namespace ulysses;

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::string text;
};

// "MxNxK:ab" with a, b each n or t; throws naming the item otherwise.
GemmShape parse_shape(const std::string& text) {
  GemmShape shape;
  shape.text = text;
  long long m = 0, n = 0, k = 0;
  char a = 0, b = 0, rest = 0;
  if (std::sscanf(text.c_str(), "%lldx%lldx%lld:%c%c%c", &m, &n, &k, &a, &b, &rest) != 5 || m < 1 ||
      n < 1 || k < 1 || (a != 'n' && a != 't') || (b != 'n' && b != 't'))
    throw std::invalid_argument("--shapes: '" + text +
                                "' is not MxNxK:ab (positive sizes; a, b each n or t)");
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.trans_a = a == 't';
  shape.trans_b = b == 't';
  return shape;
}

std::vector<GemmShape> parse_shapes(const std::string& list) {
  std::vector<GemmShape> shapes;
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) shapes.push_back(parse_shape(item));
  if (shapes.empty()) throw std::invalid_argument("--shapes: no shape given");
  return shapes;
}

// Inputs of values in [-0.5, 0.5), made in f32 and cast to the backend's compute dtype.
Buffer filled(Backend& backend, int64_t rows, int64_t columns, const char* name) {
  std::vector<float> host(size_t(rows * columns));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 97) / 97.0f - 0.5f;
  Buffer staging = backend.alloc(MemCategory::workspace, DType::f32, {rows, columns}, "staging");
  backend.upload(staging, host.data());
  Buffer values =
      backend.alloc(MemCategory::workspace, backend.compute_dtype(), {rows, columns}, name);
  backend.cast(values, staging.tensor());
  return values;
}

// Seconds of the best of `repeats` calls after a warm-up, each timed in its own phase.
double time_gemm(Backend& backend, const GemmShape& shape, int repeats) {
  Buffer a = shape.trans_a ? filled(backend, shape.k, shape.m, "a")
                           : filled(backend, shape.m, shape.k, "a");
  Buffer b = shape.trans_b ? filled(backend, shape.n, shape.k, "b")
                           : filled(backend, shape.k, shape.n, "b");
  Buffer c =
      backend.alloc(MemCategory::workspace, backend.compute_dtype(), {shape.m, shape.n}, "c");
  Profiler& profiler = backend.profiler();
  constexpr const char* kPhase = "gemm";
  double best = 1e30;
  for (int call = 0; call <= repeats; ++call) {
    {
      Profiler::Scope phase(profiler, kPhase);
      backend.gemm(a, shape.trans_a, b, shape.trans_b, c, 1.0f, 0.0f);
    }
    backend.synchronize();
    const ProfileTotals totals = profiler.take_totals();
    if (call > 0) best = std::min(best, totals.phases.at(kPhase).seconds);
  }
  return best;
}

int run_shapes(const std::string& device, const std::string& list, int repeats) {
  const std::vector<GemmShape> shapes = parse_shapes(list);
  auto backend = make_backend(device == "cuda" ? BackendKind::cuda : BackendKind::cpu, 0);
  if (device == "cpu") backend->set_num_threads(int(std::thread::hardware_concurrency()));
  backend->profiler().set_device_timing(true);
  const bool device_timed = backend->profiler().device_timing();
  const char* dtype = backend->compute_dtype() == DType::bf16 ? "bf16" : "f32";
  double total_flops = 0.0, total_seconds = 0.0;
  for (const GemmShape& shape : shapes) {
    const double seconds = time_gemm(*backend, shape, repeats);
    const double flops = 2.0 * double(shape.m) * double(shape.n) * double(shape.k);
    total_flops += flops;
    total_seconds += seconds;
    std::printf("gemm %s %s: %.4g ms, %.4g TFLOP/s\n", shape.text.c_str(), dtype, 1e3 * seconds,
                flops / seconds * 1e-12);
  }
  std::printf("all %zu shapes: %.4g TFLOP/s (FLOP-weighted; best of %d, %s, %s)\n", shapes.size(),
              total_flops / total_seconds * 1e-12, repeats, device.c_str(),
              device_timed ? "device time" : "host time");
  return 0;
}

int run_square(int64_t size, int repeats, const std::string& gemm) {
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
    best = std::min(best, clock.seconds());
  }
  const double flops = 2.0 * double(size) * double(size) * double(size) / best;
  std::printf("sgemm %lldx%lldx%lld: %.1f GFLOP/s (best of %d, %s)\n", (long long)size,
              (long long)size, (long long)size, flops / 1e9, repeats, gemm.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A backend's measured GEMM rate: fp32 size^3 on the cpu backend, or the given "
      "shapes on cpu or cuda (see --shapes)",
      "ulysses-bench-gemm"};
  int64_t size = 2048;
  int repeats = 5;
  std::string gemm = "openblas", device, shapes;
  app.add_option("SIZE", size, "square size of the fp32 cpu form")->check(CLI::PositiveNumber);
  app.add_option("REPEATS", repeats, "timed calls after the warm-up; the best is kept")
      ->check(CLI::PositiveNumber);
  app.add_option("GEMM", gemm, "the cpu GEMM of the square form")
      ->check(CLI::IsMember({"openblas", "portable"}));
  app.add_option("--repeats", repeats, "timed calls after the warm-up; the best is kept")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device, "backend of the --shapes form")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--shapes", shapes,
                 "comma-separated MxNxK:ab, c[M,N] = op(a) op(b) over K; a, b each n (as "
                 "stored) or t (transposed), e.g. 8192x3072x2048:nt")
      ->needs("--device");
  try {
    app.parse(argc, argv);
    if (!device.empty() && shapes.empty()) throw std::invalid_argument("--device needs --shapes");
    if (!shapes.empty()) return run_shapes(device, shapes, repeats);
    return run_square(size, repeats, gemm);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ulysses-bench-gemm: %s\n", error.what());
    return 2;
  }
}
