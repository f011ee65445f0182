#include "core/checkpoint/checkpoint_format.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/checkpoint/file_util.h"
#include "data/input_file.h"

namespace ulysses {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw CheckpointError("checkpoint file '" + path + "': " + problem);
}

// Printing or copying a JSON value recurses once per level, so deeper text is refused while
// it is parsed (which does not recurse); these files nest 3 levels.
constexpr int kMaxJsonDepth = 64;

json parse_object(const std::string& text, const std::string& path) {
  auto limit_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      fail(path, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  json value = json::parse(text, limit_depth, false);
  if (value.is_discarded()) fail(path, "not valid JSON");
  if (!value.is_object()) fail(path, "not a JSON object");
  return value;
}

const json& field(const json& object, const std::string& key, const std::string& path) {
  auto found = object.find(key);
  if (found == object.end()) fail(path, "has no \"" + key + "\"");
  return *found;
}

int64_t integer_field(const json& object, const std::string& key, const std::string& path,
                      int64_t minimum, int64_t maximum = std::numeric_limits<int64_t>::max()) {
  const json& value = field(object, key, path);
  if (!value.is_number_integer())
    fail(path, "\"" + key + "\" is " + value.dump() + ", not an integer");
  // Unsigned JSON integers above INT64_MAX read as negative through get<int64_t>.
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(maximum))
    fail(path, "\"" + key + "\" is " + value.dump() + ", above " + std::to_string(maximum));
  const int64_t number = value.get<int64_t>();
  if (number < minimum || number > maximum)
    fail(path, "\"" + key + "\" is " + std::to_string(number) + ", outside [" +
                   std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
  return number;
}

// A positive number under key, or nullopt when the key is absent or null.
std::optional<double> positive_number(const json& object, const std::string& key,
                                      const std::string& path) {
  auto found = object.find(key);
  if (found == object.end() || found->is_null()) return std::nullopt;
  if (!found->is_number() || !(found->get<double>() > 0.0) || !std::isfinite(found->get<double>()))
    fail(path, "\"" + key + "\" is " + found->dump() + ", not a positive number");
  return found->get<double>();
}

// A file name inside the step folder: never a path that leads out of it.
std::string plain_file_name(const json& value, const std::string& what, const std::string& path) {
  if (!value.is_string()) fail(path, what + " " + value.dump() + " is not a file name");
  const std::string name = value.get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    fail(path, what + " '" + name + "' is not a plain file name of the step folder");
  return name;
}

// An object of strings, as where names the field in messages.
std::map<std::string, std::string> string_map(const json& object, const std::string& where,
                                              const std::string& path) {
  if (!object.is_object()) fail(path, where + " is " + object.dump() + ", not an object");
  std::map<std::string, std::string> strings;
  for (const auto& [key, value] : object.items()) {
    if (!value.is_string())
      fail(path, where + ".\"" + key + "\" is " + value.dump() + ", not a string");
    strings[key] = value.get<std::string>();
  }
  return strings;
}

json model_json(const CheckpointModel& recorded) {
  const ModelConfig& m = recorded.model;
  json object = {{"family", name_of(m.family)}, {"n_layers", m.n_layers},
                 {"d_model", m.d_model},        {"n_heads", m.n_heads},
                 {"n_kv_heads", m.n_kv_heads},  {"d_ff", m.d_ff},
                 {"vocab_size", m.vocab_size},  {"max_seq_len", m.max_seq_len}};
  if (recorded.rope_theta) object["rope_theta"] = *recorded.rope_theta;
  if (recorded.norm_eps) object["norm_eps"] = *recorded.norm_eps;
  return object;
}

CheckpointModel parse_model(const json& object, const std::string& path) {
  if (!object.is_object()) fail(path, "\"model\" is " + object.dump() + ", not an object");
  CheckpointModel recorded;
  ModelConfig& m = recorded.model;
  const json& family = field(object, "family", path);
  auto known = std::find(kFamilyNames.begin(), kFamilyNames.end(), family);
  if (known == kFamilyNames.end())
    fail(path, "model.family is " + family.dump() + ", not \"llama\" or \"gpt2\"");
  m.family = Family(known - kFamilyNames.begin());
  auto size = [&](const char* key) {
    const json& value = field(object, key, path);
    if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
        value.get<int64_t>() > std::numeric_limits<int>::max() ||
        (value.is_number_unsigned() &&
         value.get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())))
      fail(path, std::string("model.") + key + " is " + value.dump() + ", not a usable size");
    return value.get<int>();
  };
  m.n_layers = size("n_layers");
  m.d_model = size("d_model");
  m.n_heads = size("n_heads");
  m.n_kv_heads = size("n_kv_heads");
  m.d_ff = size("d_ff");
  m.vocab_size = size("vocab_size");
  m.max_seq_len = size("max_seq_len");
  // The shape must be one this build could have written: export and init_from build a
  // parameter table from it.
  if (m.d_model % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0)
    fail(path, "model.d_model " + std::to_string(m.d_model) + ", n_heads " +
                   std::to_string(m.n_heads) + " and n_kv_heads " + std::to_string(m.n_kv_heads) +
                   " do not divide evenly");
  if (m.n_layers > kMaxLayers || approximate_parameter_count(m) > kMaxParameters)
    fail(path, "the model it records (n_layers " + std::to_string(m.n_layers) + ", d_model " +
                   std::to_string(m.d_model) + ", d_ff " + std::to_string(m.d_ff) +
                   ", vocab_size " + std::to_string(m.vocab_size) +
                   ") is larger than ulysses supports (2^40 parameters, 100000 layers)");
  recorded.rope_theta = positive_number(object, "rope_theta", path);
  recorded.norm_eps = positive_number(object, "norm_eps", path);
  if (recorded.rope_theta) m.rope_theta = *recorded.rope_theta;
  if (recorded.norm_eps) m.norm_eps = *recorded.norm_eps;
  return recorded;
}

