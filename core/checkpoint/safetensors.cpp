#include "core/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "data/input_file.h"

namespace ulysses {

// The file format is little-endian and tensors are copied with memcpy.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O needs a little-endian host");

namespace {

constexpr size_t kHeaderLengthBytes = 8;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// Product of the dims; false when it does not fit in 63 bits.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t& numel) {
  numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel)) return false;
  }
  return numel <= static_cast<uint64_t>(INT64_MAX);
}

std::vector<int64_t> parse_shape(const nlohmann::json& value, const std::string& name,
                                 const std::string& context) {
  if (!value.is_array()) {
    throw std::runtime_error(context + "tensor '" + name + "' has a shape that is not an array");
  }
  std::vector<int64_t> shape;
  for (const auto& dim : value) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw std::runtime_error(context + "tensor '" + name + "' has shape " + value.dump() +
                               ": dims must be non-negative integers");
    }
    shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }
  return shape;
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value,
                             const std::string& context) {
  if (!value.is_object()) {
    throw std::runtime_error(context + "tensor '" + name + "' is not a JSON object");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) {
      throw std::runtime_error(context + "tensor '" + name + "' has no \"" + key + "\"");
    }
  }
  SafetensorsEntry entry;
  entry.name = name;
  const auto& dtype = value["dtype"];
  if (!dtype.is_string()) {
    throw std::runtime_error(context + "tensor '" + name + "' has a dtype that is not a string");
  }
  entry.dtype = dtype.get<std::string>();
  if (entry.dtype != "F32" && entry.dtype != "BF16" && entry.dtype != "F16") {
    throw std::runtime_error(context + "tensor '" + name + "' has unsupported dtype '" +
                             entry.dtype + "' (supported: F32, BF16, F16)");
  }
  entry.shape = parse_shape(value["shape"], name, context);
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw std::runtime_error(context + "tensor '" + name + "' has data_offsets " + offsets.dump() +
                             ": expected [begin, end] of non-negative integers");
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    throw std::runtime_error(context + "tensor '" + name + "' has data_offsets " + offsets.dump() +
                             " with begin after end");
  }
  uint64_t numel = 0;
  uint64_t expected_bytes = 0;
  if (!checked_numel(entry.shape, numel) ||
      __builtin_mul_overflow(numel, safetensors_dtype_size(entry.dtype), &expected_bytes)) {
    throw std::runtime_error(context + "tensor '" + name + "' has shape " +
                             shape_string(entry.shape) + " that is too large");
  }
  if (entry.end - entry.begin != expected_bytes) {
    throw std::runtime_error(context + "tensor '" + name + "' has data_offsets " + offsets.dump() +
                             " spanning " + std::to_string(entry.end - entry.begin) +
                             " bytes, but shape " + shape_string(entry.shape) + " of " +
                             entry.dtype + " needs " + std::to_string(expected_bytes) + " bytes");
  }
  return entry;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& value,
                                                  const std::string& context) {
  if (!value.is_object()) {
    throw std::runtime_error(context + "__metadata__ is not a JSON object");
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      throw std::runtime_error(context + "__metadata__ value of '" + key + "' is not a string");
    }
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

void write_all(int fd, const void* bytes, size_t size, const std::string& path) {
  const auto* cursor = static_cast<const uint8_t*>(bytes);
  while (size > 0) {
    ssize_t written = ::write(fd, cursor, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot write safetensors file '" + path +
                               "': " + std::strerror(errno));
    }
    cursor += written;
    size -= static_cast<size_t>(written);
  }
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  throw std::runtime_error("unsupported safetensors dtype '" + dtype +
                           "' (supported: F32, BF16, F16)");
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf / NaN keep their payload
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t available,
                                           uint64_t file_size, const std::string& path) {
  const std::string context = "safetensors file '" + path + "': ";
  auto fail = [&](const std::string& problem) { throw std::runtime_error(context + problem); };
  if (file_size < kHeaderLengthBytes) {
    fail("file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  if (available < kHeaderLengthBytes) {
    fail("only " + std::to_string(available) + " bytes given, fewer than the header length");
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes, kHeaderLengthBytes);
  if (header_length > file_size - kHeaderLengthBytes) {
    fail("header length " + std::to_string(header_length) + " is larger than the " +
         std::to_string(file_size) + "-byte file");
  }
  if (header_length > kSafetensorsMaxHeaderBytes) {
    fail("header length " + std::to_string(header_length) + " is above the " +
         std::to_string(kSafetensorsMaxHeaderBytes) + " bytes safetensors allows");
  }
  if (available - kHeaderLengthBytes < header_length) {
    fail("only " + std::to_string(available) + " bytes given, fewer than the " +
         std::to_string(kHeaderLengthBytes + header_length) + "-byte header");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + kHeaderLengthBytes);
  // Printing a JSON value (as messages do) recurses once per level, so deeper headers are
  // refused while they are parsed (which does not recurse); a valid one nests 3 levels.
  constexpr int kMaxJsonDepth = 64;
  auto limit_depth = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      fail("JSON header nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  nlohmann::json json_header;
  try {
    json_header = nlohmann::json::parse(header_begin, header_begin + header_length, limit_depth);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("invalid JSON header: ") + e.what());
  }
  if (!json_header.is_object()) fail("JSON header is not an object");

  SafetensorsHeader header;
  for (const auto& [name, value] : json_header.items()) {
    if (name == "__metadata__") {
      header.metadata = parse_metadata(value, context);
    } else {
      header.entries.push_back(parse_entry(name, value, context));
    }
  }

  header.data_offset = kHeaderLengthBytes + header_length;
  const uint64_t data_size = file_size - header.data_offset;
  std::vector<SafetensorsEntry>& entries = header.entries;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const SafetensorsEntry* previous = nullptr;  // last non-empty tensor
  for (const auto& entry : entries) {
    if (entry.end > data_size) {
      fail("tensor '" + entry.name + "' ends at data byte " + std::to_string(entry.end) +
           " but the file holds only " + std::to_string(data_size) +
           " bytes of data (truncated or offsets out of bounds)");
    }
    if (entry.begin == entry.end) continue;
    if (previous && entry.begin < previous->end) {
      fail("tensors '" + previous->name + "' and '" + entry.name + "' overlap in the data section");
    }
    previous = &entry;
  }
  return header;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  InputFile file(path);
  if (!file.is_open()) throw std::runtime_error("safetensors file " + file.problem());
  const auto file_size = static_cast<uint64_t>(file.size());
  if (file_size < kHeaderLengthBytes) {
    throw std::runtime_error(error("file is " + std::to_string(file_size) +
                                   " bytes, shorter than the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  const int saved = errno;
  if (mapping == MAP_FAILED) {
    throw std::runtime_error(error(std::string("cannot mmap: ") + std::strerror(saved)));
  }
  mapped_ = static_cast<const uint8_t*>(mapping);
  mapped_size_ = file_size;
  try {
    SafetensorsHeader header = parse_safetensors_header(mapped_, mapped_size_, file_size, path_);
    data_ = mapped_ + header.data_offset;
    entries_ = std::move(header.entries);
    metadata_ = std::move(header.metadata);
    for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  unmap();
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      mapped_(std::exchange(other.mapped_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      entries_(std::move(other.entries_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    mapped_ = std::exchange(other.mapped_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsReader::unmap() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(mapped_), mapped_size_);
  mapped_ = nullptr;
  mapped_size_ = 0;
  data_ = nullptr;
}

std::string SafetensorsReader::error(const std::string& problem) const {
  return "safetensors file '" + path_ + "': " + problem;
}

bool SafetensorsReader::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) throw std::runtime_error(error("no tensor named '" + name + "'"));
  return entries_[found->second];
}

void SafetensorsReader::require_shape(const std::string& name,
                                      const std::vector<int64_t>& expected_shape) const {
  const SafetensorsEntry& tensor = entry(name);
  if (tensor.shape != expected_shape) {
    throw std::runtime_error(error("tensor '" + name + "' has shape " + shape_string(tensor.shape) +
                                   " but " + shape_string(expected_shape) + " was expected"));
  }
}

void SafetensorsReader::read_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape, float* out) const {
  require_shape(name, expected_shape);
  read_f32_range(name, 0, entry(name).numel(), out);
}

void SafetensorsReader::read_f32_range(const std::string& name, int64_t first, int64_t count,
                                       float* out) const {
  const SafetensorsEntry& tensor = entry(name);
  if (first < 0 || count < 0 || first + count > tensor.numel())
    throw std::logic_error(error("elements [" + std::to_string(first) + ", " +
                                 std::to_string(first + count) + ") of tensor '" + name +
                                 "' asked for; it has " + std::to_string(tensor.numel())));
  if (count == 0) return;
  const size_t element_size = safetensors_dtype_size(tensor.dtype);
  const uint8_t* source = data_ + tensor.begin + size_t(first) * element_size;
  if (tensor.dtype == "F32") {
    std::memcpy(out, source, static_cast<size_t>(count) * sizeof(float));
  } else {
    const bool is_bf16 = tensor.dtype == "BF16";
    for (int64_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, source + 2 * i, sizeof(bits));  // offsets need not be aligned
      out[i] = is_bf16 ? bf16_to_float(bits) : f16_to_float(bits);
    }
  }
  release_pages(source, size_t(count) * element_size);
}

void SafetensorsReader::release_pages(const uint8_t* begin, size_t bytes) const {
  // The range's pages leave this process (they stay in the page cache): a rank reading its
  // share piece by piece never has more than a piece of the file mapped in memory. The
  // mapping is private and read-only, so dropping a page only means reading it again.
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t last = reinterpret_cast<uintptr_t>(begin) + bytes;
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

SafetensorsWriter::PendingTensor& SafetensorsWriter::start_tensor(const std::string& name,
                                                                  std::vector<int64_t> shape,
                                                                  const std::string& dtype,
                                                                  const float* data) {
  if (name.empty() || name == "__metadata__") {
    throw std::runtime_error("safetensors writer: invalid tensor name '" + name + "'");
  }
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) {
      throw std::runtime_error("safetensors writer: tensor '" + name + "' added twice");
    }
  }
  uint64_t numel = 0;
  if (!checked_numel(shape, numel)) {
    throw std::runtime_error("safetensors writer: tensor '" + name + "' has invalid shape " +
                             shape_string(shape));
  }
  if (numel > 0 && data == nullptr) {
    throw std::runtime_error("safetensors writer: tensor '" + name + "' has no data");
  }
  PendingTensor& tensor = tensors_.emplace_back();
  tensor.name = name;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.bytes.resize(numel * safetensors_dtype_size(dtype));
  return tensor;
}

void SafetensorsWriter::add(const std::string& name, std::vector<int64_t> shape,
                            const float* data) {
  PendingTensor& tensor = start_tensor(name, std::move(shape), "F32", data);
  if (!tensor.bytes.empty()) std::memcpy(tensor.bytes.data(), data, tensor.bytes.size());
}

void SafetensorsWriter::add_bf16(const std::string& name, std::vector<int64_t> shape,
                                 const float* data) {
  PendingTensor& tensor = start_tensor(name, std::move(shape), "BF16", data);
  const size_t count = tensor.bytes.size() / 2;
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = float_to_bf16(data[i]);
    std::memcpy(tensor.bytes.data() + 2 * i, &bits, sizeof(bits));
  }
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path) {
  // Metadata first, then the tensors in the order given, matching their offsets.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsEntry& entry : entries)
    header[entry.name] = {
        {"dtype", entry.dtype}, {"shape", entry.shape}, {"data_offsets", {entry.begin, entry.end}}};
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("cannot write safetensors file '" + path +
                             "': tensor names and metadata must be valid UTF-8 (" + e.what() + ")");
  }
  // Trailing spaces are valid JSON and keep the data 8-byte aligned for memory-mapping.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();
  std::string bytes(kHeaderLengthBytes, '\0');
  std::memcpy(bytes.data(), &header_length, kHeaderLengthBytes);
  return bytes + header_text;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const auto& tensor : tensors_) {
    entries.push_back(
        {tensor.name, tensor.dtype, tensor.shape, offset, offset + tensor.bytes.size()});
    offset += tensor.bytes.size();
  }
  const std::string header = safetensors_header_bytes(entries, metadata_, path);

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::runtime_error("cannot create safetensors file '" + path +
                             "': " + std::strerror(errno));
  }
  try {
    write_all(fd, header.data(), header.size(), path);
    for (const auto& tensor : tensors_)
      write_all(fd, tensor.bytes.data(), tensor.bytes.size(), path);
    if (::fsync(fd) != 0) {
      throw std::runtime_error("cannot fsync safetensors file '" + path +
                               "': " + std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) {
    throw std::runtime_error("cannot close safetensors file '" + path +
                             "': " + std::strerror(errno));
  }
}

}  // namespace ulysses
