// --checkpoint and --init-from, shared by `ulysses-train eval` and `sample`: where the
// weights come from (core/checkpoint/weights_source.h). At most one; without either, the
// newest checkpoint of the config's train.checkpoint.dir.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/checkpoint/weights_source.h"

namespace ulysses {

void add_weight_source_options(CLI::App& app, WeightSource& source);

}  // namespace ulysses
