// A checkpoint's weights file, model.safetensors (docs/checkpoints.md, "Writing the
// weights"): the header its writers share, and reading it by flat range. Resume,
// model.init_from of a checkpoint and export all read it through here.
#pragma once

#include <cstdint>
#include <string>

#include "core/checkpoint/safetensors.h"
#include "core/model/params.h"

namespace ulysses {

// The header of model.safetensors for this table: every tensor F32 in table order, so flat
// element e lies at the header's end + 4e; metadata format, step and family.
std::string checkpoint_weights_header(const ParamTable& table, int64_t step,
                                      const std::string& family, const std::string& path);

// folder/model.safetensors, checked on opening against the table (every tensor present with
// its shape; the reader's errors name the file), then read by range from the mapping.
class CheckpointWeights {
 public:
  CheckpointWeights(const std::string& folder, const ParamTable& table);

  // Fills out[0, count) with flat elements [begin, begin + count).
  void read(int64_t begin, int64_t count, float* out) const;
  const SafetensorsReader& file() const { return file_; }

 private:
  const ParamTable& table_;
  SafetensorsReader file_;
};

}  // namespace ulysses
