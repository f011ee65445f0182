#include "core/checkpoint/safetensors_placed.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/checkpoint/safetensors.h"

namespace ulysses {

namespace {

std::string failure(const std::string& what, const std::string& path) {
  return what + " safetensors file '" + path + "': " + std::strerror(errno);
}

void pwrite_all(int fd, const void* bytes, size_t size, uint64_t offset, const std::string& path) {
  const auto* cursor = static_cast<const uint8_t*>(bytes);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd, cursor, size, off_t(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(failure("cannot write", path));
    }
    cursor += written;
    offset += uint64_t(written);
    size -= size_t(written);
  }
}

}  // namespace

std::string placed_safetensors_header(const std::vector<NamedShape>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      const std::string& path) {
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const NamedShape& tensor : tensors) {
    SafetensorsEntry entry{tensor.name, "F32", tensor.shape, offset, 0};
    entry.end = offset + uint64_t(entry.numel()) * sizeof(float);
    offset = entry.end;
    entries.push_back(std::move(entry));
  }
  return safetensors_header_bytes(entries, metadata, path);
}

void create_placed_safetensors(const std::string& path, const std::string& header,
                               uint64_t data_bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(failure("cannot create", path));
  try {
    pwrite_all(fd, header.data(), header.size(), 0, path);
    if (::ftruncate(fd, off_t(header.size() + data_bytes)) != 0)
      throw std::runtime_error(failure("cannot size", path));
    if (::fsync(fd) != 0) throw std::runtime_error(failure("cannot fsync", path));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw std::runtime_error(failure("cannot close", path));
}

PlacedSafetensorsWriter::PlacedSafetensorsWriter(const std::string& path, uint64_t header_bytes)
    : path_(path), header_bytes_(header_bytes) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(failure("cannot open", path));
}

PlacedSafetensorsWriter::~PlacedSafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void PlacedSafetensorsWriter::write(int64_t first, int64_t count, const float* values) {
  if (fd_ < 0) throw std::logic_error("safetensors file '" + path_ + "' written after finish()");
  pwrite_all(fd_, values, size_t(count) * sizeof(float),
             header_bytes_ + uint64_t(first) * sizeof(float), path_);
}

void PlacedSafetensorsWriter::finish() {
  if (fd_ < 0) throw std::logic_error("safetensors file '" + path_ + "' finished twice");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw std::runtime_error(failure("cannot fsync", path_));
  }
  if (::close(fd) != 0) throw std::runtime_error(failure("cannot close", path_));
}

}  // namespace ulysses
