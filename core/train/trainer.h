// The training loop: micro-batches, gradient accumulation and reduction over the
// dp×sp world, clipping, AdamW, periodic evaluation, console log and metrics file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/config/config.h"
#include "core/config/seq_len_schedule.h"
#include "core/model/model.h"
#include "core/report/metrics.h"
#include "core/report/step_report.h"
#include "core/train/divergence_guard.h"
#include "core/train/evaluate.h"
#include "core/train/optimizer_step.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "parallel/mesh.h"

namespace ulysses {

// What one optimizer step reports (identical on every rank).
struct StepResult {
  int64_t step = 0;  // 1-based number of the step just taken
  double loss = 0.0;
  double accuracy = -1.0;  // answer accuracy when the data has answers, else -1
  double lr = 0.0;
  double grad_norm = 0.0;
  int64_t tokens = 0;  // tokens of the global batch
  double step_seconds = 0.0;
  bool skipped = false;  // non-finite or a spike, update dropped (train.on_nonfinite: skip)
  bool spike = false;    // a loss spike (core/train/divergence_guard.h)
};

class Trainer {
 public:
  Trainer(const Config& config, Backend& backend, Mesh& mesh);

  Model& model() { return *model_; }
  int64_t step() const { return step_; }

  // One optimizer step over grad_accum micro-batches of the global batch. A non-finite
  // loss or gradient norm, or a spike (core/train/divergence_guard.h), throws JobError(nonfinite)
  // on every rank, or, with train.on_nonfinite: skip, drops the update (up to
  // train.max_skipped_steps in a row).
  StepResult train_step();
  // Planning mode only (kernels/planning_backend.h): the same step on micro-batches with a
  // target at every token, so that the planner charges what a real step allocates
  // (docs/memory.md, "The planner").
  StepResult plan_step();
  // eval_steps batches of the validation split.
  EvalResult evaluate();
  // Continues from a checkpoint folder (weights, optimizer state, step); warns when this
  // run's global batch differs from the checkpoint's (the data order then differs).
  void resume(const std::string& folder);
  // Collective: loads model.init_from when it is set (a fresh run, not a resumed one), a
  // checkpoint dir resolved once for every rank (open_agreed_weights).
  void load_initial_weights();
  // Writes a checkpoint of the current step (train.checkpoint.dir must be set).
  std::string save_checkpoint();
  // Rank 0: the step folders of train.checkpoint.dir that the first checkpoint this run writes
  // replaces (train.checkpoint.overwrite; prepare_checkpoint_dir).
  void replace_after_first_save(std::vector<std::string> folders);
  // The newest checkpoint whose weights a normal step measured ("" = none).
  const std::string& good_checkpoint() const { return guard_.good_checkpoint(); }
  // The whole run up to train.steps with logging, metrics, periodic eval and checkpoints.
  // Stops early, with a checkpoint, when SIGTERM/SIGINT arrives on any rank. Says so and
  // returns at once when the step is already train.steps or beyond.
  void run();

 private:
  // Everything of a step after its data are read: forward and backward of every micro-batch,
  // gradient reduction, clipping, AdamW and publishing the weights.
  StepResult compute_step(const std::vector<MicroBatch>& micro_batches, double counted);
  // The model for micro-batches of the stage's shape (this rank's slice: seq_len / sp).
  void build_model(const SeqLenStage& stage);
  // Opens both splits at the current length and checks that every rank sees the same data.
  void open_data();
  // Collective, before each step: moves to the length train.seq_len_schedule gives the step,
  // rebuilding the model and the data when it changes (docs/configuration.md#curriculum).
  void follow_seq_len_schedule();
  // Every rank must read the same data: the sizes each rank found are compared.
  void check_same_data(const Dataset& dataset, const char* split) const;
  // What the watchdog names when a collective of this phase waits too long.
  void set_phase(const char* phase) const;
  // Collective: whether a stop signal reached any rank (core/train/stop_signal.h).
  bool agree_on_stop() const;
  // A step the optimizer did not take (non-finite or a spike, update says which): throws
  // (abort, or too many skips) or logs a skip.
  void handle_bad_step(const StepResult& result, const OptimizerStepResult& update);
  // What the log line and the metrics file say of one step. Gathered on every rank by
  // record_step, the one collective of step reporting (the phases' maximum over the ranks);
  // log_step then only writes.
  struct StepRecord {
    StepResult result;
    CommStats comm;                 // this step's
    ProfileTotals phases;           // this rank's
    nlohmann::json phases_max;      // step phase -> its seconds on the slowest rank
    double readback_seconds = 0.0;  // reading the step's device times back
  };
  StepRecord record_step(const StepResult& result, const CommStats& comm,
                         const ProfileTotals& phases, double readback_seconds) const;
  void log_step(const StepRecord& record);
  // Before the first step: traces line up, the bare all-to-all is measured for the verdict.
  void start_profiling();
  // After the last step: the table, the verdict and the trace file.
  void finish_profiling();
  Verdict current_verdict();

  const Config& config_;
  Backend& backend_;
  Mesh& mesh_;
  // train.seq_len_schedule: the stages, the current length and this rank's slice of it.
  std::vector<SeqLenStage> seq_len_stages_;
  int64_t seq_len_ = 0;
  int64_t batch_size_ = 0;
  int64_t seq_local_ = 0;
  int64_t placement_logged_at_ = 0;  // the length whose query placement was last logged
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Dataset> train_data_, val_data_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<MetricsWriter> metrics_;
  int64_t step_ = 0;                 // optimizer steps taken
  std::optional<double> last_loss_;  // of the last step, when finite (recorded in checkpoints)
  int skipped_in_a_row_ = 0;
  DivergenceGuard guard_;  // spikes, and the checkpoint to go back to
  RunProfile profile_;     // the phases of this run's steps
  VerdictContext verdict_context_;
  std::vector<TraceSpan> trace_;  // of the first log.trace_steps steps
  // Time of the steps since the model was last built for a curriculum stage (the ETA).
  double stage_seconds_ = 0.0;
  int64_t stage_steps_ = 0;
};

// Total of several communicators' counters.
CommStats sum_stats(const std::vector<const Comm*>& comms);

}  // namespace ulysses
