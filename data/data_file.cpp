#include "data/data_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "data/dataset.h"
#include "data/input_file.h"

namespace ulysses {

DataFile::DataFile(const std::string& path) : path_(path) {
  const InputFile file(path);
  if (!file.is_open()) throw DataError(file.problem());
  size_ = file.size();
}

void DataFile::read(int64_t offset, int64_t count, void* out) const {
  if (count == 0) return;
  const std::string changed = path_ + ": the file changed while the job ran: it had " +
                              std::to_string(size_) + " bytes when the run started, ";
  const InputFile file(path_);
  if (!file.is_open()) throw DataError(changed + "and now " + file.problem());
  if (file.size() != size_)
    throw DataError(changed + "now " + std::to_string(file.size()) +
                    " (data must not change during a run)");
  char* target = static_cast<char*>(out);
  while (count > 0) {
    ssize_t got = pread(file.fd(), target, size_t(count), off_t(offset));
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
