#include "core/report/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ulysses {

namespace {

// Cuts a file that does not end in a newline back to its last one (to nothing without one).
void drop_torn_last_line(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return;  // not there yet: nothing to drop
  std::fseek(file, 0, SEEK_END);
  const long end = std::ftell(file);
  long keep = end;
  for (long at = end - 1; at >= 0; --at) {
    std::fseek(file, at, SEEK_SET);
    if (std::fgetc(file) == '\n') break;
    keep = at;
  }
  std::fclose(file);
  if (keep < end && ::truncate(path.c_str(), keep) != 0)
    throw std::runtime_error("cannot drop the torn last line of log.metrics_file '" + path +
                             "': " + std::strerror(errno));
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  if (append) drop_torn_last_line(path);
  file_ =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (file_ < 0)
    throw std::runtime_error("cannot open log.metrics_file '" + path +
                             "' for writing: " + std::strerror(errno));
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
