// ulysses-bench-loss: the fused LM head + loss with its gradients for several tile sizes
// (memory.loss_tile_tokens), on one backend: seconds per call and the tile's tracked
// workspace, from which the auto tile is chosen (docs/memory.md, "The loss tile").
//   ulysses-bench-loss [cpu|cuda] [rows] [vocab] [width] [tile,tile,...]
// Defaults: cuda, 8192 rows, the Llama-1B head (vocab 32000, width 2048), tiles 256 to 8192.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/stopwatch.h"

int main(int argc, char** argv) {
  using namespace ulysses;
  const std::string device = argc > 1 ? argv[1] : "cuda";
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int64_t vocab = argc > 3 ? std::atoll(argv[3]) : 32000;
  const int64_t width = argc > 4 ? std::atoll(argv[4]) : 2048;
  std::vector<int64_t> tiles;
  std::stringstream tile_list(argc > 5 ? argv[5] : "256,512,1024,2048,4096,8192");
  for (std::string item; std::getline(tile_list, item, ',');)
    tiles.push_back(std::atoll(item.c_str()));
  if (rows < 1 || vocab < 2 || width < 1 || tiles.empty() ||
      (device != "cpu" && device != "cuda")) {
    std::fprintf(stderr, "usage: ulysses-bench-loss [cpu|cuda] [rows] [vocab] [width] [tiles]\n");
    return 2;
  }
  try {
    auto backend = make_backend(device == "cuda" ? BackendKind::cuda : BackendKind::cpu, 0);
    backend->set_num_threads(int(std::thread::hardware_concurrency()));
    const DType dtype = backend->compute_dtype();
    Buffer hidden = backend->alloc(MemCategory::activations, dtype, {rows, width}, "hidden");
    Buffer weight = backend->alloc(MemCategory::params, dtype, {vocab, width}, "weight");
    Buffer targets = backend->alloc(MemCategory::activations, DType::i32, {rows}, "targets");
    Buffer dhidden = backend->alloc(MemCategory::activations, dtype, {rows, width}, "dhidden");
    Buffer dweight = backend->alloc(MemCategory::grads, DType::f32, {vocab, width}, "dweight");
    std::vector<float> values(size_t(std::max(rows, vocab) * width));
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = float(int(i * 7919 % 2001) - 1000) * 2e-5f;
    Buffer staging = backend->alloc(MemCategory::workspace, DType::f32,
                                    {std::max(rows, vocab), width}, "staging");
    backend->upload(staging, values.data());
    backend->cast(weight, staging.tensor().slice_rows(0, vocab));
    backend->cast(hidden, staging.tensor().slice_rows(0, rows));
    staging.reset();
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 104729 % uint64_t(vocab));
    backend->upload(targets, ids.data());
    backend->fill_zero(dweight);

    std::printf("%s: LM head + loss with gradients, %lld rows, vocab %lld, width %lld\n",
                backend->name().c_str(), (long long)rows, (long long)vocab, (long long)width);
    std::printf("%8s | %10s | %14s\n", "tile", "ms", "tile workspace");
    for (int64_t tile : tiles) {
      backend->lm_head_loss(hidden, weight, targets, tile, 1.0f, dhidden, dweight);  // warm-up
      backend->memory().reset_peaks();
      double best = 1e30;
      for (int repeat = 0; repeat < 3; ++repeat) {
        // The call returns the loss to the host, so it has waited for the device.
        const Stopwatch clock;
        backend->lm_head_loss(hidden, weight, targets, tile, 1.0f, dhidden, dweight);
        best = std::min(best, clock.seconds());
      }
      std::printf("%8lld | %10.3f | %11.1f MiB\n", (long long)tile, best * 1e3,
                  double(backend->memory().peak(MemCategory::workspace)) / (1 << 20));
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ulysses-bench-loss: %s\n", error.what());
    return 1;
  }
  return 0;
}
