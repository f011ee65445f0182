#include "core/report/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "core/checkpoint/file_util.h"

namespace ulysses {

namespace {

// Cuts the file after its last whole line about a step <= last_step, or a whole line about no
// step; to nothing when there is none. Lines are read from the end, a chunk at a time: a resume
// drops the few lines written after its checkpoint, not a pass over the whole history.
void keep_lines_through_step(const std::string& path, int64_t last_step) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // not there yet: nothing to keep
  const off_t size = ::lseek(fd, 0, SEEK_END);
  constexpr off_t kChunk = 64 * 1024;
  std::string pending;  // bytes [pending_begin, end) of the file, not yet judged
  off_t pending_begin = size;
  off_t end = size;  // where the file is cut
  while (end > 0) {
    // The line that ends at `end` begins after the last newline before its own last byte.
    size_t newline = std::string::npos;
    while ((pending.size() < 2 ||
            (newline = pending.rfind('\n', pending.size() - 2)) == std::string::npos) &&
           pending_begin > 0) {
      const off_t chunk = std::min(kChunk, pending_begin);
      std::string bytes(size_t(chunk), '\0');
      if (::pread(fd, bytes.data(), bytes.size(), pending_begin - chunk) != chunk) {
        ::close(fd);
        throw std::runtime_error("cannot read log.metrics_file '" + path +
                                 "': " + std::strerror(errno));
      }
      pending = bytes + pending;
      pending_begin -= chunk;
    }
    if (pending.size() >= 2) newline = pending.rfind('\n', pending.size() - 2);
    const size_t line_begin = newline == std::string::npos ? 0 : newline + 1;
    const std::string line = pending.substr(line_begin);
    const bool whole = !line.empty() && line.back() == '\n';
    const nlohmann::json object =
        whole ? nlohmann::json::parse(line, nullptr, false) : nlohmann::json();
    if (object.is_object() && (!object.contains("step") || !object["step"].is_number_integer() ||
                               object["step"].get<int64_t>() <= last_step))
      break;
    end = pending_begin + off_t(line_begin);
    pending.resize(line_begin);
  }
  ::close(fd);
  if (end < size && ::truncate(path.c_str(), end) != 0)
    throw std::runtime_error("cannot cut log.metrics_file '" + path + "' back to step " +
                             std::to_string(last_step) + ": " + std::strerror(errno));
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, std::optional<int64_t> resumed_step)
    : path_(path) {
  if (path.empty()) return;
  create_parent_folders(path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot open log.metrics_file '" + path +
                             "' for writing: " + std::strerror(errno));
  try {
    // Before the file is cut: another run writing it keeps its lines.
    if (try_lock_exclusive(fd) == ExclusiveLock::held_elsewhere)
      throw MetricsFileInUse("log.metrics_file '" + path +
                             "' is being written by another run: two runs writing one file "
                             "would mix their lines; give this run a log.metrics_file of its own");
    if (resumed_step)
      keep_lines_through_step(path, *resumed_step);
    else if (::ftruncate(fd, 0) != 0)
      throw std::runtime_error("cannot empty log.metrics_file '" + path +
                               "' for a fresh run: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);  // and the lock with it: the destructor of a writer that throws never runs
    throw;
  }
  file_ = fd;
  whole_lines_end_ = ::lseek(file_, 0, SEEK_END);
}

MetricsWriter::~MetricsWriter() {
  if (file_ >= 0) ::close(file_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (file_ < 0) return;
  const std::string text = line.dump() + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(file_, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      const int error = wrote < 0 ? errno : ENOSPC;
      if (done > 0) {
        // Best effort: a torn line left anyway is dropped when a resumed run appends.
        [[maybe_unused]] const int truncated = ::ftruncate(file_, whole_lines_end_);
      }
      throw std::runtime_error("writing log.metrics_file '" + path_ +
                               "' failed: " + std::strerror(error));
    }
    done += size_t(wrote);
  }
  whole_lines_end_ += off_t(text.size());
}

namespace {

nlohmann::json by_category(const std::array<int64_t, kNumMemCategories>& bytes, int64_t total) {
  nlohmann::json object = nlohmann::json::object();
  for (int i = 0; i < kNumMemCategories; ++i) object[mem_category_name(MemCategory(i))] = bytes[i];
  object["total"] = total;
  return object;
}

}  // namespace

nlohmann::json memory_peaks_json(const MemoryStats& stats) {
  return by_category(stats.peak, stats.total_peak);
}

nlohmann::json memory_current_json(const MemoryStats& stats) {
  return by_category(stats.current, stats.total_current);
}

}  // namespace ulysses
