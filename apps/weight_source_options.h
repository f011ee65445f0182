// --checkpoint and --init-from, shared by `ulysses-train eval` and `sample`: where the
// weights come from (core/checkpoint/weights_source.h). Exactly one must be given.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/checkpoint/weights_source.h"

namespace ulysses {

void add_weight_source_options(CLI::App& app, WeightSource& source);

// After parsing: why the weights are not given exactly once, or "" when they are.
std::string weight_source_problem(const WeightSource& source);

}  // namespace ulysses
