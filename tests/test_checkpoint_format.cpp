// The checkpoint format module (core/checkpoint/checkpoint_format.h): every field of the manifest
// and the trainer state is checked on reading, with a message naming the file and the field, and
// keep_last pruning never removes the checkpoint to go back to.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_format.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using nlohmann::json;

json valid_state() {
  return json::parse(R"({
    "format_version": 1, "step": 12, "sequences_per_step": 8, "loss": 1.25,
    "world_size": 4, "sp": 2, "zero_stage": 3,
    "model": {"family": "llama", "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2,
              "d_ff": 192, "vocab_size": 300, "max_seq_len": 256, "rope_theta": 500000.0},
    "optimizer_shards": ["optimizer-00000-of-00002.safetensors",
                         "optimizer-00001-of-00002.safetensors"]})");
}

std::string state_error(const json& state) {
  try {
    parse_trainer_state(state.dump(), "ck/trainer_state.json");
  } catch (const CheckpointError& error) {
    return error.what();
  }
  ADD_FAILURE() << "accepted: " << state.dump();
  return "";
}

TEST(TrainerStateFormat, ReadsWhatItWrites) {
  const TrainerState state = parse_trainer_state(valid_state().dump(), "t.json");
  EXPECT_EQ(state.step, 12);
  EXPECT_EQ(state.sequences_per_step, 8);
  EXPECT_EQ(state.loss.value_or(0.0), 1.25);
  EXPECT_EQ(state.world_size, 4);
  EXPECT_EQ(state.zero_stage, 3);
  EXPECT_EQ(state.model.model.n_kv_heads, 2);
  EXPECT_EQ(state.model.rope_theta.value_or(0.0), 500000.0);
  EXPECT_FALSE(state.model.norm_eps.has_value());
  ASSERT_EQ(state.optimizer_shards.size(), 2u);
  const TrainerState again = parse_trainer_state(trainer_state_json(state), "t.json");
  EXPECT_EQ(trainer_state_json(again), trainer_state_json(state));
}

TEST(TrainerStateFormat, ANonFiniteLossIsRecordedAsNone) {
  json state = valid_state();
  state["loss"] = nullptr;
  EXPECT_FALSE(parse_trainer_state(state.dump(), "t.json").loss.has_value());
  TrainerState written = parse_trainer_state(valid_state().dump(), "t.json");
  written.loss.reset();
  EXPECT_MENTIONS(trainer_state_json(written), "\"loss\": null");
}

// The divergence guard's record (core/train/divergence_guard.h): absent in checkpoints of earlier
// builds, read back as written, and checked like every other field.
TEST(TrainerStateFormat, TheGuardRecordIsOptionalRoundTripsAndIsChecked) {
  const TrainerState older = parse_trainer_state(valid_state().dump(), "t.json");
  EXPECT_FALSE(older.guard.good_step.has_value());
  EXPECT_EQ(older.guard.normal_steps, 0);
  TrainerState state = older;
  state.guard.good_step = 11;
  state.guard.loss_mean = 2.5;
  state.guard.normal_steps = 12;
  const TrainerState again = parse_trainer_state(trainer_state_json(state), "t.json");
  EXPECT_EQ(again.guard.good_step, 11);
  EXPECT_EQ(again.guard.loss_mean, 2.5);
  EXPECT_EQ(again.guard.normal_steps, 12);
  json bad = valid_state();
  bad["guard"] = {{"good_step", -1}, {"loss_mean", 1.0}, {"normal_steps", 3}};
  EXPECT_MENTIONS(state_error(bad), "\"good_step\" is -1");
  bad["guard"] = {{"good_step", nullptr}, {"loss_mean", "x"}, {"normal_steps", 3}};
  EXPECT_MENTIONS(state_error(bad), "guard.loss_mean is \"x\"");
  bad["guard"] = 5;
  EXPECT_MENTIONS(state_error(bad), "\"guard\" is 5, not an object");
}

