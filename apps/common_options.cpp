#include "apps/common_options.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "data/input_file.h"

namespace ulysses {

namespace {

std::string shortest(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

CLI::Validator number_check(double low, double high, const std::string& rule) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(value) || value < low || value > high)
          return "must be " + rule + ", got '" + text + "'";
        return "";
      },
      rule);
}

}  // namespace

void add_color_option(CLI::App& app, std::string& color) {
  app.add_option("--color", color,
                 "colour the log: auto (only on a terminal, never under mpirun), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
}

CLI::Validator number_between(double low, double high) {
  return number_check(low, high, "between " + shortest(low) + " and " + shortest(high));
}

CLI::Validator number_at_least(double low) {
  return number_check(low, HUGE_VAL, "a number >= " + shortest(low));
}

CLI::Validator unsigned_64_bit() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || error != std::errc() || end != text.data() + text.size())
          return "must be an integer between 0 and 18446744073709551615, got '" + text + "'";
        return "";
      },
      "UINT64");
}

CLI::Validator existing_folder() {
  return CLI::Validator([](std::string& path) { return input_folder_problem(path); }, "FOLDER");
}

CLI::Validator existing_file_or_folder() {
  return CLI::Validator(
      [](std::string& path) {
        return input_folder_problem(path).empty() ? std::string() : input_file_problem(path);
      },
      "PATH");
}

}  // namespace ulysses
