// A data file (text or token shard) read at the positions asked for with pread, never
// memory-mapped: a file that shrinks, grows, disappears or fails to read while the job
// runs becomes a DataError naming it and both sizes, never a SIGBUS (docs/failures.md).
// No descriptor stays open between reads, so a corpus may hold any number of files.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

class DataFile {
 public:
  DataFile() = default;
  // Records the file's size; throws DataError naming it when it is not a regular file that can
  // be opened (data/input_file.h).
  explicit DataFile(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // at open

  // Bytes [offset, offset + count) into out. Throws DataError when the file is gone, its
  // size differs from the size at open, or reading fails.
  void read(int64_t offset, int64_t count, void* out) const;

 private:
  std::string path_;
  int64_t size_ = 0;
};

}  // namespace ulysses
