// The generic half of reading a config (docs/configuration.md): YAML text and key=value
// overrides checked against the keys a table names, each value kept with where it came from
// (file:line or the override), unknown keys answered with the closest known one, and values
// converted with messages that say what was expected. It knows no key:
// core/config/parse_config.cpp hands it the key table's names and fills the Config from what
// it read.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config/config_error.h"

namespace ulysses {

class ConfigReader {
 public:
  // keys: every full dotted key ("train.checkpoint.dir"); its sections follow from them.
  ConfigReader(std::string source_name, std::vector<std::string> keys);

  // The file's keys. Throws ConfigError naming the line of what is wrong: invalid YAML, more
  // than one document, a key given twice, an unknown key or a section given a value.
  void read_file_tree(const std::string& yaml_text);
  // "key=value", given after the file: replaces the file's value.
  void apply_override(const std::string& override_text);

  // The value given for key, or nullptr for a key left at its default.
  const YAML::Node* given(const std::string& key) const;
  // "config.yaml:12", an override, or "" for a key left at its default.
  std::string where(const std::string& key) const;
  // Keys given so far (the file's, before any override).
  size_t keys_given() const { return given_.size(); }

  // Throws ConfigError "where: key: problem" (the file's name for a default).
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;

 private:
  struct GivenValue {
    YAML::Node value;
    std::string where;  // "config.yaml:12" or "override 'train.lr=1e-3'"
  };

  bool is_key(const std::string& key) const;
  bool is_section(const std::string& key) const;
  std::string first_key_of(const std::string& section) const;
  std::string unknown_key_message(const std::string& key) const;
  std::string line_of(const YAML::Node& node) const;
  void check_parser_advances(const std::string& yaml_text) const;
  void collect(const YAML::Node& map, const std::string& prefix);

  std::string source_;
  std::vector<std::string> keys_;
  std::map<std::string, GivenValue> given_;
};

// Value conversion: each returns the problem with the node as a value of its type ("expected
// an integer, got a list"), or "" when the value was stored.
std::string convert(const YAML::Node& node, int& out);
std::string convert(const YAML::Node& node, uint64_t& out);
std::string convert(const YAML::Node& node, double& out);
std::string convert(const YAML::Node& node, bool& out);
std::string convert(const YAML::Node& node, std::string& out);
// One of `names` (an enum's YAML spellings, in its order): stores its index.
std::string convert_choice(const YAML::Node& node, const std::vector<std::string>& names,
                           int& index);

// True when the whole text (an optional leading '+' aside) is an integer that fits out.
bool parse_integer(std::string text, int& out);

// The shortest text that reads back as value ("0.001", "1e-06").
std::string format_double(double value);
// "a, b or c".
std::string join_choices(const std::vector<std::string>& choices);
// The divisors of n >= 1 as text, ascending ("1, 2, 3, 6" once joined), for messages.
std::vector<std::string> divisors_of(int n);

}  // namespace ulysses
