#include "core/train/divergence_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace ulysses {

namespace {

// The running mean weighs the last this many normal steps (exactly, until there are that
// many): long enough to smooth a noisy batch, short enough to follow a falling loss.
constexpr int64_t kMeanSteps = 16;

}  // namespace

DivergenceGuard::DivergenceGuard(const TrainConfig& train, int vocab_size)
    : train_(train), uniform_loss_(std::log(double(std::max(vocab_size, 2)))) {}

std::string DivergenceGuard::spike(double loss) const {
  if (normal_steps_ == 0 || train_.spike_loss_factor <= 0.0) return "";
  // The floor keeps a loss that has fallen close to 0 from making every jump (a longer
  // curriculum stage, a harder batch) look like a spike: a model more than a few times worse
  // than guessing uniformly is broken, whatever it was before.
  const double reference = std::max(loss_mean_, uniform_loss_);
  if (loss <= train_.spike_loss_factor * reference) return "";
  return fmt::format(
      "the loss {:.6g} is more than train.spike_loss_factor = {:g} times {:.4g}, the larger of "
      "the running mean of the loss ({:.4g}) and ln(vocab_size) ({:.4g})",
      loss, train_.spike_loss_factor, reference, loss_mean_, uniform_loss_);
}

void DivergenceGuard::step_done(int64_t measured_step, bool normal, double loss) {
  if (!normal) return;
  ++normal_steps_;
  loss_mean_ += (loss - loss_mean_) / double(std::min(normal_steps_, kMeanSteps));
  if (!newest_folder_.empty() && newest_step_ == measured_step) {
    good_folder_ = newest_folder_;
    good_step_ = newest_step_;
  }
}

void DivergenceGuard::checkpoint_saved(int64_t step, const std::string& folder) {
  newest_folder_ = folder;
  newest_step_ = step;
}

void DivergenceGuard::resumed(const std::string& folder, int64_t step, const GuardRecord& record) {
  loss_mean_ = record.loss_mean;
  normal_steps_ = record.normal_steps;
  newest_folder_ = folder;
  newest_step_ = step;
  if (!record.good_step) return;
  const std::filesystem::path beside =
      std::filesystem::path(folder).parent_path() / checkpoint_folder_name(*record.good_step);
  std::error_code error;
  if (std::filesystem::is_directory(beside, error)) {
    good_folder_ = beside.string();
    good_step_ = record.good_step;
  }
}

GuardRecord DivergenceGuard::record() const {
  GuardRecord record;
  record.good_step = good_step_;
  record.loss_mean = loss_mean_;
  record.normal_steps = normal_steps_;
  return record;
}

std::string DivergenceGuard::go_back_advice() const {
  const std::string gentler =
      train_.grad_clip > 0.0 ? "a lower train.lr" : "a lower train.lr or a train.grad_clip";
  if (good_folder_.empty())
    return "No checkpoint was saved before the trouble began (no normal step measured the "
           "weights of one): start again with " +
           gentler;
  return "The newest checkpoint saved before the trouble began is " + good_folder_ +
         ": go back to it with --resume " + good_folder_ + " and " + gentler +
         " (and train.checkpoint.overwrite: true, which replaces the newer checkpoints of "
         "train.checkpoint.dir once the new run has written its first)";
}

}  // namespace ulysses
