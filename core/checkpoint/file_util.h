// File operations: durable writes for checkpoints (nothing is visible under its final name
// until it is complete and on disk), whole-file reads of regular files only
// (data/input_file.h), the check of a path a run writes later, and the lock one run holds on
// what it writes.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses {

// CRC-32 (IEEE) of a byte range, continuing from crc.
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);
// CRC-32 of a whole file; throws naming the file if it is not a regular file or cannot be
// read (data/input_file.h).
uint32_t crc32_of_file(const std::string& path);

// Writes text to path and fsyncs it; on failure the partial file is removed.
void write_file_durably(const std::string& path, const std::string& text);
// Writes text durably to path.tmp and renames it to path, so path is the old file or the whole
// new one, never part of it; on failure path.tmp is removed. The caller fsyncs the folder.
void replace_file_durably(const std::string& path, const std::string& text);
// The whole file; throws naming it as crc32_of_file does.
std::string read_whole_file(const std::string& path);
// fsync of a directory, so renames inside it are on disk.
void fsync_directory(const std::string& path);
// Why no file can be written at path (it is a folder, or its folder cannot be written or, where
// it is missing, created), or "" when one can: for outputs checked when a run starts and
// written later, after create_parent_folders.
std::string output_file_problem(const std::string& path);
// Creates the missing folders above path (as mkdir -p); throws naming the folder.
void create_parent_folders(const std::string& path);
// rename(2) that throws with both names on failure.
void rename_or_throw(const std::string& from, const std::string& to);

// An exclusive flock(2) on an open file, without waiting: taken, held by another open file (a
// second run), or not possible on this file system (`errno` says why).
enum class ExclusiveLock { taken, held_elsewhere, unsupported };
ExclusiveLock try_lock_exclusive(int fd);

}  // namespace ulysses
