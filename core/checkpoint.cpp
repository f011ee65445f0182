#include "core/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/file_util.h"
#include "core/safetensors.h"

namespace ulysses {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kModelFile = "model.safetensors";
const char* kStateFile = "trainer_state.json";
const char* kManifestFile = "manifest.json";
const char* kLatestFile = "latest";

std::string optimizer_file_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", shard, shards);
  return name;
}

// Step folders under dir, newest first.
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> folders;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end && *end == '\0') folders.emplace_back(step, entry.path().string());
  }
  std::sort(folders.rbegin(), folders.rend());
  return folders;
}

json read_json(const std::string& path) {
  std::string text = read_whole_file(path);
  json value = json::parse(text, nullptr, false);
  if (value.is_discarded())
    throw CheckpointError("checkpoint file '" + path + "' is not valid JSON");
  return value;
}

json model_shape_json(const ModelConfig& m) {
  return {{"family", m.family},         {"n_layers", m.n_layers},      {"d_model", m.d_model},
          {"n_heads", m.n_heads},       {"n_kv_heads", m.n_kv_heads},  {"d_ff", m.d_ff},
          {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len}};
}

// The shape keys plus what export needs to describe the model; only the shape keys must
// match on resume (a longer-context fine-tune may change rope_theta).
json recorded_model_json(const ModelConfig& m) {
  json recorded = model_shape_json(m);
  recorded["rope_theta"] = m.rope_theta;
  recorded["norm_eps"] = m.norm_eps;
  return recorded;
}

// The flat ranges an optimizer file holds, in the order its tensors pack them: metadata
// "ranges" ([[begin, end], ...]), or "begin"/"end" (one range, files before ZeRO units).
std::vector<std::pair<int64_t, int64_t>> optimizer_file_ranges(const SafetensorsReader& file,
                                                               int64_t total) {
  const std::map<std::string, std::string>& metadata = file.metadata();
  std::vector<std::pair<int64_t, int64_t>> ranges;
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
  } else {
    ranges.emplace_back(std::stoll(metadata.at("begin")), std::stoll(metadata.at("end")));
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

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)step);
  return name;
}

void verify_checkpoint(const std::string& folder) {
  const std::string manifest_path = folder + "/" + kManifestFile;
  if (!fs::exists(manifest_path))
    throw CheckpointError("checkpoint '" + folder + "' has no " + kManifestFile +
                          " (incomplete or not a checkpoint)");
  json manifest;
  try {
    manifest = read_json(manifest_path);
  } catch (const std::exception& error) {
    throw CheckpointError(error.what());
  }
  if (!manifest.is_object() || manifest.value("format", "") != "ulysses-checkpoint")
    throw CheckpointError("'" + manifest_path + "' is not a ulysses checkpoint manifest");
  int version = manifest.value("format_version", -1);
  if (version != kCheckpointFormatVersion)
    throw CheckpointError("'" + manifest_path + "' has format_version " + std::to_string(version) +
                          "; this build reads version " + std::to_string(kCheckpointFormatVersion));
  if (!manifest.contains("files") || !manifest["files"].is_object())
    throw CheckpointError("'" + manifest_path + "' lists no files");
  for (const auto& [name, info] : manifest["files"].items()) {
    const std::string path = folder + "/" + name;
    std::error_code error;
    if (!fs::exists(path, error))
      throw CheckpointError("checkpoint file '" + path + "' is missing");
    uint64_t expected_bytes = info.value("bytes", uint64_t(0));
    uint64_t actual_bytes = fs::file_size(path, error);
    if (error || actual_bytes != expected_bytes)
      throw CheckpointError("checkpoint file '" + path + "' has " + std::to_string(actual_bytes) +
                            " bytes, the manifest says " + std::to_string(expected_bytes) +
                            " (truncated or overwritten)");
    uint32_t expected_crc = info.value("crc32", uint32_t(0));
    if (crc32_of_file(path) != expected_crc)
      throw CheckpointError("checkpoint file '" + path + "' fails its CRC-32 checksum (corrupted)");
  }
}

std::string find_latest_checkpoint(const std::string& dir) {
  std::error_code error;
  if (dir.empty() || !fs::is_directory(dir, error)) return "";
  const std::string latest_path = dir + "/" + kLatestFile;
  if (fs::exists(latest_path, error)) {
    std::string name = read_whole_file(latest_path);
    name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
    try {
      verify_checkpoint(dir + "/" + name);
      return dir + "/" + name;
    } catch (const CheckpointError& problem) {
      spdlog::warn("latest checkpoint unusable ({}); looking for an older one", problem.what());
    }
  }
  for (const auto& [step, folder] : step_folders(dir)) {
    try {
      verify_checkpoint(folder);
      return folder;
    } catch (const CheckpointError& problem) {
      spdlog::warn("skipping checkpoint: {}", problem.what());
    }
  }
  return "";
}

