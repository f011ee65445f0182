#include "core/report/metrics.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ulysses {

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_)
    throw std::runtime_error("cannot open log.metrics_file '" + path +
                             "' for writing: " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!file_) return;
  std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    throw std::runtime_error(std::string("writing the metrics file failed: ") +
                             std::strerror(errno));
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
