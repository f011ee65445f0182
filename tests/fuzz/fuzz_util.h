// Helpers shared by the libFuzzer targets (docs/fuzzing.md).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ulysses::fuzz {

// An invariant of the code under test does not hold: print it and abort, so libFuzzer
// keeps the input as a crash.
[[noreturn]] inline void invariant_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// One scratch file per process (libFuzzer's -jobs / -fork run several at once), under
// /dev/shm when there is one so that writing it costs no disk I/O; removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const char* tag) {
    const char* folder = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : nullptr;
    if (!folder) folder = std::getenv("TMPDIR");
    if (!folder || !*folder) folder = "/tmp";
    path_ = std::string(folder) + "/ulysses-fuzz-" + tag + "-" + std::to_string(getpid());
  }
  ~ScratchFile() { unlink(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }

  // Replaces the file's contents with the bytes; aborts when it cannot (not a finding).
  void write(const uint8_t* data, size_t size) const {
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) setup_failed("open");
    while (size > 0) {
      ssize_t written = ::write(fd, data, size);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) setup_failed("write");
      data += written;
      size -= size_t(written);
    }
    if (close(fd) != 0) setup_failed("close");
  }

 private:
  [[noreturn]] void setup_failed(const char* call) const {
    std::fprintf(stderr, "fuzz setup: %s of %s failed: %s\n", call, path_.c_str(),
                 std::strerror(errno));
    std::abort();
  }

  std::string path_;
};

}  // namespace ulysses::fuzz