json guard_json(const GuardRecord& guard) {
  return {{"good_step", guard.good_step ? json(*guard.good_step) : json()},
          {"loss_mean", guard.loss_mean},
          {"normal_steps", guard.normal_steps}};
}

GuardRecord parse_guard(const json& object, const std::string& path) {
  if (!object.is_object()) fail(path, "\"guard\" is " + object.dump() + ", not an object");
  GuardRecord guard;
  if (object.contains("good_step") && !object["good_step"].is_null())
    guard.good_step = integer_field(object, "good_step", path, 0);
  guard.normal_steps = integer_field(object, "normal_steps", path, 0);
  const json& mean = field(object, "loss_mean", path);
  if (!mean.is_number() || !std::isfinite(mean.get<double>()) || mean.get<double>() < 0.0)
    fail(path, "guard.loss_mean is " + mean.dump() + ", not a finite number >= 0");
  guard.loss_mean = mean.get<double>();
  return guard;
}

void check_format_version(const json& object, const std::string& path) {
  const int64_t version =
      integer_field(object, "format_version", path, std::numeric_limits<int64_t>::min());
  if (version != kCheckpointFormatVersion)
    fail(path, "format_version " + std::to_string(version) + "; this build reads version " +
                   std::to_string(kCheckpointFormatVersion));
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)step);
  return name;
}

std::string optimizer_file_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", shard, shards);
  return name;
}

std::vector<std::pair<int64_t, std::string>> checkpoint_step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> folders;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory(error) || name.rfind("step_", 0) != 0 || name.size() == 5) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end && *end == '\0') folders.emplace_back(step, entry.path().string());
  }
  std::sort(folders.rbegin(), folders.rend());
  return folders;
}

CheckpointManifest parse_manifest(const std::string& text, const std::string& path) {
  const json object = parse_object(text, path);
  if (object.value("format", json()) != "ulysses-checkpoint")
    fail(path, "not a ulysses checkpoint manifest (\"format\" is not \"ulysses-checkpoint\")");
  check_format_version(object, path);
  CheckpointManifest manifest;
  manifest.step = integer_field(object, "step", path, 0);
  const json& files = field(object, "files", path);
  if (!files.is_object() || files.empty()) fail(path, "lists no files");
  for (const auto& [name, info] : files.items()) {
    ManifestEntry entry;
    entry.name = plain_file_name(json(name), "file", path);
    if (!info.is_object()) fail(path, "the entry of '" + name + "' is not an object");
    entry.bytes = uint64_t(integer_field(info, "bytes", path, 0));
    entry.crc32 = uint32_t(integer_field(info, "crc32", path, 0, 0xffffffffLL));
    manifest.files.push_back(entry);
  }
  return manifest;
}

