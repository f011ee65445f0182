// ulysses-bench-init: the initial weights of a model (docs/design.md, "Initial weights") made
// on the host for several thread counts: the first call into fresh memory (which pays the
// first touch of its pages) and the best of three into memory already touched, in seconds and
// nanoseconds per element per core (docs/performance.md, "Startup").
//   ulysses-bench-init [n_layers] [threads,threads,...]
// Defaults: the 253M Llama of scripts/bench-startup.sh (2 layers, d_model 2048, d_ff 8192,
// vocab 32000, 32/8 heads), 1 thread and every core.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/model/param_init.h"
#include "core/model/params.h"
#include "kernels/stopwatch.h"

int main(int argc, char** argv) {
  using namespace ulysses;
  ModelConfig model;
  model.family = Family::llama;
  model.n_layers = argc > 1 ? std::atoi(argv[1]) : 2;
  model.d_model = 2048;
  model.n_heads = 32;
  model.n_kv_heads = 8;
  model.d_ff = 8192;
  model.vocab_size = 32000;
  std::vector<int> thread_counts;
  std::stringstream thread_list(
      argc > 2 ? argv[2] : "1," + std::to_string(std::thread::hardware_concurrency()));
  for (std::string item; std::getline(thread_list, item, ',');)
    thread_counts.push_back(std::atoi(item.c_str()));
  if (model.n_layers < 1 ||
      std::any_of(thread_counts.begin(), thread_counts.end(), [](int n) { return n < 1; })) {
    std::fprintf(stderr, "usage: ulysses-bench-init [n_layers] [threads,threads,...]\n");
    return 2;
  }
  try {
    const ParamTable table(model);
    const int64_t count = table.total_numel();
    std::printf("initial weights of a %d-layer llama, %lld elements (%.2f GB of f32)\n",
                model.n_layers, (long long)count, 4e-9 * double(count));
    std::printf("%8s | %12s | %14s | %18s\n", "threads", "fresh (s)", "touched (s)",
                "ns/element/core");
    for (int threads : thread_counts) {
      omp_set_num_threads(threads);
      // new[] without a value leaves the pages untouched until the weights are written.
      const std::unique_ptr<float[]> out(new float[size_t(count)]);
      const Stopwatch fresh;
      initial_weights(table, model.n_layers, 1, 0, count, out.get());
      const double fresh_seconds = fresh.seconds();
      double best = 1e30;
      for (int repeat = 0; repeat < 3; ++repeat) {
        const Stopwatch clock;
        initial_weights(table, model.n_layers, 1, 0, count, out.get());
        best = std::min(best, clock.seconds());
      }
      std::printf("%8d | %12.3f | %14.3f | %18.2f\n", threads, fresh_seconds, best,
                  best * 1e9 * threads / double(count));
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ulysses-bench-init: %s\n", error.what());
    return 1;
  }
  return 0;
}
