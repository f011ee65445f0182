// The non-finite guard (train.on_nonfinite; docs/failures.md): where a NaN or infinity in
// the gradient came from, and whether a training state is finite before it is saved.
#pragma once

#include <string>
#include <vector>

#include "core/optimizer.h"
#include "core/params.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/zero_state.h"

namespace ulysses {

// Collective over world: the name of the first tensor, in table order, whose reduced
// gradient holds a NaN or an infinity; "" when every element is finite. segments map this
// rank's gradient shard to flat elements (AdamW::segments()).
std::string first_nonfinite_gradient(ZeroState& state, const std::vector<ShardSegment>& segments,
                                     const ParamTable& table, Backend& backend, Comm& world);

// Collective: whether the master weights and both optimizer moments are finite on every
// rank.
bool training_state_is_finite(const ZeroState& state, const AdamW& optimizer, Backend& backend,
                              Comm& world);

}  // namespace ulysses
