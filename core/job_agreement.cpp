#include "core/job_agreement.h"

#include <spdlog/spdlog.h>

#include <map>
#include <sstream>

#ifndef ULYSSES_VERSION
#define ULYSSES_VERSION "unknown"
#endif

namespace ulysses {

namespace {

// Rank lists in messages stay short on large jobs.
std::string rank_list(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i)
    text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) text += " and " + std::to_string(ranks.size() - kShown) + " more";
  return text;
}

std::string key_of(const std::string& line) {
  return line.substr(0, line.find('='));
}

std::string value_of(const std::string& line) {
  size_t equals = line.find('=');
  return equals == std::string::npos ? "" : line.substr(equals + 1);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

constexpr const char* kAbsent = "(not set: another build?)";

}  // namespace

const char* ulysses_version() {
  return ULYSSES_VERSION;
}

void agree_on_failure(Comm& world, const std::string& error, ExitCode code) {
  double verdict[2] = {error.empty() ? 0.0 : 1.0, world.rank() == 0 && !error.empty() ? 1.0 : 0.0};
  world.all_reduce_host(verdict, 2, ReduceOp::max);
  if (verdict[0] == 0.0) return;
  const bool rank0_failed = verdict[1] > 0.0;
  const bool print_here = !error.empty() && (world.rank() == 0 || !rank0_failed);
  throw JobError(code, error.empty() ? "another rank failed a check" : error, print_here);
}

void broadcast_string(Comm& world, std::string& text, int root) {
  double length = double(text.size());
  world.broadcast_host(&length, sizeof length, root);
  text.resize(size_t(length));
  if (!text.empty()) world.broadcast_host(text.data(), int64_t(text.size()), root);
}

std::vector<std::string> all_gather_strings(Comm& world, const std::string& mine) {
  std::vector<std::string> texts(size_t(world.size()));
  texts[size_t(world.rank())] = mine;
  for (int rank = 0; rank < world.size(); ++rank)
    broadcast_string(world, texts[size_t(rank)], rank);
  return texts;
}

std::vector<std::string> job_identity(const Config& config, const std::string& resume_argument) {
  std::vector<std::string> lines = config_key_values(config);
  lines.push_back("--resume=" + resume_argument);
  lines.push_back(std::string("version=") + ulysses_version());
  return lines;
}

void check_same_job(Comm& world, const std::vector<std::string>& identity) {
  std::string reference;
  for (const std::string& line : identity) reference += line + "\n";
  broadcast_string(world, reference, 0);

  // What this rank has that rank 0 does not: "key=value here" lines.
  std::map<std::string, std::string> rank0_values;
  std::vector<std::string> keys;  // in rank 0's order, then keys only this rank has
  for (const std::string& line : split_lines(reference)) {
    rank0_values[key_of(line)] = value_of(line);
    keys.push_back(key_of(line));
  }
  std::map<std::string, std::string> mine;
  for (const std::string& line : identity) {
    mine[key_of(line)] = value_of(line);
    if (!rank0_values.count(key_of(line))) keys.push_back(key_of(line));
  }
  std::string differences;
  for (const std::string& key : keys) {
    auto here = mine.find(key);
    auto there = rank0_values.find(key);
    const std::string value = here == mine.end() ? kAbsent : here->second;
    if (there == rank0_values.end() || there->second != value)
      differences += key + "=" + value + "\n";
  }
  double differs = differences.empty() ? 0.0 : 1.0;
  world.all_reduce_host(&differs, 1, ReduceOp::max);
  if (differs == 0.0) return;

  // Rare: gather every rank's differences so that one message tells the whole story.
  const std::vector<std::string> per_rank = all_gather_strings(world, differences);
  std::vector<std::string> ordered_keys;
  std::map<std::string, std::map<std::string, std::vector<int>>> values;  // key → value → ranks
  for (int rank = 0; rank < world.size(); ++rank) {
    for (const std::string& line : split_lines(per_rank[size_t(rank)])) {
      const std::string key = key_of(line);
      if (!values.count(key)) ordered_keys.push_back(key);
      values[key][value_of(line)].push_back(rank);
    }
  }
  std::string message =
      "the ranks of this job do not run the same job (each rank must be started with the same "
      "config, --set overrides, --resume and binary):";
  for (const std::string& key : ordered_keys) {
    auto rank0 = rank0_values.find(key);
    message += "\n  " + key + ": rank 0 has " +
               (rank0 == rank0_values.end() ? std::string(kAbsent) : "'" + rank0->second + "'");
    for (const auto& [value, ranks] : values[key])
      message += ", " + rank_list(ranks) + (ranks.size() == 1 ? " has '" : " have '") + value + "'";
  }
  throw JobError(ExitCode::bad_input, message, world.rank() == 0);
}

}  // namespace ulysses
