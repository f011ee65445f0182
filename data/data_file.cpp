#include "data/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "data/dataset.h"

namespace ulysses {

namespace {

// Closes the descriptor on every way out.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

DataFile::DataFile(const std::string& path) : path_(path) {
  Descriptor file{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  struct stat info;
  if (fstat(file.fd, &info) != 0) throw DataError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(info.st_mode)) throw DataError(path + ": not a regular file");
  size_ = int64_t(info.st_size);
}

void DataFile::read(int64_t offset, int64_t count, void* out) const {
  if (count == 0) return;
  const std::string changed = path_ + ": the file changed while the job ran: it had " +
                              std::to_string(size_) + " bytes when the run started, ";
  Descriptor file{open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    if (errno == ENOENT) throw DataError(changed + "and now it is gone");
    throw DataError(path_ + ": cannot open while reading: " + std::strerror(errno));
  }
  struct stat info;
  if (fstat(file.fd, &info) != 0)
    throw DataError(path_ + ": cannot stat while reading: " + std::strerror(errno));
  if (int64_t(info.st_size) != size_)
    throw DataError(changed + "now " + std::to_string(int64_t(info.st_size)) +
                    " (data must not change during a run)");
  char* target = static_cast<char*>(out);
  while (count > 0) {
    ssize_t got = pread(file.fd, target, size_t(count), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw DataError(path_ + ": read of bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + count) + ") failed: " + std::strerror(errno));
    if (got == 0)
      throw DataError(changed + "but reading byte " + std::to_string(offset) +
                      " found the end of the file (it shrank while being read)");
    target += got;
    offset += got;
    count -= got;
  }
}

}  // namespace ulysses
