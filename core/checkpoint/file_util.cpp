#include "core/checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "data/input_file.h"

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

std::filesystem::path folder_of(const std::string& path) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  return folder.empty() ? "." : folder;
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
  InputFile file(path);
  if (!file.is_open()) throw std::runtime_error(file.problem());
  std::vector<char> chunk(1 << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(file.fd(), chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(system_error("error reading", path));
    if (n == 0) return crc;
    crc = crc32_update(crc, chunk.data(), size_t(n));
  }
}

void write_file_durably(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(system_error("cannot create", path));
  // A partial file would only take space (a full disk): it goes with the error.
  auto fail = [&](const char* what) {
    const std::string message = system_error(what, path);
    if (fd >= 0) ::close(fd);
    std::remove(path.c_str());
    throw std::runtime_error(message);
  };
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write");
    written += size_t(n);
  }
  if (::fsync(fd) != 0) fail("cannot sync");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("cannot sync");
}

void replace_file_durably(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  write_file_durably(temp, text);
  try {
    rename_or_throw(temp, path);
  } catch (...) {
    std::remove(temp.c_str());
    throw;
  }
}

std::string read_whole_file(const std::string& path) {
  InputFile file(path);
  std::string text;
  if (!file.read_all(text)) throw std::runtime_error(file.problem());
  return text;
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw std::runtime_error(system_error("cannot open directory", path));
  int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) throw std::runtime_error(system_error("cannot sync directory", path));
}

std::string output_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) return "'" + path + "' is a folder, not a file";
  const fs::path folder = folder_of(path);
  // The writer creates the missing folders (create_parent_folders), in the nearest one that
  // exists; a part of the path that is a file reads as missing here and is named below.
  fs::path existing = folder;
  while (fs::status(existing, error).type() == fs::file_type::not_found) {
    const fs::path parent = existing.has_parent_path() ? existing.parent_path() : ".";
    if (parent == existing) break;
    existing = parent;
  }
  const std::string creating =
      existing == folder ? "" : "'" + folder.string() + "' cannot be created: ";
  if (const std::string problem = input_folder_problem(existing); !problem.empty())
    return "its folder " + creating + problem;
  if (::access(existing.c_str(), W_OK) != 0)
    return "its folder " + creating + "'" + existing.string() +
           "' cannot be written: " + std::strerror(errno);
  return "";
}

void create_parent_folders(const std::string& path) {
  const std::filesystem::path folder = folder_of(path);
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error)
    throw std::runtime_error("cannot create the folder '" + folder.string() + "' for '" + path +
                             "': " + error.message());
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + from + "' to '" + to +
                             "': " + std::strerror(errno));
}

ExclusiveLock try_lock_exclusive(int fd) {
  int result;
  do {
    result = flock(fd, LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result == 0) return ExclusiveLock::taken;
  return errno == EWOULDBLOCK ? ExclusiveLock::held_elsewhere : ExclusiveLock::unsupported;
}

}  // namespace ulysses