TrainerState parse_trainer_state(const std::string& text, const std::string& path) {
  const json object = parse_object(text, path);
  check_format_version(object, path);
  TrainerState state;
  state.step = integer_field(object, "step", path, 0);
  // Checkpoints written before sequences_per_step recorded the running total instead.
  if (object.contains("sequences_per_step")) {
    state.sequences_per_step = integer_field(object, "sequences_per_step", path, 1);
  } else if (object.contains("sequences_consumed") && state.step > 0) {
    state.sequences_per_step = integer_field(object, "sequences_consumed", path, 0) / state.step;
  }
  if (object.contains("loss") && !object["loss"].is_null()) {
    if (!object["loss"].is_number()) fail(path, "\"loss\" is " + object["loss"].dump());
    state.loss = object["loss"].get<double>();
  }
  if (object.contains("guard")) state.guard = parse_guard(object["guard"], path);
  const int kMaxInt = std::numeric_limits<int>::max();
  state.world_size = int(integer_field(object, "world_size", path, 1, kMaxInt));
  state.sp = int(integer_field(object, "sp", path, 1, kMaxInt));
  state.zero_stage = int(integer_field(object, "zero_stage", path, 0, 3));
  state.model = parse_model(field(object, "model", path), path);
  const json& shards = field(object, "optimizer_shards", path);
  if (!shards.is_array() || shards.empty())
    fail(path, "\"optimizer_shards\" is " + shards.dump() + ", not a list of file names");
  for (const json& name : shards)
    state.optimizer_shards.push_back(plain_file_name(name, "optimizer shard", path));
  if (object.contains("data")) {
    const json& data = object["data"];
    if (!data.is_object()) fail(path, "\"data\" is " + data.dump() + ", not an object");
    state.data_keys = string_map(field(data, "keys", path), "\"data\".\"keys\"", path);
    state.data_seq_len = integer_field(data, "seq_len", path, 1);
    state.train_sequences = integer_field(data, "train_sequences", path, 1);
  }
  if (object.contains("lr_schedule"))
    state.lr_schedule_keys = string_map(object["lr_schedule"], "\"lr_schedule\"", path);
  return state;
}

std::string manifest_json(const CheckpointManifest& manifest) {
  json files = json::object();
  for (const ManifestEntry& entry : manifest.files)
    files[entry.name] = {{"bytes", entry.bytes}, {"crc32", entry.crc32}};
  json object = {{"format", "ulysses-checkpoint"},
                 {"format_version", kCheckpointFormatVersion},
                 {"step", manifest.step},
                 {"files", files}};
  return object.dump(2) + "\n";
}

std::string trainer_state_json(const TrainerState& state) {
  json object = {{"format_version", kCheckpointFormatVersion},
                 {"step", state.step},
                 {"sequences_per_step", state.sequences_per_step},
                 {"loss", state.loss ? json(*state.loss) : json()},
                 {"guard", guard_json(state.guard)},
                 {"world_size", state.world_size},
                 {"sp", state.sp},
                 {"zero_stage", state.zero_stage},
                 {"model", model_json(state.model)},
                 {"optimizer_shards", state.optimizer_shards}};
  if (state.train_sequences > 0)
    object["data"] = {{"keys", state.data_keys},
                      {"seq_len", state.data_seq_len},
                      {"train_sequences", state.train_sequences}};
  if (!state.lr_schedule_keys.empty()) object["lr_schedule"] = state.lr_schedule_keys;
  return object.dump(2) + "\n";
}

namespace {

std::string read_state_text(const std::string& path) {
  try {
    return read_whole_file(path);
  } catch (const std::exception& error) {
    throw CheckpointError(error.what());
  }
}

}  // namespace

TrainerState read_trainer_state(const std::string& folder) {
  const std::string path = folder + "/" + kCheckpointStateFile;
  return parse_trainer_state(read_state_text(path), path);
}

CheckpointModel read_recorded_model(const std::string& folder) {
  const std::string path = folder + "/" + kCheckpointStateFile;
  return parse_model(field(parse_object(read_state_text(path), path), "model", path), path);
}