std::string resolve_resume_path(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume == "auto") return find_latest_checkpoint(checkpoint_dir);
  std::error_code error;
  if (fs::exists(resume + "/" + kManifestFile, error)) return resume;
  if (fs::is_directory(resume, error)) {
    std::string found = find_latest_checkpoint(resume);
    if (!found.empty()) return found;
  }
  throw CheckpointError("--resume " + resume + ": no intact checkpoint there");
}

Checkpointer::Checkpointer(const Config& config, Backend& backend, Comm& world)
    : config_(config), backend_(backend), world_(world) {}

std::string Checkpointer::save(int64_t step, Model& model, const AdamW& optimizer) {
  const std::string dir = config_.train.checkpoint.dir;
  const std::string name = checkpoint_folder_name(step);
  const std::string final_path = dir + "/" + name;
  const std::string temp_path = dir + "/.tmp-" + name;
  const ParamTable& table = model.table();
  const int64_t total = table.total_numel();
  if (world_.rank() == 0) {
    fs::create_directories(dir);
    fs::remove_all(temp_path);
    fs::create_directory(temp_path);
  }
  world_.barrier();

  // Optimizer state as flat ranges of the parameter buffer, one file per shard (ZeRO: one
  // per rank; otherwise rank 0 writes the whole range), so that a run with another world
  // size or stage can take any range from any file.
  const bool sharded = model.state().layout().world() > 1;
  const int shards = sharded ? world_.size() : 1;
  if (sharded || world_.rank() == 0) {
    const int64_t shard_numel = optimizer.first_moment().numel();
    std::vector<float> first(static_cast<size_t>(shard_numel)), second(first.size());
    backend_.download(first.data(), optimizer.first_moment());
    backend_.download(second.data(), optimizer.second_moment());
    std::vector<float> packed_first, packed_second;
    json ranges = json::array();
    for (const ShardSegment& segment : optimizer.segments()) {
      ranges.push_back({segment.begin, segment.end});
      auto from = [&](const std::vector<float>& shard) {
        return shard.begin() + segment.shard_begin;
      };
      packed_first.insert(packed_first.end(), from(first), from(first) + segment.size());
      packed_second.insert(packed_second.end(), from(second), from(second) + segment.size());
    }
    const int64_t count = int64_t(packed_first.size());
    SafetensorsWriter moments;
    moments.add("exp_avg", {count}, packed_first.data());
    moments.add("exp_avg_sq", {count}, packed_second.data());
    moments.set_metadata("ranges", ranges.dump());
    moments.set_metadata("total", std::to_string(total));
    moments.write(temp_path + "/" + optimizer_file_name(sharded ? world_.rank() : 0, shards));
  }
  // Every rank takes part in gathering the weights; rank 0 writes them.
  std::vector<float> host(world_.rank() == 0 ? static_cast<size_t>(total) : 0);
  model.download_weights(world_.rank() == 0 ? host.data() : nullptr);
  world_.barrier();

  if (world_.rank() == 0) {
    SafetensorsWriter weights;
    for (const ParamSpec& spec : table.specs())
      weights.add(spec.name, spec.shape, host.data() + spec.offset);
    weights.set_metadata("format", "ulysses");
    weights.set_metadata("step", std::to_string(step));
    weights.set_metadata("family", config_.model.family);
    weights.write(temp_path + "/" + kModelFile);

    std::vector<std::string> optimizer_names;
    for (int i = 0; i < shards; ++i) optimizer_names.push_back(optimizer_file_name(i, shards));
    json state = {
        {"format_version", kCheckpointFormatVersion},
        {"step", step},
        {"sequences_consumed", step * int64_t(config_.train.grad_accum) * config_.train.batch_size *
                                   (world_.size() / config_.parallel.sp)},
        {"rng",
         {{"seed", config_.train.seed},
          {"note", "all randomness derives from (seed, step, sequence index)"}}},
        {"world_size", world_.size()},
        {"sp", config_.parallel.sp},
        {"zero_stage", model.state().stage()},
        {"model", recorded_model_json(config_.model)},
        {"optimizer_shards", optimizer_names}};
    write_file_durably(temp_path + "/" + kStateFile, state.dump(2) + "\n");

    std::vector<std::string> written = optimizer_names;
    written.push_back(kModelFile);
    written.push_back(kStateFile);
    json files = json::object();
    for (const std::string& file : written) {
      const std::string path = temp_path + "/" + file;
      files[file] = {{"bytes", uint64_t(fs::file_size(path))}, {"crc32", crc32_of_file(path)}};
    }
    json manifest = {{"format", "ulysses-checkpoint"},
                     {"format_version", kCheckpointFormatVersion},
                     {"step", step},
                     {"files", files}};
    write_file_durably(temp_path + "/" + kManifestFile, manifest.dump(2) + "\n");
    fsync_directory(temp_path);

    // A folder of the same step (a rerun) is moved aside, never half-replaced.
    const std::string old_path = dir + "/.old-" + name;
    fs::remove_all(old_path);
    if (fs::exists(final_path)) rename_or_throw(final_path, old_path);
    rename_or_throw(temp_path, final_path);
    fsync_directory(dir);
    write_file_durably(dir + "/" + kLatestFile + ".tmp", name + "\n");
    rename_or_throw(dir + "/" + kLatestFile + ".tmp", dir + "/" + kLatestFile);
    fsync_directory(dir);
    fs::remove_all(old_path);

    const int keep = config_.train.checkpoint.keep_last;
    if (keep > 0) {
      auto folders = step_folders(dir);
      for (size_t i = size_t(keep); i < folders.size(); ++i)
        if (folders[i].second != final_path) fs::remove_all(folders[i].second);
    }
  }
  world_.barrier();
  return final_path;
}

