// What config.h derives from a config: each model family's architecture, the tiled MLP's
// tiles and text, the parameter count that bounds a model's size.
#include "core/config/config.h"

#include <algorithm>
#include <stdexcept>

namespace ulysses {

const Architecture& architecture(Family family) {
  static const Architecture kLlama = {NormKind::rms,         MlpKind::swiglu,
                                      PositionKind::rope,
                                      /*biases=*/false,      /*tied_head=*/false,
                                      /*grouped_query=*/true};
  static const Architecture kGpt2 = {NormKind::layer,        MlpKind::gelu,
                                     PositionKind::learned,
                                     /*biases=*/true,        /*tied_head=*/true,
                                     /*grouped_query=*/false};
  switch (family) {
    case Family::llama:
      return kLlama;
    case Family::gpt2:
      return kGpt2;
  }
  throw std::logic_error("model family " + std::to_string(int(family)) + " has no architecture");
}

int64_t mlp_tiles(const MemoryConfig& memory, int64_t rows, int d_model, int d_ff,
                  int intermediates) {
  int64_t tiles = 1;
  switch (memory.tiled_mlp.mode) {
    case TiledMlp::Mode::off:
      break;
    case TiledMlp::Mode::automatic:
      tiles = (int64_t(intermediates) * d_ff + d_model - 1) / d_model;
      break;
    case TiledMlp::Mode::tiles:
      tiles = memory.tiled_mlp.tiles;
      break;
  }
  return std::max<int64_t>(1, std::min(tiles, rows));
}

std::string tiled_mlp_text(const TiledMlp& tiled) {
  switch (tiled.mode) {
    case TiledMlp::Mode::off:
      return "false";
    case TiledMlp::Mode::automatic:
      return "auto";
    case TiledMlp::Mode::tiles:
      return std::to_string(tiled.tiles);
  }
  return "false";
}

long double approximate_parameter_count(const ModelConfig& m) {
  const long double C = m.d_model, F = m.d_ff, L = m.n_layers;
  return 2.0L * m.vocab_size * C + (long double)m.max_seq_len * C +
         L * (4.0L * C * C + 3.0L * C * F + 6.0L * C + F);
}

}  // namespace ulysses
