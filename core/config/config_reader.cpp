#include "core/config/config_reader.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>

namespace ulysses {

namespace {

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

std::string describe_node(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing";
  return "'" + node.Scalar() + "'";
}

std::string last_component(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) previous[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// Every key and every section ("train", "train.checkpoint") in the order keys name them.
std::vector<std::string> keys_and_sections(const std::vector<std::string>& keys) {
  std::vector<std::string> known;
  for (const std::string& key : keys) {
    known.push_back(key);
    for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
      std::string section = key.substr(0, dot);
      if (std::find(known.begin(), known.end(), section) == known.end()) known.push_back(section);
    }
  }
  return known;
}

// The known key a misspelt or misplaced one most likely meant: the same name in another
// section first (train.vocab_size -> model.vocab_size), else the closest spelling.
std::string closest_key(const std::vector<std::string>& keys, const std::string& unknown) {
  std::vector<std::string> known = keys_and_sections(keys);
  for (const std::string& key : known) {
    if (key.find('.') != std::string::npos && last_component(key) == last_component(unknown)) {
      return key;
    }
  }
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& key : known) {
    size_t distance = edit_distance(unknown, key);
    if (distance < best_distance) {
      best = key;
      best_distance = distance;
    }
  }
  return best;
}

template <typename T>
bool parse_integer_of(std::string text, T& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end;
}

bool parse_double(std::string text, double& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end && std::isfinite(out);
}

// YAML 1.1 spellings, which users write in configs.
bool parse_bool(const std::string& text, bool& out) {
  static const std::vector<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
  static const std::vector<std::string> kFalse = {"false", "False", "FALSE", "no",
                                                  "No",    "off",   "Off"};
  if (std::find(kTrue.begin(), kTrue.end(), text) != kTrue.end()) {
    out = true;
    return true;
  }
  if (std::find(kFalse.begin(), kFalse.end(), text) != kFalse.end()) {
    out = false;
    return true;
  }
  return false;
}

// The first of Unicode's 66 noncharacters (U+FDD0 to U+FDEF, and the last two code points of
// every plane, U+xFFFE and U+xFFFF) in text's well-formed UTF-8, or 0. They take 3 or 4 bytes.
uint32_t first_noncharacter(const std::string& text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t length = bytes[i] >= 0xE0 && bytes[i] <= 0xEF   ? 3
                          : bytes[i] >= 0xF0 && bytes[i] <= 0xF4 ? 4
                                                                 : 0;
    if (length == 0 || text.size() - i < length) continue;
    uint32_t code = bytes[i] & (length == 3 ? 0x0F : 0x07);
    bool well_formed = true;
    for (size_t k = 1; k < length && well_formed; ++k) {
      well_formed = (bytes[i + k] & 0xC0) == 0x80;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    // An overlong form is not the code point it spells.
    if (!well_formed || code < (length == 3 ? 0x800u : 0x10000u) || code > 0x10FFFF) continue;
    if ((code >= 0xFDD0 && code <= 0xFDEF) || (code & 0xFFFE) == 0xFFFE) return code;
  }
  return 0;
}

// An integer too large (or small) for the key's type gets its range, not "expected an
// integer".
template <typename T>
std::string integer_problem(const YAML::Node& node, const std::string& expected) {
  if (node.IsScalar()) {
    std::string text = node.Scalar();
    if (!text.empty() && text[0] == '+') text.erase(0, 1);
    const bool negative = !text.empty() && text[0] == '-';
    const std::string digits = negative ? text.substr(1) : text;
    const bool integer =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos;
    if (integer && negative && std::numeric_limits<T>::min() == 0)
      return expected + ", got " + node.Scalar();
    if (integer)
      return node.Scalar() + " is out of range; the " + (negative ? "smallest" : "largest") +
             " allowed is " +
             std::to_string(negative ? std::numeric_limits<T>::min()
                                     : std::numeric_limits<T>::max());
    // plan and the sweep read 32k as 32 x 1024; a config holds the number itself, since
    // "10k steps" means 10000 as often as 10240.
    const size_t digit_count = digits.find_first_not_of("0123456789");
    if (!negative && digit_count > 0 && digit_count != std::string::npos &&
        digit_count + 1 == digits.size() && digit_count <= 9) {
      const char suffix = char(std::tolower(digits.back()));
      const int64_t count = std::stoll(digits.substr(0, digit_count));
      if (suffix == 'k' || suffix == 'm') {
        const int64_t decimal = suffix == 'k' ? 1000 : 1000 * 1000;
        const int64_t binary = suffix == 'k' ? 1024 : 1024 * 1024;
        return expected + ", got '" + node.Scalar() +
               "'; a config takes the number itself: " + std::to_string(count * binary) +
               " (as plan reads '" + node.Scalar() + "') or " + std::to_string(count * decimal);
      }
    }
  }
  return expected + ", got " + describe_node(node);
}

// Records where the last YAML document started. yaml-cpp 0.7's LoadAll never returns on
// some malformed text (a ',' where a document should start): its parser stops advancing and
// adds empty documents until memory runs out. The same parser run with this handler shows
// that as two documents starting at the same place.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    stuck = count > 0 && mark.pos == last.pos;
    last = mark;
    count++;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  YAML::Mark last;
  int64_t count = 0;
  bool stuck = false;
};

}  // namespace