void verify_checkpoint(const std::string& folder) {
  const std::string manifest_path = folder + "/" + kCheckpointManifestFile;
  std::error_code error;
  if (!fs::exists(manifest_path, error))
    throw CheckpointError("checkpoint '" + folder + "' has no " + kCheckpointManifestFile +
                          " (incomplete or not a checkpoint)");
  std::string text;
  try {
    text = read_whole_file(manifest_path);
  } catch (const std::exception& problem) {
    throw CheckpointError(problem.what());
  }
  const CheckpointManifest manifest = parse_manifest(text, manifest_path);
  for (const ManifestEntry& entry : manifest.files) {
    const std::string path = folder + "/" + entry.name;
    if (!fs::is_regular_file(path, error))
      throw CheckpointError("checkpoint file '" + path + "' is missing");
    uint64_t actual_bytes = fs::file_size(path, error);
    if (error || actual_bytes != entry.bytes)
      throw CheckpointError("checkpoint file '" + path + "' has " + std::to_string(actual_bytes) +
                            " bytes, the manifest says " + std::to_string(entry.bytes) +
                            " (truncated or overwritten)");
    uint32_t crc = 0;
    try {
      crc = crc32_of_file(path);
    } catch (const std::exception& problem) {
      throw CheckpointError(problem.what());
    }
    if (crc != entry.crc32)
      throw CheckpointError("checkpoint file '" + path + "' fails its CRC-32 checksum (corrupted)");
  }
}

std::string read_latest_name(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointLatestFile;
  std::error_code error;
  if (!fs::exists(path, error)) return "";
  std::string name;
  try {
    name = read_whole_file(path);
  } catch (const std::exception& problem) {
    throw CheckpointError(problem.what());
  }
  name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
  return plain_file_name(json(name), "latest names", path);
}

void point_latest_at(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + kCheckpointLatestFile;
  replace_file_durably(path, name + "\n");
  fsync_directory(dir);
}

std::string find_latest_checkpoint(const std::string& dir) {
  std::error_code error;
  if (dir.empty() || !fs::is_directory(dir, error)) return "";
  std::string newest;
  for (const auto& [step, folder] : checkpoint_step_folders(dir)) {
    try {
      verify_checkpoint(folder);
      newest = folder;
      break;
    } catch (const CheckpointError& problem) {
      spdlog::warn("skipping checkpoint: {}", problem.what());
    }
  }
  // `latest` only says which folder was published last: the folders decide.
  std::string named;
  try {
    named = read_latest_name(dir);
  } catch (const CheckpointError& problem) {
    spdlog::warn("latest checkpoint unusable ({}); using the newest intact step folder",
                 problem.what());
  }
  if (!named.empty() && !newest.empty() && fs::path(newest).filename() != named)
    spdlog::warn(
        "{}/latest names {}, but the newest intact checkpoint there is {}: using it (latest lags "
        "behind the step folders when a save was interrupted, e.g. by a full disk)",
        dir, named, fs::path(newest).filename().string());
  if (!named.empty() && newest.empty())
    spdlog::warn("{}/latest names {}, which is not an intact checkpoint", dir, named);
  if (fs::exists(dir + "/" + kOverwritePendingFolder, error))
    spdlog::warn(
        "{}/{} holds the checkpoints of an overwrite that was interrupted; the next "
        "ulysses-train run in this folder finishes or undoes it (docs/checkpoints.md)",
        dir, kOverwritePendingFolder);
  return newest;
}

std::string checkpoint_in(const std::string& path) {
  std::error_code error;
  if (fs::exists(path + "/" + kCheckpointManifestFile, error)) return path;
  return find_latest_checkpoint(path);
}

std::string require_checkpoint_in(const std::string& path, const std::string& option) {
  std::string folder = checkpoint_in(path);
  if (folder.empty()) throw CheckpointError(option + ": " + why_no_checkpoint_in(path));
  return folder;
}

std::string why_no_checkpoint_in(const std::string& path) {
  // A symlink loop, a FIFO or a missing path each named as what it is (data/input_file.h).
  if (const std::string problem = input_folder_problem(path); !problem.empty())
    return problem + "; give a checkpoint step folder or a checkpoint dir";
  const auto folders = checkpoint_step_folders(path);
  if (folders.empty())
    return "'" + path + "' is not a checkpoint: it has no " + kCheckpointManifestFile +
           " and no step_* folders";
  try {
    verify_checkpoint(folders.front().second);
  } catch (const CheckpointError& problem) {
    return "'" + path + "' holds " + std::to_string(folders.size()) +
           " step folder(s) but none is intact; the newest fails: " + problem.what();
  }
  return "'" + path + "' holds no intact checkpoint";
}

}  // namespace ulysses
