// The text and tokens sources: documents packed into one token stream, cut into
// sequences of seq_len + 1 tokens (inputs and their shifted targets) that share their
// boundary token, visited in a seeded shuffled order per epoch or in order (data.order).
#pragma once

#include <cstdint>
#include <memory>

#include "data/data_config.h"
#include "data/dataset.h"

namespace ulysses {

std::unique_ptr<Dataset> make_packed_dataset(const DataConfig& data, Split split, int64_t seq_len,
                                             int vocab_size, uint64_t seed);

}  // namespace ulysses
