#include "core/checkpoint/optimizer_file.h"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/safetensors_placed.h"

namespace ulysses {

using nlohmann::json;

std::string optimizer_file_header(const std::vector<FlatRange>& ranges, int64_t total,
                                  const std::string& path) {
  json list = json::array();
  int64_t count = 0;
  for (const auto& [begin, end] : ranges) {
    list.push_back({begin, end});
    count += end - begin;
  }
  return placed_safetensors_header({{kFirstMomentTensor, {count}}, {kSecondMomentTensor, {count}}},
                                   {{"ranges", list.dump()}, {"total", std::to_string(total)}},
                                   path);
}

std::vector<FlatRange> optimizer_file_ranges(const SafetensorsReader& file, int64_t total) {
  const std::map<std::string, std::string>& metadata = file.metadata();
  std::vector<FlatRange> ranges;
  if (metadata.count("ranges")) {
    const json list = json::parse(metadata.at("ranges"), nullptr, false);
    if (!list.is_array())
      throw CheckpointError("'" + file.path() + "': metadata ranges is not a list");
    for (const json& range : list) {
      if (!range.is_array() || range.size() != 2 || !range[0].is_number_integer() ||
          !range[1].is_number_integer())
        throw CheckpointError("'" + file.path() +
                              "': a range is not [begin, end]: " + range.dump());
      ranges.emplace_back(range[0].get<int64_t>(), range[1].get<int64_t>());
    }
  } else if (metadata.count("begin") && metadata.count("end")) {
    auto integer = [&](const char* key) {
      const std::string& text = metadata.at(key);
      char* end = nullptr;
      errno = 0;
      const long long value = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE)
        throw CheckpointError("'" + file.path() + "': metadata " + key + " '" + text +
                              "' is not an integer");
      return int64_t(value);
    };
    ranges.emplace_back(integer("begin"), integer("end"));
  } else {
    throw CheckpointError("'" + file.path() +
                          "' has no \"ranges\" metadata: it is not an optimizer state file");
  }
  int64_t previous_end = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < previous_end || end > total || begin > end)
      throw CheckpointError("'" + file.path() + "' covers elements [" + std::to_string(begin) +
                            ", " + std::to_string(end) + ") of a model with " +
                            std::to_string(total) + " (ranges must be in order and inside)");
    previous_end = end;
  }
  return ranges;
}

}  // namespace ulysses
