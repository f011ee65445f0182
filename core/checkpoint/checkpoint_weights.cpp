#include "core/checkpoint/checkpoint_weights.h"

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/safetensors_placed.h"

namespace ulysses {

std::string checkpoint_weights_header(const ParamTable& table, int64_t step,
                                      const std::string& family, const std::string& path) {
  std::vector<NamedShape> tensors;
  for (const ParamSpec& spec : table.specs()) tensors.push_back({spec.name, spec.shape});
  return placed_safetensors_header(
      tensors, {{"format", "ulysses"}, {"step", std::to_string(step)}, {"family", family}}, path);
}

CheckpointWeights::CheckpointWeights(const std::string& folder, const ParamTable& table)
    : table_(table), file_(folder + "/" + kCheckpointModelFile) {
  for (const ParamSpec& spec : table.specs()) file_.require_shape(spec.name, spec.shape);
}

void CheckpointWeights::read(int64_t begin, int64_t count, float* out) const {
  for_each_tensor_piece(table_, begin, count,
                        [&](const ParamSpec& spec, int64_t first, int64_t n, int64_t done) {
                          file_.read_f32_range(spec.name, first, n, out + done);
                        });
}

}  // namespace ulysses
