#include "kernels/memory.h"

#include <algorithm>
#include <cstdio>

namespace ulysses {

const char* mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::params:
      return "params";
    case MemCategory::grads:
      return "grads";
    case MemCategory::optimizer:
      return "optimizer";
    case MemCategory::activations:
      return "activations";
    case MemCategory::checkpoints:
      return "checkpoints";
    case MemCategory::checkpoints_host:
      return "checkpoints_host";
    case MemCategory::attention:
      return "attention";
    case MemCategory::mlp:
      return "mlp";
    case MemCategory::comm:
      return "comm";
    case MemCategory::workspace:
      return "workspace";
  }
  return "unknown";
}

std::string format_bytes(int64_t bytes) {
  char text[64];
  double value = double(bytes);
  if (value >= 1024.0 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%.2f GiB", value / (1024.0 * 1024 * 1024));
  } else if (value >= 1024.0 * 1024) {
    std::snprintf(text, sizeof text, "%.2f MiB", value / (1024.0 * 1024));
  } else if (value >= 1024.0) {
    std::snprintf(text, sizeof text, "%.1f KiB", value / 1024.0);
  } else {
    std::snprintf(text, sizeof text, "%lld B", (long long)bytes);
  }
  return text;
}

bool is_device_memory(MemCategory category) {
  return category != MemCategory::checkpoints_host;
}

bool is_working_memory(MemCategory category) {
  return is_device_memory(category) && category != MemCategory::params &&
         category != MemCategory::grads && category != MemCategory::optimizer;
}

void MemoryTracker::charge(MemCategory category, int64_t bytes, const std::string& what) {
  const int64_t device_bytes = is_device_memory(category) ? bytes : 0;
  if (limit_bytes_ > 0 && device_bytes > 0 && stats_.total_current + device_bytes > limit_bytes_) {
    throw OutOfMemoryError("out of memory: allocating " + format_bytes(bytes) + " for " + what +
                           " (" + mem_category_name(category) +
                           ") would exceed memory.limit_gib (" + format_bytes(limit_bytes_) +
                           "); held: " + describe_current());
  }
  int index = int(category);
  stats_.current[index] += bytes;
  stats_.total_current += device_bytes;
  if (stats_.current[index] > stats_.peak[index]) stats_.peak[index] = stats_.current[index];
  if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
  if (is_working_memory(category)) {
    stats_.working_current += bytes;
    stats_.working_peak = std::max(stats_.working_peak, stats_.working_current);
  }
}

void MemoryTracker::release(MemCategory category, int64_t bytes) {
  stats_.current[int(category)] -= bytes;
  if (is_device_memory(category)) stats_.total_current -= bytes;
  if (is_working_memory(category)) stats_.working_current -= bytes;
}

void MemoryTracker::reset_peaks() {
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
  stats_.working_peak = stats_.working_current;
}

std::string MemoryTracker::describe_current() const {
  std::string text;
  for (int i = 0; i < kNumMemCategories; ++i) {
    if (!text.empty()) text += ", ";
    text += mem_category_name(MemCategory(i));
    text += " ";
    text += format_bytes(stats_.current[i]);
  }
  text += "; total " + format_bytes(stats_.total_current);
  return text;
}

}  // namespace ulysses
