// The JSON-lines metrics file: one object per line, flushed as it is written so a
// crashed run keeps every line it reported. A line is whole or absent: a write that fails (a
// full disk) takes back what it wrote. A resumed run keeps the lines through its checkpoint's
// step and appends after them: the lines of steps it trains again (written after that
// checkpoint, before a kill) and a torn last line are dropped, so each step has one line. The
// writer holds an exclusive flock(2) on the file while it lives: a second run that names the
// same file is refused before it cuts or writes anything (docs/configuration.md, `log`).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/memory.h"

namespace ulysses {

// Another run writes the file (bad input: each run needs its own).
class MetricsFileInUse : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class MetricsWriter {
 public:
  // Empty path: writes nothing. resumed_step: the step a resumed run starts after (the lines
  // through it stay); nullopt for a fresh run, which starts the file anew.
  MetricsWriter(const std::string& path, std::optional<int64_t> resumed_step);
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
