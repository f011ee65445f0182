// The JSON-lines metrics file: one object per line, flushed as it is written so a
// crashed run keeps every line it reported. A line is whole or absent: a write that fails (a
// full disk) takes back what it wrote, and appending (a resumed run) first drops a torn last
// line that a kill or an older build left, so the next line does not run into it.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kernels/memory.h"

namespace ulysses {

class MetricsWriter {
 public:
  // Empty path: writes nothing. append keeps earlier whole lines (resume).
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const nlohmann::json& line);

 private:
  std::string path_;
  int file_ = -1;
  off_t whole_lines_end_ = 0;  // the file's size after the last whole line
};

// {"params": bytes, ..., "total": bytes} of the peaks.
nlohmann::json memory_peaks_json(const MemoryStats& stats);
// {"params": bytes, ..., "total": bytes} of the current bytes.
nlohmann::json memory_current_json(const MemoryStats& stats);

}  // namespace ulysses
