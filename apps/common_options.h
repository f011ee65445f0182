// What every ulysses-train command shares on its command line (the job itself runs through
// core/jobs/run_on_world.h): --color, and the checks of number and path options.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ulysses {

// --color auto|always|never, for every command (docs/configuration.md#logs).
void add_color_option(CLI::App& app, std::string& color);

// A number option's check: NaN, infinities and values outside [low, high] are refused with the
// bounds as a user writes them (CLI11's own ranges let NaN through and print the largest double
// as 309 digits). An integer option's high is at most its type's largest value, so no value
// given overflows it; number_at_least has no upper bound (a double option).
CLI::Validator number_between(double low, double high);
CLI::Validator number_at_least(double low);
// A whole number that fits 64 bits unsigned, read exactly (a seed): CLI11's own conversion
// takes '-1' and values past 2^64 without a word.
CLI::Validator unsigned_64_bit();

// Paths said as data/input_file.h says them: a symbolic link loop or a FIFO is named as
// such, not "does not exist".
CLI::Validator existing_folder();
CLI::Validator existing_file_or_folder();

}  // namespace ulysses
