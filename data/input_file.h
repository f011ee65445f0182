// Every file a run reads — the config, data, weights, checkpoints — is opened here: only when
// it is a regular file, and without blocking (docs/failures.md, "Bad input"). open(2) of a FIFO
// that no one writes to never returns, and std::filesystem reports a symbolic link loop as a
// path that does not exist; here each is a message naming the path and what it is.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

// Why `path` cannot be read as a regular file, or "" when it can be opened as one:
// "'p' does not exist", "'p' is a folder, not a file", "'p' is a FIFO (named pipe), not a
// regular file", "'p' is a symbolic link loop", "'p' cannot be read: Permission denied".
std::string input_file_problem(const std::string& path);

// Why `path` is not a folder, or "" when it is one (same wording).
std::string input_folder_problem(const std::string& path);

// A regular file open for reading; the descriptor is closed by the destructor.
class InputFile {
 public:
  // On failure is_open() is false and problem() says why (as input_file_problem).
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  const std::string& problem() const { return problem_; }
  int fd() const { return fd_; }
  int64_t size() const { return size_; }  // at open
  // Hands the descriptor to the caller, who closes it.
  int release();

  // The whole file; false with problem() set when reading fails.
  bool read_all(std::string& text);

 private:
  int fd_ = -1;
  int64_t size_ = 0;
  std::string path_;
  std::string problem_;
};

}  // namespace ulysses
