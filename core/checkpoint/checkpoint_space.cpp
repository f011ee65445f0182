#include "core/checkpoint/checkpoint_space.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <system_error>

#include "core/checkpoint/checkpoint_weights.h"
#include "core/checkpoint/optimizer_file.h"
#include "kernels/memory.h"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

// trainer_state.json and manifest.json: a few hundred bytes each, plus a manifest line per file.
constexpr uint64_t kStateAndManifestBytes = 16 * 1024;
constexpr uint64_t kManifestBytesPerFile = 256;

std::string size_text(uint64_t bytes) {
  return format_bytes(int64_t(bytes));
}

// Step folders left after keep_last pruning of `folders`: pruning also keeps the checkpoint to
// go back to, the previous save (core/checkpoint/checkpoint.h, folders_to_prune), so keep_last
// 1 keeps two.
int64_t folders_after_pruning(const CheckpointConfig& checkpoint, int64_t folders) {
  if (checkpoint.keep_last <= 0) return folders;
  return std::min<int64_t>(folders, std::max(checkpoint.keep_last, 2));
}

}  // namespace

uint64_t checkpoint_bytes(const ParamTable& table, int optimizer_shards) {
  const int64_t total = table.total_numel();
  const uint64_t weights =
      checkpoint_weights_header(table, std::numeric_limits<int64_t>::max(), "llama", "").size() +
      uint64_t(total) * sizeof(float);
  // A shard holds at most one range per tensor it touches; each range written with the
  // widest numbers bounds its header.
  const std::vector<FlatRange> widest(table.specs().size() + 1, FlatRange{total, total});
  const uint64_t optimizer_header = optimizer_file_header(widest, total, "").size();
  const uint64_t optimizer =
      uint64_t(optimizer_shards) * optimizer_header + 2 * uint64_t(total) * sizeof(float);
  return weights + optimizer + kStateAndManifestBytes +
         uint64_t(optimizer_shards + 2) * kManifestBytesPerFile;
}

std::optional<uint64_t> available_bytes(const std::string& folder) {
  fs::path existing = fs::absolute(folder);
  std::error_code error;
  while (!fs::exists(existing, error) && existing.has_parent_path() &&
         existing != existing.parent_path())
    existing = existing.parent_path();
  const fs::space_info space = fs::space(existing, error);
  // Some file systems (FUSE, a few network ones) report a capacity of 0: they say nothing.
  if (error || space.capacity == 0 || space.available == static_cast<std::uintmax_t>(-1))
    return std::nullopt;
  return uint64_t(space.available);
}

bool is_checkpoint_step(const CheckpointConfig& checkpoint, int64_t step, int64_t last_step) {
  return (checkpoint.every > 0 && step % checkpoint.every == 0) || step == last_step;
}

std::vector<int64_t> checkpoint_steps(const CheckpointConfig& checkpoint, int64_t first_step,
                                      int64_t last_step) {
  std::vector<int64_t> steps;
  for (int64_t step = first_step + 1; step <= last_step; ++step)
    if (is_checkpoint_step(checkpoint, step, last_step)) steps.push_back(step);
  return steps;
}

int64_t checkpoints_held_at_most(const CheckpointConfig& checkpoint, int64_t saves) {
  if (saves <= 0) return 0;
  return folders_after_pruning(checkpoint, saves - 1) + 1;
}

SpaceVerdict checkpoint_space_at_start(const CheckpointConfig& checkpoint, uint64_t checkpoint_size,
                                       uint64_t available, int kept,
                                       const std::vector<int64_t>& save_steps) {
  SpaceVerdict verdict;
  if (save_steps.empty()) return verdict;
  const std::string where = "train.checkpoint.dir '" + checkpoint.dir + "'";
  if (checkpoint_size > available) {
    verdict.error = where + " is on a file system with " + size_text(available) +
                    " available, less than one checkpoint of this model (" +
                    size_text(checkpoint_size) +
                    ": the weights, two Adam moments and the trainer state), so the run would "
                    "stop at its first save, step " +
                    std::to_string(save_steps.front()) +
                    ". Free space there or choose another train.checkpoint.dir";
    return verdict;
  }
  // Each save writes a whole new folder before keep_last pruning removes any older one.
  int64_t folders = kept;
  for (const int64_t step : save_steps) {
    const int64_t grown = folders - kept;
    if (double(grown + 1) * double(checkpoint_size) > double(available)) {
      verdict.warning =
          where + " is on a file system with " + size_text(available) +
          " available; this run saves " + std::to_string(save_steps.size()) + " checkpoint(s) of " +
          size_text(checkpoint_size) + " and " +
          (checkpoint.keep_last > 0
               ? "keeps the newest " + std::to_string(checkpoint.keep_last)
               : std::string("keeps them all (train.checkpoint.keep_last: 0)")) +
          ", so the save at step " + std::to_string(step) +
          " would not fit and would stop the run (exit 1) unless space is freed by then. "
          "Keep fewer with train.checkpoint.keep_last, save less often, or free space";
      return verdict;
    }
    folders = folders_after_pruning(checkpoint, folders + 1);
  }
  return verdict;
}

std::string checkpoint_space_at_save(const std::string& dir, int64_t step, uint64_t checkpoint_size,
                                     uint64_t available) {
  if (checkpoint_size <= available) return "";
  return "not writing the checkpoint of step " + std::to_string(step) + ": it needs " +
         size_text(checkpoint_size) + " and the file system of train.checkpoint.dir '" + dir +
         "' has " + size_text(available) +
         " available. The checkpoints already written there are intact; free space and "
         "continue with --resume auto (docs/failures.md#a-full-disk)";
}

}  // namespace ulysses
