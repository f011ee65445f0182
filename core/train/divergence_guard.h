// The divergence guard (docs/failures.md#loss-spikes). Beside finiteness, a step whose loss is
// far above the running mean of the normal steps before it is a spike, and
// train.on_nonfinite treats it as it treats a NaN. A step's loss measures the weights the
// step before it left, so a checkpoint counts as good once the step after it was normal:
// the guard keeps the newest such one, which keep_last pruning never removes and every
// abort (exit 3) names as the checkpoint to go back to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/checkpoint/checkpoint_format.h"
#include "core/config/config.h"

namespace ulysses {

class DivergenceGuard {
 public:
  DivergenceGuard(const TrainConfig& train, int vocab_size);

  // Why a step with this finite loss is a spike; "" when it is not, and before the first
  // normal step (there is nothing to compare with yet).
  std::string spike(double loss) const;
  // After the step that measured the weights of step `measured_step`: a normal one (finite,
  // no spike) joins the running mean and makes the checkpoint of those weights, if one was
  // written or resumed from, the good one.
  void step_done(int64_t measured_step, bool normal, double loss);
  // A checkpoint of the weights after `step` is in folder.
  void checkpoint_saved(int64_t step, const std::string& folder);
  // Resumed from folder at step: its record gives the running mean and the good checkpoint
  // (a step folder beside it, if it is still there).
  void resumed(const std::string& folder, int64_t step, const GuardRecord& record);

  // The newest checkpoint whose weights a normal step measured; "" when there is none.
  const std::string& good_checkpoint() const { return good_folder_; }
  // What a checkpoint records for a resumed run.
  GuardRecord record() const;
  // The end of an abort message: the checkpoint to go back to, and how.
  std::string go_back_advice() const;

 private:
  const TrainConfig& train_;
  // ln(vocab_size): the loss of predicting every token with equal probability.
  double uniform_loss_;
  double loss_mean_ = 0.0;
  int64_t normal_steps_ = 0;
  // The newest checkpoint written or resumed from, which no step may have measured yet.
  std::string newest_folder_;
  int64_t newest_step_ = -1;
  std::string good_folder_;
  std::optional<int64_t> good_step_;
};

}  // namespace ulysses
