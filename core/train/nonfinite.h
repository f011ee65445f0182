// The non-finite guard (train.on_nonfinite; docs/failures.md): where a NaN or infinity in
// the gradient came from. Whether a training state is finite before it is saved is the
// checkpoint's check (core/checkpoint/checkpoint.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/model/params.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/zero_state.h"

namespace ulysses {

// Collective over world: the name of the first tensor, in table order, whose reduced
// gradient holds a NaN or an infinity; "" when every element is finite. segments map this
// rank's gradient shard to flat elements (AdamW::segments()).
std::string first_nonfinite_gradient(ZeroState& state, const std::vector<ShardSegment>& segments,
                                     const ParamTable& table, Backend& backend, Comm& world);

}  // namespace ulysses
