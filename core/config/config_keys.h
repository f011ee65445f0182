// The table of config keys (internal to core/config): each key's member of Config, its range,
// the docs' "allowed" and "meaning" columns and what its 0 resolves to. Reading (config.cpp),
// the range checks, --dry-run's YAML and the key tables of docs/configuration.md all come
// from this one table (docs/design.md, "One table of config keys").
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/config/config.h"
#include "core/config/config_reader.h"

namespace ulysses::config_keys {

// The numbers a key accepts: a lower and/or an upper bound, each inclusive or not, and 0
// besides where 0 means "off".
struct Range {
  bool has_low = false, has_high = false;
  double low = 0.0, high = 0.0;
  bool low_open = false, high_open = false;
  bool zero_allowed = false;
  // The value is used in fp32 arithmetic (the kernels, the optimizer): it must be a normal
  // fp32 number, and still in range once rounded to one (0.99999999 is 1.0f).
  bool fp32 = false;
};

// An enum key's member, as the index of its value among its YAML spellings (names_of, beside
// each enum in core/config/config.h and the headers it names).
struct EnumValue {
  std::function<int()> get;
  std::function<void(int)> set;
  const std::vector<std::string>& names;
};

// The accessor of an enum key, made from the table's accessor of any enum member: an enum
// key is its enum (with names_of) and its row, nothing else.
struct EnumRef {
  template <typename Accessor>
  requires std::is_enum_v<std::remove_reference_t<std::invoke_result_t<Accessor, Config&>>> EnumRef(
      Accessor accessor)
      : access([accessor](Config& config) {
          auto& member = accessor(config);
          using E = std::remove_reference_t<decltype(member)>;
          return EnumValue{[&member] { return int(member); }, [&member](int i) { member = E(i); },
                           names_of(E())};
        }) {}
  EnumValue operator()(Config& config) const { return access(config); }

  std::function<EnumValue(Config&)> access;
};

// The member a key fills, by type.
using FieldRef =
    std::variant<int& (*)(Config&), uint64_t& (*)(Config&), double& (*)(Config&),
                 bool& (*)(Config&), std::string& (*)(Config&), TiledMlp& (*)(Config&), EnumRef>;

// One config key, declared once: parsing, overrides, unknown-key suggestions, range and
// choice checks, config_to_yaml (--dry-run) and the key tables of docs/configuration.md
// all come from this table. The default is the member's initializer in core/config/config.h.
// Rules between keys are code (check_cross_keys), named in `allowed`.
struct Field {
  std::string key;  // full dotted key, e.g. "train.checkpoint.dir"
  FieldRef ref;
  std::optional<Range> range;  // checked by check_ranges
  std::string allowed;         // the docs' "allowed" beyond the type, choices and range
  std::string doc;             // the docs' "meaning"
  std::string resolved;        // what a default of 0 resolves to, e.g. "`n_heads`"
};

const std::vector<Field>& fields();

// The row of a dotted key, or nullptr.
const Field* find_field(const std::string& key);

std::vector<std::string> key_names();

// The value as YAML writes it (config_to_yaml, --dry-run, the docs' defaults).
template <typename T>
std::string scalar_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_same_v<T, TiledMlp>) {
    return tiled_mlp_text(value);
  } else if constexpr (std::is_same_v<T, EnumValue>) {
    return value.names[size_t(value.get())];
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(value);
  } else {
    return std::to_string(value);
  }
}

// The value in a message: strings and choices quoted.
template <typename T>
std::string format_value(const T& value) {
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, TiledMlp> ||
                std::is_same_v<T, EnumValue>) {
    return "'" + scalar_text(value) + "'";
  } else {
    return scalar_text(value);
  }
}

// The value of key in config as a message shows it ("4", "'cosine'").
std::string value_text(const Config& config, const std::string& key);
// "model.n_heads = 12 (config.yaml:5)", or "(default)" for a key not given: for messages
// that involve a second key.
std::string key_shown(const ConfigReader& reader, const Config& config, const std::string& key);

}  // namespace ulysses::config_keys
