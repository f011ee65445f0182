// Tracking allocator bookkeeping: every buffer is charged to a category so that memory
// claims can be proven with deterministic byte counts (docs/design.md, "Memory accounting").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ulysses {

enum class MemCategory : int {
  params,
  grads,
  optimizer,
  activations,
  checkpoints,       // layer inputs kept for the recompute (device)
  checkpoints_host,  // the same, offloaded to host memory (memory.offload_checkpoints)
  attention,
  mlp,  // the MLP's intermediates ([R, F] each, or one tile of rows with memory.tiled_mlp)
  comm,
  workspace,
};
constexpr int kNumMemCategories = 10;

const char* mem_category_name(MemCategory category);

// Thrown when an allocation would go past the configured limit.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether the category is the backend's own memory (the GPU's on cuda): everything but
// checkpoints_host. The totals and memory.limit_gib count those only.
bool is_device_memory(MemCategory category);
// A device category outside the model state: what MemoryStats::working_* count.
bool is_working_memory(MemCategory category);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;  // device categories
  int64_t total_peak = 0;
  // Device bytes outside the model state (params, grads, optimizer): activations, their
  // checkpoints and every working buffer, collective staging included, at one time.
  int64_t working_current = 0;
  int64_t working_peak = 0;
};

class MemoryTracker {
 public:
  // limit_bytes = 0 means unlimited.
  explicit MemoryTracker(int64_t limit_bytes = 0) : limit_bytes_(limit_bytes) {}

  // Charges bytes to a category; throws OutOfMemoryError naming the request and what is
  // held when the limit would be exceeded.
  void charge(MemCategory category, int64_t bytes, const std::string& what);
  void release(MemCategory category, int64_t bytes);

  // Forgets peaks (current stays), e.g. to measure one training step.
  void reset_peaks();
  void set_limit(int64_t limit_bytes) { limit_bytes_ = limit_bytes; }
  // In planning mode buffers are charged but never allocated (--dry-run's memory plan).
  void set_planning(bool planning) { planning_ = planning; }
  bool planning() const { return planning_; }
  int64_t limit() const { return limit_bytes_; }

  const MemoryStats& stats() const { return stats_; }
  int64_t current(MemCategory category) const { return stats_.current[int(category)]; }
  int64_t peak(MemCategory category) const { return stats_.peak[int(category)]; }

  // "params 1.2 MiB, grads ..." of the current bytes.
  std::string describe_current() const;

 private:
  int64_t limit_bytes_;
  bool planning_ = false;
  MemoryStats stats_;
};

std::string format_bytes(int64_t bytes);

}  // namespace ulysses
