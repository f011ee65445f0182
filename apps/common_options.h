// What every ulysses-train command shares on its command line (the job itself runs through
// core/run_on_world.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ulysses {

// --color auto|always|never, for every command (docs/configuration.md#logs).
void add_color_option(CLI::App& app, std::string& color);

}  // namespace ulysses
