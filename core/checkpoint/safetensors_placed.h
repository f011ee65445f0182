// A safetensors file of F32 tensors stored one after another that several processes fill in
// place (docs/checkpoints.md, "Writing the weights"): one creates it with its header and a
// data section of the final size, then each writes the element ranges it holds at their
// offsets. No process ever holds the whole file's data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ulysses {

struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
};

// The header bytes (length prefix included) of a file holding these tensors as F32, in this
// order and without gaps: element e of the concatenation is at header.size() + 4e.
std::string placed_safetensors_header(const std::vector<NamedShape>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      const std::string& path);

// Creates (or truncates) path with header followed by data_bytes of zeros (a sparse hole
// until the writers fill it) and fsyncs it.
void create_placed_safetensors(const std::string& path, const std::string& header,
                               uint64_t data_bytes);

// Writes F32 elements into a file made by create_placed_safetensors.
class PlacedSafetensorsWriter {
 public:
  PlacedSafetensorsWriter(const std::string& path, uint64_t header_bytes);
  ~PlacedSafetensorsWriter();
  PlacedSafetensorsWriter(const PlacedSafetensorsWriter&) = delete;
  PlacedSafetensorsWriter& operator=(const PlacedSafetensorsWriter&) = delete;

  // Elements [first, first + count) of the concatenated tensors.
  void write(int64_t first, int64_t count, const float* values);
  // fsyncs and closes; throws when either fails. Required before the file is used.
  void finish();

 private:
  std::string path_;
  uint64_t header_bytes_;
  int fd_ = -1;
};

}  // namespace ulysses
