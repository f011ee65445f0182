// docs/configuration.md and the config's key table agree: every key the loader accepts has a
// row in the docs with its default, every documented key exists, and each documented default
// is the value an empty config resolves to before defaults that depend on other keys; and
// the key tables in the docs are exactly what the table generates (config_reference_markdown).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/config/config.h"

namespace ulysses {
namespace {

std::string docs_text() {
  std::ifstream docs(std::string(ULYSSES_SOURCE_DIR) + "/docs/configuration.md");
  std::stringstream text;
  text << docs.rdbuf();
  return text.str();
}

// key -> the first `...` of the default column, from rows "| `key` | `default` ... |".
std::map<std::string, std::string> documented_defaults() {
  std::ifstream docs(std::string(ULYSSES_SOURCE_DIR) + "/docs/configuration.md");
  std::map<std::string, std::string> defaults;
  std::string line;
  while (std::getline(docs, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t key_end = line.find('`', 3);
    const std::string key = line.substr(3, key_end - 3);
    const size_t column = line.find('|', key_end);
    const size_t open = line.find('`', column), close = line.find('`', open + 1);
    if (column == std::string::npos || open == std::string::npos || close == std::string::npos)
      continue;
    std::string value = line.substr(open + 1, close - open - 1);
    if (value == "\"\"") value.clear();
    defaults[key] = value;
  }
  return defaults;
}

bool same_value(const std::string& documented, const std::string& resolved) {
  if (documented == resolved) return true;
  char* documented_end = nullptr;
  char* resolved_end = nullptr;
  const double a = std::strtod(documented.c_str(), &documented_end);
  const double b = std::strtod(resolved.c_str(), &resolved_end);
  return !documented.empty() && !resolved.empty() && *documented_end == '\0' &&
         *resolved_end == '\0' && a == b;
}

TEST(ConfigDocs, EveryKeyIsDocumentedWithItsDefaultAndNoOther) {
  std::map<std::string, std::string> documented = documented_defaults();
  ASSERT_GT(documented.size(), 50u) << "the key tables of docs/configuration.md were not found";
  for (const std::string& key_value : config_key_values(Config())) {
    const size_t equals = key_value.find('=');
    const std::string key = key_value.substr(0, equals), value = key_value.substr(equals + 1);
    auto row = documented.find(key);
    if (row == documented.end()) {
      ADD_FAILURE() << key << " has no row in docs/configuration.md";
      continue;
    }
    EXPECT_TRUE(same_value(row->second, value))
        << key << ": docs/configuration.md says the default is '" << row->second
        << "', the config table resolves '" << value << "'";
    documented.erase(row);
  }
  for (const auto& [key, value] : documented)
    ADD_FAILURE() << "docs/configuration.md documents " << key
                  << ", which the config does not have";
}

TEST(ConfigDocs, KeyTablesAreTheOnesTheKeyTableGenerates) {
  const std::string docs = docs_text();
  const size_t begin = docs.find("### Top level");
  const size_t end = docs.find("<a id=\"logs\"></a>");
  ASSERT_NE(begin, std::string::npos) << "docs/configuration.md has no '### Top level'";
  ASSERT_NE(end, std::string::npos) << "docs/configuration.md has no <a id=\"logs\"></a>";
  ASSERT_LT(begin, end);
  EXPECT_EQ(docs.substr(begin, end - begin), config_reference_markdown() + "\n")
      << "the key tables of docs/configuration.md differ from the config's key table "
         "(core/config/config_keys.cpp); replace them with the output of `ulysses-train "
         "config-reference`";
}

}  // namespace
}  // namespace ulysses
