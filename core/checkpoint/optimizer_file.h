// A checkpoint's optimizer state files (docs/checkpoints.md), one per shard and named by
// optimizer_file_name (core/checkpoint/checkpoint_format.h): two F32 tensors, the first and
// second AdamW moments, each the concatenation of the flat parameter ranges the file holds.
// The metadata lists them as "ranges" ([[begin, end], ...], in order) with "total", the
// model's parameter count; files written before ZeRO units hold one range as "begin"/"end".
// Save and resume both read the format from here, so that a run with another world size or
// ZeRO stage can take any range from any file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/safetensors.h"

namespace ulysses {

inline constexpr const char* kFirstMomentTensor = "exp_avg";
inline constexpr const char* kSecondMomentTensor = "exp_avg_sq";

// [begin, end) of the flat parameter buffer.
using FlatRange = std::pair<int64_t, int64_t>;

// The header (core/checkpoint/safetensors_placed.h) of an optimizer file at path that holds
// these ranges of a model of `total` parameters: each moment tensor is the ranges' elements,
// one after another.
std::string optimizer_file_header(const std::vector<FlatRange>& ranges, int64_t total,
                                  const std::string& path);

// The ranges an optimizer file holds, in the order its tensors pack them. Throws
// CheckpointError naming the file when the metadata is missing, malformed, out of order or
// outside a model of `total` parameters.
std::vector<FlatRange> optimizer_file_ranges(const SafetensorsReader& file, int64_t total);

}  // namespace ulysses
