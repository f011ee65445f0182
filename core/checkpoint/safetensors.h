// Reading and writing safetensors files (REFERENCES.md, "File formats"): a u64
// little-endian header length N, N bytes of JSON describing every tensor (dtype, shape,
// byte offsets relative to the end of the header) plus string metadata, then the data.
// Files are untrusted input: the reader validates the whole header up front and every
// problem is a std::runtime_error that names the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace ulysses {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // F32 | BF16 | F16
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;

  int64_t numel() const;
};

// Bytes per element of a supported dtype; throws for any other dtype.
size_t safetensors_dtype_size(const std::string& dtype);

// Exact (every f16 value is representable as a float). bf16: kernels/tensor.h.
float f16_to_float(uint16_t bits);

// What a safetensors header says, checked against the size of its file.
struct SafetensorsHeader {
  uint64_t data_offset = 0;               // bytes before the data section: 8 + header length
  std::vector<SafetensorsEntry> entries;  // sorted by position in the file
  std::map<std::string, std::string> metadata;
};

// The longest JSON header accepted (as the reference implementation): a crafted length
// cannot make the reader parse gigabytes.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Parses and validates the header of a safetensors file of file_size bytes from its first
// `available` bytes (all of the header must be there): every tensor's dtype, shape and
// offsets, inside the data section and not overlapping. Throws std::runtime_error naming
// path. The reader below uses it; fuzz targets call it on bytes (docs/fuzzing.md).
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t available,
                                           uint64_t file_size, const std::string& path);

// Memory-maps a file and validates its header; tensors are converted on request.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by position in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const;
  // Throws if there is no tensor of that name.
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Converts F32/BF16/F16 to float into out (numel floats); throws if the name is
  // missing or the stored shape differs from expected_shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                float* out) const;
  // Throws, as read_f32 does, if there is no tensor of that name or its shape differs.
  void require_shape(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // Elements [first, first + count) of the tensor (flat, row-major), converted to float.
  void read_f32_range(const std::string& name, int64_t first, int64_t count, float* out) const;

 private:
  void unmap();
  // Drops the pages of [begin, begin + bytes) from this process's memory.
  void release_pages(const uint8_t* begin, size_t bytes) const;
  std::string error(const std::string& problem) const;

  std::string path_;
  const uint8_t* mapped_ = nullptr;
  size_t mapped_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section inside the mapping
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

// The bytes a file starts with: the u64 header length, then the JSON header listing
// metadata and entries (in the order given, with their offsets), padded with spaces so the
// data is 8-byte aligned. path only names the file in errors.
std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path);

// Collects tensors (copied at add time) and metadata, then writes one file. Tensors are
// stored in the order they were added; the header is padded so the data is 8-byte aligned.
class SafetensorsWriter {
 public:
  // Stored as F32.
  void add(const std::string& name, std::vector<int64_t> shape, const float* data);
  // Stored as BF16, rounded to nearest even.
  void add_bf16(const std::string& name, std::vector<int64_t> shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value);

  // Writes path (the caller handles temporary names and renames) and fsyncs it.
  void write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  PendingTensor& start_tensor(const std::string& name, std::vector<int64_t> shape,
                              const std::string& dtype, const float* data);

  std::vector<PendingTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ulysses