ConfigReader::ConfigReader(std::string source_name, std::vector<std::string> keys)
    : source_(std::move(source_name)), keys_(std::move(keys)) {}

void ConfigReader::read_file_tree(const std::string& yaml_text) {
  std::vector<YAML::Node> documents;
  try {
    check_parser_advances(yaml_text);
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::DeepRecursion& error) {  // yaml-cpp says only "bad file"
    throw ConfigError(source_ + ":" + std::to_string(error.mark.line + 1) +
                      ": invalid YAML: nested too deeply (a config nests at most 3 levels)");
  } catch (const YAML::Exception& error) {
    throw ConfigError(source_ + ":" + std::to_string(error.mark.line + 1) +
                      ": invalid YAML: " + error.msg);
  }
  while (documents.size() > 1 && documents.back().IsNull()) documents.pop_back();
  if (documents.size() > 1) {
    throw ConfigError(line_of(documents[1]) + ": the file holds " +
                      std::to_string(documents.size()) +
                      " YAML documents (separated by '---'); a config is one document");
  }
  if (documents.empty()) return;
  const YAML::Node& root = documents[0];
  if (root.IsNull()) return;
  if (!root.IsMap()) {
    std::string sections;
    for (const std::string& key : keys_and_sections(keys_))
      if (key.find('.') == std::string::npos) sections += (sections.empty() ? "" : ", ") + key;
    throw ConfigError(line_of(root) + ": the config must be a map of sections (" + sections +
                      "), got " + describe_node(root));
  }
  collect(root, "");
}

void ConfigReader::apply_override(const std::string& override_text) {
  std::string where = "override '" + override_text + "'";
  size_t equals = override_text.find('=');
  std::string key = trim(override_text.substr(0, equals));
  if (equals == std::string::npos || key.empty())
    throw ConfigError(where + ": expected key=value, e.g. train.lr=1e-3");
  if (!is_key(key)) {
    if (is_section(key)) {
      throw ConfigError(where + ": '" + key + "' is a section; set one of its keys, e.g. " +
                        first_key_of(key) + "=...");
    }
    throw ConfigError(where + ": " + unknown_key_message(key));
  }
  YAML::Node value;
  try {
    value = YAML::Load(override_text.substr(equals + 1));
  } catch (const YAML::DeepRecursion&) {
    throw ConfigError(where + ": invalid YAML value: nested too deeply");
  } catch (const YAML::Exception& error) {
    throw ConfigError(where + ": invalid YAML value: " + error.msg);
  }
  given_[key] = GivenValue{value, where};
}

const YAML::Node* ConfigReader::given(const std::string& key) const {
  auto found = given_.find(key);
  return found == given_.end() ? nullptr : &found->second.value;
}

std::string ConfigReader::where(const std::string& key) const {
  auto found = given_.find(key);
  return found == given_.end() ? "" : found->second.where;
}

void ConfigReader::fail(const std::string& key, const std::string& problem) const {
  std::string location = where(key);
  if (location.empty()) location = source_;
  throw ConfigError(location + ": " + key + ": " + problem);
}