int64_t Checkpointer::load(const std::string& folder, Model& model, AdamW& optimizer) {
  verify_checkpoint(folder);
  const json state = read_json(folder + "/" + kStateFile);
  if (state.value("format_version", -1) != kCheckpointFormatVersion)
    throw CheckpointError("'" + folder + "/" + kStateFile + "' has an unknown format_version");
  const json expected = model_shape_json(config_.model);
  for (const auto& [key, value] : expected.items()) {
    if (!state["model"].contains(key) || state["model"][key] != value)
      throw CheckpointError("checkpoint '" + folder + "' was written for model." + key + "=" +
                            (state["model"].contains(key) ? state["model"][key].dump() : "?") +
                            ", this run has model." + key + "=" + value.dump());
  }

  const ParamTable& table = model.table();
  const int64_t total = table.total_numel();
  std::vector<float> host(static_cast<size_t>(total));
  try {
    SafetensorsReader weights(folder + "/" + kModelFile);
    for (const ParamSpec& spec : table.specs())
      weights.read_f32(spec.name, spec.shape, host.data() + spec.offset);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& error) {
    throw CheckpointError(error.what());
  }
  model.load_weights(host.data());

  // This rank's moments: the parts of every file's ranges that overlap its own segments.
  const std::vector<ShardSegment>& mine = optimizer.segments();
  std::vector<float> first(static_cast<size_t>(optimizer.first_moment().numel()));
  std::vector<float> second(first.size());
  int64_t needed = 0, covered = 0;
  for (const ShardSegment& segment : mine) needed += segment.size();
  for (const auto& shard_name : state.at("optimizer_shards")) {
    const std::string path = folder + "/" + shard_name.get<std::string>();
    try {
      SafetensorsReader shard(path);
      const std::vector<std::pair<int64_t, int64_t>> ranges = optimizer_file_ranges(shard, total);
      int64_t count = 0;
      for (const auto& [begin, end] : ranges) count += end - begin;
      std::vector<float> file_first(static_cast<size_t>(count)), file_second(file_first.size());
      shard.read_f32("exp_avg", {count}, file_first.data());
      shard.read_f32("exp_avg_sq", {count}, file_second.data());
      int64_t packed = 0;  // where the current range starts in the file's tensors
      for (const auto& [begin, end] : ranges) {
        for (const ShardSegment& segment : mine) {
          const int64_t overlap_begin = std::max(begin, segment.begin);
          const int64_t overlap_end = std::min(end, segment.end);
          if (overlap_begin >= overlap_end) continue;
          const int64_t from = packed + (overlap_begin - begin);
          const int64_t to = segment.shard_begin + (overlap_begin - segment.begin);
          std::copy_n(file_first.begin() + from, overlap_end - overlap_begin, first.begin() + to);
          std::copy_n(file_second.begin() + from, overlap_end - overlap_begin, second.begin() + to);
          covered += overlap_end - overlap_begin;
        }
        packed += end - begin;
      }
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& error) {
      throw CheckpointError("optimizer state '" + path + "': " + error.what());
    }
  }
  if (covered != needed)
    throw CheckpointError("the optimizer files of '" + folder + "' cover " +
                          std::to_string(covered) + " of the " + std::to_string(needed) +
                          " elements this rank needs");
  backend_.upload(optimizer.first_moment(), first.data());
  backend_.upload(optimizer.second_moment(), second.data());
  return state.at("step").get<int64_t>();
}

}  // namespace ulysses
