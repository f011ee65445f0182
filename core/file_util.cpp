#include "core/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ulysses {

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

std::string system_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32_of_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error(system_error("cannot read", path));
  std::vector<char> chunk(1 << 20);
  uint32_t crc = 0;
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), file)) > 0)
    crc = crc32_update(crc, chunk.data(), n);
  bool failed = std::ferror(file);
  std::fclose(file);
  if (failed) throw std::runtime_error(system_error("error reading", path));
  return crc;
}

void write_file_durably(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(system_error("cannot create", path));
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      throw std::runtime_error(system_error("cannot write", path));
    }
    written += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw std::runtime_error(system_error("cannot sync", path));
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(system_error("cannot read", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw std::runtime_error(system_error("cannot open directory", path));
  int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) throw std::runtime_error(system_error("cannot sync directory", path));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + from + "' to '" + to +
                             "': " + std::strerror(errno));
}

}  // namespace ulysses
