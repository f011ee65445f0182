// What a resumed run reads or does differently from the run that wrote its checkpoint
// (docs/checkpoints.md#resuming). The data position follows the step, so another global batch,
// other data keys or other files make the resumed run read other tokens than the original
// run would have; the learning rate follows the step through this run's schedule, so another
// train.steps (a run extended) or lr gives other rates. Training longer or on more data is
// often what was meant: these are warnings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/config/config.h"
#include "data/dataset.h"

namespace ulysses {

// The warnings, one per kind ("" kinds left out): the global batch (sequences per step, with
// dp_size data-parallel ranks), the data (data_order_keys and the training split's size;
// train_data is the split at seq_len, the length the resumed run starts with) and the
// learning-rate schedule (lr_schedule_keys: the rate at the next step under both schedules).
std::vector<std::string> resume_warnings(const Config& config, const TrainerState& state,
                                         int dp_size, int64_t seq_len, const Dataset& train_data);

}  // namespace ulysses