// What decided the tokens the run read (docs/checkpoints.md#resuming): absent in checkpoints of
// earlier builds, read back as written, and checked like every other field.
TEST(TrainerStateFormat, TheDataRecordIsOptionalRoundTripsAndIsChecked) {
  const TrainerState older = parse_trainer_state(valid_state().dump(), "t.json");
  EXPECT_TRUE(older.data_keys.empty());
  EXPECT_EQ(older.train_sequences, 0);
  EXPECT_EQ(trainer_state_json(older).find("\"data\""), std::string::npos);
  TrainerState state = older;
  state.data_keys = {{"data.path", "corpus/*.txt"}, {"train.seed", "5"}};
  state.data_seq_len = 4096;
  state.train_sequences = 1200;
  const TrainerState again = parse_trainer_state(trainer_state_json(state), "t.json");
  EXPECT_EQ(again.data_keys, state.data_keys);
  EXPECT_EQ(again.data_seq_len, 4096);
  EXPECT_EQ(again.train_sequences, 1200);
  json bad = valid_state();
  bad["data"] = {{"keys", {{"train.seed", 5}}}, {"seq_len", 32}, {"train_sequences", 3}};
  EXPECT_MENTIONS(state_error(bad), "\"data\".\"keys\".\"train.seed\" is 5, not a string");
  bad["data"] = {{"keys", json::array()}, {"seq_len", 32}, {"train_sequences", 3}};
  EXPECT_MENTIONS(state_error(bad), "\"data\".\"keys\" is [], not an object");
  bad["data"] = {{"keys", json::object()}, {"seq_len", 0}, {"train_sequences", 3}};
  EXPECT_MENTIONS(state_error(bad), "\"seq_len\" is 0");
  bad["data"] = {{"keys", json::object()}, {"seq_len", 32}};
  EXPECT_MENTIONS(state_error(bad), "has no \"train_sequences\"");
  bad["data"] = "text";
  EXPECT_MENTIONS(state_error(bad), "\"data\" is \"text\", not an object");
}

// What the learning rate was a function of: absent in checkpoints of earlier builds, read back
// as written, and checked like every other field.
TEST(TrainerStateFormat, TheScheduleRecordIsOptionalRoundTripsAndIsChecked) {
  const TrainerState older = parse_trainer_state(valid_state().dump(), "t.json");
  EXPECT_TRUE(older.lr_schedule_keys.empty());
  EXPECT_EQ(trainer_state_json(older).find("\"lr_schedule\""), std::string::npos);
  TrainerState state = older;
  state.lr_schedule_keys = {{"train.lr", "0.003"}, {"train.steps", "100"}};
  EXPECT_EQ(parse_trainer_state(trainer_state_json(state), "t.json").lr_schedule_keys,
            state.lr_schedule_keys);
  json bad = valid_state();
  bad["lr_schedule"] = {{"train.steps", 100}};
  EXPECT_MENTIONS(state_error(bad), "\"lr_schedule\".\"train.steps\" is 100, not a string");
  bad["lr_schedule"] = json::array();
  EXPECT_MENTIONS(state_error(bad), "\"lr_schedule\" is [], not an object");
}

TEST(TrainerStateFormat, OlderCheckpointsGiveTheirBatchFromTheRunningTotal) {
  json state = valid_state();
  state.erase("sequences_per_step");
  state["sequences_consumed"] = 48;
  EXPECT_EQ(parse_trainer_state(state.dump(), "t.json").sequences_per_step, 4);
}

TEST(TrainerStateFormat, EveryMissingOrWrongFieldIsNamed) {
  struct Case {
    const char* what;
    std::function<void(json&)> damage;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"not JSON", [](json& s) { s = "x"; }, "not a JSON object"},
      {"no model", [](json& s) { s.erase("model"); }, "has no \"model\""},
      {"no optimizer shards", [](json& s) { s.erase("optimizer_shards"); },
       "has no \"optimizer_shards\""},
      {"empty optimizer shards", [](json& s) { s["optimizer_shards"] = json::array(); },
       "not a list of file names"},
      {"negative step", [](json& s) { s["step"] = -3; }, "\"step\" is -3, outside [0, "},
      {"step as text", [](json& s) { s["step"] = "12"; }, "\"step\" is \"12\", not an integer"},
      {"huge step", [](json& s) { s["step"] = 18446744073709551615ull; }, "\"step\" is 1844"},
      {"format version", [](json& s) { s["format_version"] = 7; }, "format_version 7"},
      {"shard outside the folder", [](json& s) { s["optimizer_shards"][0] = "../../etc/passwd"; },
       "'../../etc/passwd' is not a plain file name"},
      {"shard not a string", [](json& s) { s["optimizer_shards"][0] = 3; }, "is not a file name"},
      {"zero stage 5", [](json& s) { s["zero_stage"] = 5; }, "\"zero_stage\" is 5"},
      {"family", [](json& s) { s["model"]["family"] = "mamba"; }, "model.family is \"mamba\""},
      {"d_model zero", [](json& s) { s["model"]["d_model"] = 0; }, "model.d_model is 0"},
      {"rope theta negative", [](json& s) { s["model"]["rope_theta"] = -1; },
       "\"rope_theta\" is -1"},
      {"loss as text", [](json& s) { s["loss"] = "low"; }, "\"loss\" is \"low\""},
  };
  for (const Case& c : cases) {
    json state = valid_state();
    c.damage(state);
    const std::string message = state_error(state);
    EXPECT_MENTIONS(message, "ck/trainer_state.json") << c.what;
    EXPECT_MENTIONS(message, c.message) << c.what;
  }
}

