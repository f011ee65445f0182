#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "data/dataset.h"

namespace ulysses {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    close(fd);
    throw DataError(path + ": cannot stat: " + std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    throw DataError(path + ": not a regular file");
  }
  size_ = int64_t(info.st_size);
  // mmap refuses a zero-length mapping; an empty file simply has no bytes.
  if (size_ > 0) {
    void* mapping = mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      int error = errno;
      close(fd);
      throw DataError(path + ": cannot memory-map " + std::to_string(size_) +
                      " bytes: " + std::strerror(error));
    }
    data_ = static_cast<const uint8_t*>(mapping);
  }
  close(fd);
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_t(size_));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace ulysses
