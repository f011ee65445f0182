#include "apps/common_options.h"

namespace ulysses {

void add_color_option(CLI::App& app, std::string& color) {
  app.add_option("--color", color,
                 "colour the log: auto (only on a terminal, never under mpirun), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
}

}  // namespace ulysses