TEST(ManifestFormat, ReadsWhatItWritesAndRefusesNamesOutsideTheFolder) {
  CheckpointManifest manifest;
  manifest.step = 5;
  manifest.files = {{"model.safetensors", 1024, 0xdeadbeef}, {"trainer_state.json", 10, 7}};
  const CheckpointManifest back = parse_manifest(manifest_json(manifest), "m.json");
  EXPECT_EQ(back.step, 5);
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].crc32, 0xdeadbeefu);

  auto error_of = [](const std::string& text) {
    try {
      parse_manifest(text, "ck/manifest.json");
    } catch (const CheckpointError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  const std::string head = R"({"format": "ulysses-checkpoint", "format_version": 1, "step": 5, )";
  EXPECT_MENTIONS(error_of(head + R"("files": {"../x": {"bytes": 1, "crc32": 1}}})"),
                  "'../x' is not a plain file name");
  EXPECT_MENTIONS(error_of(head + R"("files": {}})"), "lists no files");
  EXPECT_MENTIONS(error_of(head + R"("files": {"a": {"bytes": 1, "crc32": 4294967296}}})"),
                  "\"crc32\" is 4294967296");
  EXPECT_MENTIONS(error_of(head + R"("files": {"a": {"bytes": -1, "crc32": 1}}})"),
                  "\"bytes\" is -1");
  EXPECT_MENTIONS(error_of(R"({"format": "other"})"), "not a ulysses checkpoint manifest");
  EXPECT_MENTIONS(error_of("[1, 2"), "not valid JSON");
}

TEST(Pruning, KeepsTheNewestTheOneJustWrittenAndTheOneToGoBackTo) {
  const std::vector<std::string> newest_first = {"s6", "s5", "s4", "s3", "s2"};
  // keep_last 2 would keep s6 and s5, whose weights no normal step measured: s4 stays too.
  EXPECT_EQ(folders_to_prune(newest_first, 2, "s6", "s4"), (std::vector<std::string>{"s3", "s2"}));
  EXPECT_EQ(folders_to_prune(newest_first, 3, "s6", "s4"), (std::vector<std::string>{"s3", "s2"}));
  EXPECT_EQ(folders_to_prune(newest_first, 1, "s6", "s4"),
            (std::vector<std::string>{"s5", "s3", "s2"}));
  // The folder just written is never removed, even when a newer one exists (a rerun).
  EXPECT_EQ(folders_to_prune(newest_first, 1, "s2", "s4"), (std::vector<std::string>{"s5", "s3"}));
  EXPECT_TRUE(folders_to_prune(newest_first, 0, "s6", "s4").empty());
  // Without one to go back to, only keep_last counts.
  EXPECT_EQ(folders_to_prune(newest_first, 2, "s6", ""),
            (std::vector<std::string>{"s4", "s3", "s2"}));
}

TEST(StepFolders, OnlyStepFoldersWithDigitsNewestFirst) {
  testing::TempDir dir;
  for (const char* name :
       {"step_00000002", "step_00000010", "step_x", "step_", ".tmp-step_00000011", "other"})
    std::filesystem::create_directory(dir.file(name));
  testing::write_text_file(dir.file("step_00000099"), "a file, not a folder");
  const auto folders = checkpoint_step_folders(dir.path());
  ASSERT_EQ(folders.size(), 2u);
  EXPECT_EQ(folders[0].first, 10);
  EXPECT_EQ(folders[1].first, 2);
  EXPECT_TRUE(checkpoint_step_folders(dir.file("missing")).empty());
}

}  // namespace
}  // namespace ulysses
