// The JSON-lines metrics file: one object per line, flushed as it is written so a
// crashed run keeps every line it reported.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/memory.h"

namespace ulysses {

class MetricsWriter {
 public:
  // Empty path: writes nothing. append keeps earlier lines (resume).
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const nlohmann::json& line);

 private:
  std::FILE* file_ = nullptr;
};

// {"params": bytes, ..., "total": bytes} of the peaks.
nlohmann::json memory_peaks_json(const MemoryStats& stats);
// {"params": bytes, ..., "total": bytes} of the current bytes.
nlohmann::json memory_current_json(const MemoryStats& stats);

}  // namespace ulysses