bool ConfigReader::is_key(const std::string& key) const {
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

// A section is any proper prefix of a key: "model", "train", "train.checkpoint".
bool ConfigReader::is_section(const std::string& key) const {
  return std::any_of(keys_.begin(), keys_.end(), [&](const std::string& known) {
    return known.size() > key.size() && known.compare(0, key.size(), key) == 0 &&
           known[key.size()] == '.';
  });
}

std::string ConfigReader::first_key_of(const std::string& section) const {
  for (const std::string& key : keys_) {
    if (key.compare(0, section.size() + 1, section + ".") == 0) return key;
  }
  return section;
}

std::string ConfigReader::unknown_key_message(const std::string& key) const {
  return "unknown key '" + key + "'; did you mean '" + closest_key(keys_, key) + "'?";
}

std::string ConfigReader::line_of(const YAML::Node& node) const {
  return source_ + ":" + std::to_string(node.Mark().line + 1);
}

// Throws ConfigError where YAML::LoadAll would loop forever (DocumentStarts).
void ConfigReader::check_parser_advances(const std::string& yaml_text) const {
  std::istringstream stream(yaml_text);
  YAML::Parser parser(stream);
  DocumentStarts starts;
  while (parser.HandleNextDocument(starts)) {
    if (!starts.stuck) continue;
    const size_t pos = size_t(std::max(starts.last.pos, 0));
    const std::string found =
        pos < yaml_text.size() ? "'" + yaml_text.substr(pos, 1) + "'" : "the end of the text";
    throw ConfigError(source_ + ":" + std::to_string(starts.last.line + 1) +
                      ": invalid YAML: unexpected " + found + " where a value should start");
  }
}

void ConfigReader::collect(const YAML::Node& map, const std::string& prefix) {
  for (const auto& entry : map) {
    // Copies: the iterator hands out a temporary pair of node handles.
    YAML::Node key_node = entry.first;
    YAML::Node value = entry.second;
    if (!key_node.IsScalar()) {
      throw ConfigError(line_of(key_node) + ": keys must be plain names, got " +
                        describe_node(key_node));
    }
    std::string key = prefix + key_node.Scalar();
    std::string location = line_of(key_node);
    if (is_key(key)) {
      if (given_.count(key)) {
        throw ConfigError(location + ": " + key + ": given twice (first at " + given_[key].where +
                          ")");
      }
      given_[key] = GivenValue{value, location};
    } else if (is_section(key)) {
      if (value.IsMap()) {
        collect(value, key + ".");
      } else if (!value.IsNull()) {
        throw ConfigError(location + ": " + key + ": expected a map of " + key + ".* keys (e.g. " +
                          first_key_of(key) + "), got " + describe_node(value));
      }
    } else {
      throw ConfigError(location + ": " + unknown_key_message(key));
    }
  }
}

std::string convert(const YAML::Node& node, int& out) {
  if (node.IsScalar() && parse_integer_of(node.Scalar(), out)) return "";
  return integer_problem<int>(node, "expected an integer");
}

std::string convert(const YAML::Node& node, uint64_t& out) {
  if (node.IsScalar() && parse_integer_of(node.Scalar(), out)) return "";
  return integer_problem<uint64_t>(node, "expected a non-negative integer");
}

std::string convert(const YAML::Node& node, double& out) {
  if (node.IsScalar() && parse_double(node.Scalar(), out)) return "";
  return "expected a number, got " + describe_node(node);
}

std::string convert(const YAML::Node& node, bool& out) {
  if (node.IsScalar() && parse_bool(node.Scalar(), out)) return "";
  return "expected true or false, got " + describe_node(node);
}

std::string convert(const YAML::Node& node, std::string& out) {
  if (node.IsNull()) {
    out.clear();
    return "";
  }
  if (node.IsScalar()) {
    out = node.Scalar();
    // The resolved config's printer writes Unicode's noncharacters as U+FFFD, so --dry-run's
    // output would read back as another config
    // (docs/configuration.md#validation-and-error-messages).
    if (const uint32_t code = first_noncharacter(out); code != 0) {
      char name[16];
      std::snprintf(name, sizeof name, "U+%04X", unsigned(code));
      return std::string("the string holds ") + name +
             ", a Unicode noncharacter, which YAML cannot print";
    }
    return "";
  }
  return "expected a string, got " + describe_node(node);
}

std::string convert_choice(const YAML::Node& node, const std::vector<std::string>& names,
                           int& index) {
  std::string text;
  std::string problem = convert(node, text);
  if (!problem.empty()) return problem;
  auto found = std::find(names.begin(), names.end(), text);
  if (found == names.end()) return "'" + text + "' is not allowed; use " + join_choices(names);
  index = int(found - names.begin());
  return "";
}

bool parse_integer(std::string text, int& out) {
  return parse_integer_of(std::move(text), out);
}

std::string format_double(double value) {
  char text[64];
  auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); i++) {
    if (i > 0) text += i + 1 == choices.size() ? " or " : ", ";
    text += choices[i];
  }
  return text;
}

// Pairs d and n / d up to sqrt(n): n may be as large as the int range (a config is checked
// before its size is), where counting up to n would take seconds and overflow.
std::vector<std::string> divisors_of(int n) {
  std::vector<std::string> divisors, above_root;
  for (int d = 1; d <= n / d; d++) {
    if (n % d != 0) continue;
    divisors.push_back(std::to_string(d));
    if (d != n / d) above_root.push_back(std::to_string(n / d));
  }
  divisors.insert(divisors.end(), above_root.rbegin(), above_root.rend());
  return divisors;
}

}  // namespace ulysses
