#include "data/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace ulysses {

namespace {

std::string quoted(const std::string& path) {
  return "'" + path + "'";
}

// What stat(2) failing with `error` means for the user.
std::string stat_problem(const std::string& path, int error) {
  switch (error) {
    case ENOENT: {
      struct stat link;
      if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
        return quoted(path) + " is a symbolic link to a path that does not exist";
      return quoted(path) + " does not exist";
    }
    case ELOOP:
      return quoted(path) + " is a symbolic link loop (too many levels of symbolic links)";
    case ENOTDIR:
      return quoted(path) + " does not exist (a part of the path is a file, not a folder)";
    default:
      return quoted(path) + " cannot be read: " + std::strerror(error);
  }
}

// A file that is not regular or a folder, as the message names it.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

std::string regular_file_problem(const std::string& path, mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return quoted(path) + " is a folder, not a file";
  return quoted(path) + " is " + kind_of(mode) + ", not a regular file";
}

}  // namespace

std::string input_file_problem(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return stat_problem(path, errno);
  return regular_file_problem(path, info.st_mode);
}

std::string input_folder_problem(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return stat_problem(path, errno);
  if (S_ISDIR(info.st_mode)) return "";
  if (S_ISREG(info.st_mode)) return quoted(path) + " is a file, not a folder";
  return quoted(path) + " is " + kind_of(info.st_mode) + ", not a folder";
}

InputFile::InputFile(const std::string& path) : path_(path) {
  // stat first, so that nothing but a regular file is ever opened (opening a device may do
  // something); O_NONBLOCK in case a FIFO took the file's place since.
  problem_ = input_file_problem(path);
  if (!problem_.empty()) return;
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    problem_ = stat_problem(path, errno);
    return;
  }
  struct stat info;
  if (fstat(fd_, &info) != 0) {
    problem_ = stat_problem(path, errno);
  } else {
    problem_ = regular_file_problem(path, info.st_mode);
  }
  if (!problem_.empty()) {
    ::close(fd_);
    fd_ = -1;
    return;
  }
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0) fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = int64_t(info.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      path_(std::move(other.path_)),
      problem_(std::move(other.problem_)) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
    problem_ = std::move(other.problem_);
  }
  return *this;
}

int InputFile::release() {
  return std::exchange(fd_, -1);
}

bool InputFile::read_all(std::string& text) {
  if (fd_ < 0) return false;
  text.clear();
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd_, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      problem_ = quoted(path_) + " cannot be read: " + std::strerror(errno);
      return false;
    }
    if (got == 0) return true;
    text.append(chunk, size_t(got));
  }
}

}  // namespace ulysses
