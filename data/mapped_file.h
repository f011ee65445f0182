// A read-only memory mapping of a whole file. Corpora and token shards can be far larger
// than memory; mapping them lets a rank touch only the pages of the slices it reads.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the file; throws DataError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace ulysses
