// Durable file operations for checkpoints: nothing is visible under its final name until
// it is complete and on disk.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

// CRC-32 (IEEE) of a byte range, continuing from crc.
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);
// CRC-32 of a whole file; throws naming the file if it cannot be read.
uint32_t crc32_of_file(const std::string& path);

// Writes text to path and fsyncs it.
void write_file_durably(const std::string& path, const std::string& text);
std::string read_whole_file(const std::string& path);
// fsync of a directory, so renames inside it are on disk.
void fsync_directory(const std::string& path);
// rename(2) that throws with both names on failure.
void rename_or_throw(const std::string& from, const std::string& to);

}  // namespace ulysses
