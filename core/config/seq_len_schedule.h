// train.seq_len_schedule: a sequence-length curriculum (docs/configuration.md#curriculum).
// Training starts at a short length and moves to longer ones at given steps, ending at
// train.seq_len, as DeepSpeed's curriculum learning does. A stage may also set its batch
// (sequences per rank per micro-step), so that a long stage does not cost its length times
// more per step. Length and batch are functions of the step alone, so resume is exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses {

struct SeqLenStage {
  int64_t seq_len = 0;
  int64_t first_step = 0;  // 0-based: the stage's first optimizer step
  int64_t batch_size = 0;  // 0: train.batch_size
};

// "256@0, 1024@300, 4096x4@500": a length, optionally "x" a batch size, and the step the
// stage starts at, in order. An empty text is no curriculum. Throws std::invalid_argument naming
// the entry that does not parse; the rules between stages are checked by check_seq_len_schedule.
std::vector<SeqLenStage> parse_seq_len_schedule(const std::string& text);

// Returns the first problem with the stages, or "": lengths are >= 2 and batches at most the
// largest int (as train.seq_len and train.batch_size), the first starts at step 0, steps and
// lengths increase, the last length is seq_len, every step is below steps.
std::string seq_len_schedule_problem(const std::vector<SeqLenStage>& stages, int64_t seq_len,
                                     int64_t steps);

// The stage of 0-based step `step`, its batch resolved: {seq_len, 0, batch_size} without a
// curriculum.
SeqLenStage stage_at(const std::vector<SeqLenStage>& stages, int64_t seq_len, int64_t batch_size,
                     int64_t step);

// Seconds the steps [from, steps) should take, when a step of stage `now` takes now_seconds:
// each step costs that scaled by its stage's tokens (seq_len · batch) over now's, so the ETA
// of a curriculum counts the longer stages still to come (attention's share grows faster
// than the tokens, so this stays a lower bound there).
double remaining_seconds(const std::vector<SeqLenStage>& stages, int64_t seq_len,
                         int64_t batch_size, int64_t from, int64_t steps, const SeqLenStage& now,
                         double now_seconds);

}  // namespace ulysses
