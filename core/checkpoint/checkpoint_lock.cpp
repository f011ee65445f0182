#include "core/checkpoint/checkpoint_lock.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/file_util.h"

namespace ulysses {

namespace {

// The first line of what the holder wrote, kept printable: the file is anybody's to edit.
std::string read_holder(int fd) {
  char buffer[512];
  const ssize_t got = pread(fd, buffer, sizeof buffer, 0);
  std::string holder;
  for (ssize_t i = 0; i < got && buffer[i] != '\n'; ++i)
    holder += (buffer[i] >= 0x20 && buffer[i] < 0x7f) ? buffer[i] : '?';
  return holder;
}

void write_holder(int fd, const std::string& holder) {
  // Only informs another run's message: a failure here (a full disk) does not matter.
  const std::string line = holder + "\n";
  if (ftruncate(fd, 0) != 0) return;
  [[maybe_unused]] const ssize_t written = pwrite(fd, line.data(), line.size(), 0);
}

}  // namespace

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) close(fd_);
}

std::string CheckpointDirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointLockFile;
  bool writable = true;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    writable = false;
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) {
    acquired_ = true;
    return "";
  }
  const ExclusiveLock lock = try_lock_exclusive(fd);
  if (lock == ExclusiveLock::held_elsewhere) {
    const std::string other = read_holder(fd);
    close(fd);
    return "train.checkpoint.dir '" + dir + "' is in use by another run (" +
           (other.empty() ? std::string("it has not said which yet") : other) +
           "): two runs saving into one folder would overwrite each other's checkpoints. Let " +
           "that run end, or stop it, and continue with --resume auto; or choose another " +
           "train.checkpoint.dir";
  }
  acquired_ = true;
  if (lock == ExclusiveLock::unsupported) {
    spdlog::warn(
        "train.checkpoint.dir '{}': cannot lock {} ({}), so nothing stops a second run from "
        "saving into this folder at the same time: make sure only one run uses it",
        dir, path, std::strerror(errno));
    close(fd);
    return "";
  }
  if (writable) write_holder(fd, holder_);
  fd_ = fd;
  return "";
}

std::string describe_lock_holder(const std::string& what) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "an unknown host");
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char since[32];
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "pid " + std::to_string(getpid()) + " on " + host + " since " + since + ": " + what;
}

}  // namespace ulysses
