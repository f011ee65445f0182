// libFuzzer target: the YAML config loader (core/config/config.h). The input is
//   [override NUL]... yaml
// every NUL-terminated piece before the last NUL is an "a.b=value" override (at most 8), the
// rest is the YAML text, so the override parser is fuzzed together with the file parser.
// Only ConfigError is an expected outcome. An accepted config also goes through
// validate_for_world, and must print with config_to_yaml and read back to the same values.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr size_t kMaxOverrides = 8;

// Strict UTF-8: no overlong forms, surrogates or code points above U+10FFFF.
bool valid_utf8(const std::string& text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  for (size_t i = 0; i < size;) {
    const unsigned char lead = bytes[i];
    size_t length = 0;
    uint32_t code = 0;
    if (lead < 0x80) {
      i++;
      continue;
    } else if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2, code = lead & 0x1f;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3, code = lead & 0x0f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4, code = lead & 0x07;
    } else {
      return false;
    }
    if (size - i < length) return false;
    for (size_t k = 1; k < length; k++) {
      if ((bytes[i + k] & 0xc0) != 0x80) return false;
      code = (code << 6) | (bytes[i + k] & 0x3f);
    }
    if ((length == 3 && code < 0x800) || (length == 4 && (code < 0x10000 || code > 0x10ffff)) ||
        (code >= 0xd800 && code <= 0xdfff))
      return false;
    i += length;
  }
  return true;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ulysses;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  size_t start = 0;
  while (overrides.size() < kMaxOverrides) {
    const size_t nul = input.find('\0', start);
    if (nul == std::string::npos) break;
    overrides.push_back(input.substr(start, nul - start));
    start = nul + 1;
  }
  const std::string yaml_text = input.substr(start);

  Config config;
  try {
    config = parse_config(yaml_text, overrides, "fuzz.yaml");
  } catch (const ConfigError&) {
    return 0;
  }

  for (int world_size : {1, 2, 3, 4, 6, 8, 64}) {
    try {
      validate_for_world(config, world_size);
    } catch (const ConfigError&) {
    }
  }

  // The resolved config (what --dry-run prints) reads back to itself. Not for strings that
  // are not UTF-8: YAML text is Unicode, and yaml-cpp's emitter prints each invalid byte as
  // U+FFFD.
  const std::string printed = config_to_yaml(config);
  const std::vector<std::string> values = config_key_values(config);
  if (!valid_utf8(joined(values))) return 0;
  Config reread;
  try {
    reread = parse_config(printed, {}, "resolved.yaml");
  } catch (const ConfigError& error) {
    fuzz::invariant_failed("parse_config refuses the output of config_to_yaml",
                           printed + "error: " + error.what());
  }
  if (config_key_values(reread) != values) {
    fuzz::invariant_failed(
        "config_to_yaml does not read back to the same config",
        "before:\n" + joined(values) + "after:\n" + joined(config_key_values(reread)));
  }
  return 0;
}
