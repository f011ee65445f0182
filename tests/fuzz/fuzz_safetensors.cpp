// libFuzzer target: the safetensors header reader (core/checkpoint/safetensors.h). The input is a
// whole file. parse_safetensors_header checks it from the bytes; when it is accepted, the same
// bytes go through SafetensorsReader (a memory-mapped scratch file), which must agree, and
// every tensor is converted with read_f32. Only std::runtime_error is an expected outcome.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check_header(const ulysses::SafetensorsHeader& header, size_t file_size) {
  using ulysses::fuzz::invariant_failed;
  if (header.data_offset < 8 || header.data_offset > file_size)
    invariant_failed("data section starts outside the file", std::to_string(header.data_offset));
  const uint64_t data_size = file_size - header.data_offset;
  uint64_t previous_end = 0;
  for (const ulysses::SafetensorsEntry& entry : header.entries) {
    if (entry.begin > entry.end || entry.end > data_size)
      invariant_failed("tensor outside the data section", entry.name);
    const uint64_t bytes = uint64_t(entry.numel()) * ulysses::safetensors_dtype_size(entry.dtype);
    if (entry.end - entry.begin != bytes)
      invariant_failed("tensor offsets disagree with its shape", entry.name);
    if (entry.begin != entry.end) {
      if (entry.begin < previous_end) invariant_failed("tensors overlap", entry.name);
      previous_end = entry.end;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ulysses;
  static const fuzz::ScratchFile file("safetensors");

  SafetensorsHeader header;
  try {
    header = parse_safetensors_header(data, size, size, "fuzz.safetensors");
  } catch (const std::runtime_error&) {
    return 0;
  }
  check_header(header, size);

  file.write(data, size);
  try {
    SafetensorsReader reader(file.path());
    if (reader.entries().size() != header.entries.size() || reader.metadata() != header.metadata)
      fuzz::invariant_failed("the reader and parse_safetensors_header disagree", file.path());
    std::vector<float> out;
    for (const SafetensorsEntry& entry : reader.entries()) {
      if (!reader.contains(entry.name) || &reader.entry(entry.name) != &entry)
        fuzz::invariant_failed("entry lookup by name fails", entry.name);
      out.assign(size_t(entry.numel()), 0.0f);
      reader.read_f32(entry.name, entry.shape, out.data());
      if (entry.dtype == "F32" && !out.empty() &&
          std::memcmp(out.data(), data + header.data_offset + entry.begin, out.size() * 4) != 0)
        fuzz::invariant_failed("F32 tensor is not copied exactly", entry.name);
      std::vector<int64_t> wrong_shape = entry.shape;
      wrong_shape.push_back(1);
      try {
        reader.read_f32(entry.name, wrong_shape, out.data());
        fuzz::invariant_failed("read_f32 accepts a wrong shape", entry.name);
      } catch (const std::runtime_error&) {
      }
    }
  } catch (const std::runtime_error& error) {
    fuzz::invariant_failed("SafetensorsReader refuses what parse_safetensors_header accepts",
                           error.what());
  }
  return 0;
}
