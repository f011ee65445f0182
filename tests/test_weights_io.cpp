// Weights in and out: export of checkpoints to Hugging Face Llama folders and llm.c GPT-2
// files, import of both (and of our own checkpoints) through model.init_from, an import
// checked against an independent PyTorch forward, and clear errors on bad files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/weights_io.h"
#include "core/checkpoint/weights_io_formats.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "data/token_stream.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

// All the weights of model.init_from into host_params, laid out by table.
void load_pretrained_weights(const std::string& path, const ModelConfig& model,
                             const ParamTable& table, std::vector<float>& host_params) {
  const PretrainedWeights weights(path, model, table);
  host_params.resize(size_t(table.total_numel()));
  weights.read(0, table.total_numel(), host_params.data());
}

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_command;
using testing::TempDir;

const std::string kTrain = ULYSSES_TRAIN_BIN;
const std::string kReference =
    "/usr/bin/python3 " ULYSSES_SOURCE_DIR "/tests/reference/reference_model.py";

bool torch_available() {
  return run_command("/usr/bin/python3 -c 'import torch'").exit_code == 0;
}

// The message load_pretrained_weights throws, or "" when it loads.
std::string load_error(const std::string& path, const ModelConfig& model) {
  ParamTable table(model);
  std::vector<float> params;
  try {
    load_pretrained_weights(path, model, table, params);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

std::vector<float> random_weights(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> weights(size_t(table.total_numel()));
  for (float& w : weights) w = normal(engine);
  return weights;
}

std::vector<float> read_checkpoint_file(const std::string& path, const ParamTable& table) {
  std::vector<float> weights(size_t(table.total_numel()));
  SafetensorsReader reader(path);
  for (const ParamSpec& spec : table.specs())
    reader.read_f32(spec.name, spec.shape, weights.data() + spec.offset);
  return weights;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- export, then import: the same weights and the same loss ---------------------------

struct StepMetrics {
  double loss = 0.0;
  double grad_norm = 0.0;
};

std::vector<StepMetrics> read_metrics(const std::string& path) {
  std::vector<StepMetrics> steps;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json value = json::parse(line);
    if (value.contains("loss"))
      steps.push_back({value["loss"].get<double>(), value["grad_norm"].get<double>()});
  }
  return steps;
}

// A tiny run whose training data is one single sequence: 40 tokens leave 38 for training
// (val_fraction 0.05), room for one sequence of 32 + 1 tokens, so every step of every run
// sees the same batch. A run that starts from imported weights and a run resumed from the
// checkpoint they came from then evaluate the same weights on the same batch, and must
// print the same loss and gradient norm.
class RoundTrip : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    family_ = GetParam();
    for (int i = 0; i < 40; ++i) tokens_.push_back((i * 97 + 13) % 300);
    write_token_shard(dir_.file("shard.bin"), tokens_, 1);
    const std::string sizes = family_ == "llama" ? "n_kv_heads: 2, d_ff: 64" : "d_ff: 128";
    yaml_ = "model: {family: " + family_ + ", n_layers: 2, d_model: 32, n_heads: 4, " + sizes +
            ", vocab_size: 300}\n";
    yaml_ += "train: {steps: 2, batch_size: 1, seq_len: 32, lr: 1.0e-2, seed: 7, ";
    yaml_ += "checkpoint: {dir: " + dir_.file("ckpt") + ", every: 1}}\n";
    yaml_ += "data: {source: tokens, path: " + dir_.file("shard.bin") + "}\n";
    yaml_ += "log: {metrics_file: " + dir_.file("train.jsonl") + "}\n";
    testing::write_text_file(dir_.file("run.yaml"), yaml_);
    auto trained = run_command(kTrain + " --config " + dir_.file("run.yaml"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    checkpoint_ = dir_.file("ckpt/" + checkpoint_folder_name(2));
  }

  testing::CommandResult train(const std::string& metrics, const std::string& extra) {
    return run_command(kTrain + " --config " + dir_.file("run.yaml") +
                       " --set log.metrics_file=" + dir_.file(metrics) + extra);
  }

  // The first step's loss of a run started from pretrained weights.
  StepMetrics first_step_from(const std::string& init_from, const std::string& name) {
    auto run = train(name + ".jsonl", " --set train.steps=1 --set model.init_from=" + init_from +
                                          " --set train.checkpoint.dir=" + dir_.file(name));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    auto steps = read_metrics(dir_.file(name + ".jsonl"));
    EXPECT_EQ(steps.size(), 1u) << run.output;
    return steps.empty() ? StepMetrics{} : steps[0];
  }

  ModelConfig model() const { return parse_config(yaml_, {}, "run.yaml").model; }

  TempDir dir_;
  std::string family_, yaml_, checkpoint_;
  std::vector<int32_t> tokens_;
};

TEST_P(RoundTrip, ExportedWeightsImportBitwiseAndGiveTheResumedRunsLoss) {
  const bool llama = family_ == "llama";
  const std::string format = llama ? "hf-llama" : "llmc";
  const std::string exported = dir_.file(llama ? "hf" : "model.bin");
  // The checkpoint dir, not a step folder: export takes its newest checkpoint (step 2).
  auto result = run_command(kTrain + " export --checkpoint " + dir_.file("ckpt") + " --format " +
                            format + " --out " + exported);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const ModelConfig m = model();
  const ParamTable table(m);
  std::vector<float> imported;
  load_pretrained_weights(exported, m, table, imported);
  EXPECT_TRUE(
      bitwise_equal(imported, read_checkpoint_file(checkpoint_ + "/model.safetensors", table)));

  auto resumed = train("resumed.jsonl", " --resume " + checkpoint_ + " --set train.steps=3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto resumed_steps = read_metrics(dir_.file("resumed.jsonl"));
  ASSERT_EQ(resumed_steps.size(), 1u);
  const StepMetrics from_export = first_step_from(exported, "from_export");
  EXPECT_EQ(from_export.loss, resumed_steps[0].loss);
  EXPECT_EQ(from_export.grad_norm, resumed_steps[0].grad_norm);
  // Our own checkpoint works as init_from too.
  const StepMetrics from_checkpoint = first_step_from(checkpoint_, "from_checkpoint");
  EXPECT_EQ(from_checkpoint.loss, resumed_steps[0].loss);
  // The comparison can fail: the fresh weights of step 1 give another loss.
  const auto fresh = read_metrics(dir_.file("train.jsonl"));
  ASSERT_EQ(fresh.size(), 2u);
  EXPECT_NE(from_export.loss, fresh[0].loss);

  if (llama) {
    const json config = json::parse(testing::read_text_file(exported + "/config.json"));
    EXPECT_EQ(config["architectures"], json({"LlamaForCausalLM"}));
    EXPECT_EQ(config["hidden_size"], 32);
    EXPECT_EQ(config["intermediate_size"], 64);
    EXPECT_EQ(config["num_key_value_heads"], 2);
    EXPECT_EQ(config["max_position_embeddings"], 32);
    EXPECT_EQ(config["tie_word_embeddings"], false);
    EXPECT_EQ(config["rope_theta"], 10000.0);
    EXPECT_EQ(config["rms_norm_eps"], 1e-5);
    SafetensorsReader weights(exported + "/model.safetensors");
    EXPECT_EQ(weights.metadata().at("format"), "pt");
    for (const SafetensorsEntry& entry : weights.entries()) EXPECT_EQ(entry.dtype, "F32");
    EXPECT_EQ(weights.entries().size(), table.specs().size());
    if (torch_available()) {
      // An independent reader of the folder: the PyTorch reference's Hugging Face loader
      // and forward, on the one training sequence (the first 33 tokens of the shard).
      std::string sequence;
      for (int i = 0; i < 33; ++i) sequence += std::to_string(tokens_[size_t(i)]) + ",";
      auto reference = run_command(
          "/usr/bin/python3 -c \"import sys; sys.path.insert(0, '" ULYSSES_SOURCE_DIR
          "/tests/reference'); import reference_model as r, torch; "
          "cfg, tied, params = r.read_hf_checkpoint(sys.argv[1]); t = torch.tensor([[" +
          sequence +
          "]]); print(repr(r.model_loss(params, cfg, t[:, :-1], t[:, 1:], tied).item()))\" " +
          exported);
      ASSERT_EQ(reference.exit_code, 0) << reference.output;
      const double reference_loss = std::stod(reference.output);
      EXPECT_NEAR(from_export.loss, reference_loss, 1e-5 * reference_loss);
    }
  } else {
    // V = 300 is padded with zero rows to Vp = 384.
    const int64_t padding = (384 - 300) * 32;
    EXPECT_EQ(fs::file_size(exported), uint64_t(1024 + 4 * (table.total_numel() + padding)));
    std::ifstream in(exported, std::ios::binary);
    int32_t header[256];
    in.read(reinterpret_cast<char*>(header), sizeof header);
    EXPECT_EQ(std::vector<int32_t>(header, header + 8),
              (std::vector<int32_t>{20240326, 3, 32, 300, 2, 4, 32, 384}));
    std::vector<float> pad(static_cast<size_t>(padding));
    in.seekg(1024 + 4 * 300 * 32);
    in.read(reinterpret_cast<char*>(pad.data()), std::streamsize(pad.size() * 4));
    EXPECT_TRUE(bitwise_equal(pad, std::vector<float>(pad.size(), 0.0f)));
  }

  // The other format is refused, naming the one that fits.
  auto wrong = run_command(kTrain + " export --checkpoint " + checkpoint_ + " --format " +
                           (llama ? "llmc" : "hf-llama") + " --out " + dir_.file("wrong"));
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_MENTIONS(wrong.output, "--format " + format);
}

TEST_P(RoundTrip, CheckpointOfAnotherShapeIsRefusedAsInitFrom) {
  auto other = train("other.jsonl", " --set model.d_ff=96 --set model.init_from=" + checkpoint_ +
                                        " --set train.checkpoint.dir=" + dir_.file("other"));
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_MENTIONS(other.output, "trainer_state.json");
  EXPECT_MENTIONS(other.output, "d_ff is " + std::string(family_ == "llama" ? "64" : "128"));
  EXPECT_MENTIONS(other.output, "model.d_ff is 96");
}

// export -c takes the run's config and exports the newest checkpoint of its
// train.checkpoint.dir: the same file as --checkpoint with that dir.
TEST_P(RoundTrip, ExportOfTheConfigsRunIsTheNewestCheckpointOfItsDir) {
  const std::string format = family_ == "llama" ? "hf-llama" : "llmc";
  const std::string by_config = dir_.file(family_ == "llama" ? "hf-config" : "config.bin");
  const std::string by_dir = dir_.file(family_ == "llama" ? "hf-dir" : "dir.bin");
  auto from_config = run_command(kTrain + " export -c " + dir_.file("run.yaml") + " --format " +
                                 format + " --out " + by_config);
  ASSERT_EQ(from_config.exit_code, 0) << from_config.output;
  EXPECT_MENTIONS(from_config.output, "exported " + checkpoint_);
  ASSERT_EQ(run_command(kTrain + " export --checkpoint " + dir_.file("ckpt") + " --format " +
                        format + " --out " + by_dir)
                .exit_code,
            0);
  const std::string file = family_ == "llama" ? "/model.safetensors" : "";
  EXPECT_EQ(testing::read_text_file(by_config + file), testing::read_text_file(by_dir + file));

  testing::write_text_file(dir_.file("no-dir.yaml"), "model: {n_layers: 1}\n");
  auto no_dir = run_command(kTrain + " export -c " + dir_.file("no-dir.yaml") + " --format " +
                            format + " --out " + dir_.file("x"));
  EXPECT_EQ(no_dir.exit_code, 2) << no_dir.output;
  EXPECT_MENTIONS(no_dir.output, "no-dir.yaml sets no train.checkpoint.dir; give --checkpoint");
  fs::remove_all(dir_.file("ckpt"));
  auto gone = run_command(kTrain + " export -c " + dir_.file("run.yaml") + " --format " + format +
                          " --out " + dir_.file("y"));
  EXPECT_EQ(gone.exit_code, 2) << gone.output;
  EXPECT_MENTIONS(gone.output, "train.checkpoint.dir of " + dir_.file("run.yaml") + ": '" +
                                   dir_.file("ckpt") + "' does not exist");
}

INSTANTIATE_TEST_SUITE_P(Families, RoundTrip, ::testing::Values("llama", "gpt2"));

// ---- the export command's arguments ------------------------------------------------------

TEST(ExportCommand, HelpDescribesEveryOption) {
  auto help = run_command(kTrain + " export --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* word : {"--checkpoint", "--config", "--format", "--out", "hf-llama", "llmc"})
    EXPECT_MENTIONS(help.output, word);
}

TEST(ExportCommand, BadArgumentsAndUnreadableCheckpointsExitTwo) {
  TempDir dir;
  const std::string ok = " --checkpoint " + dir.path() + " --out " + dir.file("x");
  EXPECT_EQ(run_command(kTrain + " export" + ok).exit_code, 2);  // no --format
  auto no_weights = run_command(kTrain + " export --format llmc --out " + dir.file("x"));
  EXPECT_EQ(no_weights.exit_code, 2) << no_weights.output;
  EXPECT_MENTIONS(no_weights.output, "give --checkpoint, or --config");
  testing::write_text_file(dir.file("c.yaml"), "");
  auto both = run_command(kTrain + " export --format llmc -c " + dir.file("c.yaml") + ok);
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_MENTIONS(both.output, "--checkpoint excludes --config");
  EXPECT_EQ(run_command(kTrain + " export --format onnx" + ok).exit_code, 2);
  EXPECT_EQ(run_command(kTrain + " export --format llmc --checkpoint " + dir.path()).exit_code, 2);
  EXPECT_EQ(run_command(kTrain + " export --format llmc --out x --checkpoint " + dir.file("none"))
                .exit_code,
            2);
  auto empty = run_command(kTrain + " export --format llmc" + ok);
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_MENTIONS(empty.output, dir.path());
  EXPECT_MENTIONS(empty.output, "no manifest.json");
}

// ---- an independent Hugging Face checkpoint: the PyTorch forward's loss ----------------

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, ImportedModelGivesTheReferenceLoss) {
  if (!torch_available()) GTEST_SKIP() << "/usr/bin/python3 with torch (python3-torch) is absent";
  TempDir dir;
  const std::string folder = dir.file("hf");
  auto written = run_command(kReference + " --hf-checkpoint " + folder +
                             " --seed 5 --rope-theta 500 " + GetParam());
  ASSERT_EQ(written.exit_code, 0) << written.output;

  const Config config = parse_config(
      "model: {family: llama, n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ff: 160, "
      "vocab_size: 256, max_seq_len: 128, rope_theta: 500, norm_eps: 1.0e-5}\n"
      "train: {batch_size: 2, seq_len: 32}\n"
      "data: {source: synthetic, n_pairs: 1, n_queries: 1, n_keys: 4, n_values: 4, n_filler: 4}\n",
      {}, "hf.yaml");
  auto backend = make_backend(BackendKind::cpu, 0);
  auto sp = make_local_comm("sp");
  Model model(config, *backend, *sp, *sp, 2, 32);
  std::vector<float> weights;
  load_pretrained_weights(folder, config.model, model.table(), weights);
  model.load_weights(weights.data());

  const json batch = json::parse(testing::read_text_file(folder + "/batch.json"));
  MicroBatch micro;
  micro.batch = 2;
  micro.seq_local = 32;
  for (const auto& row : batch["inputs"])
    for (const auto& token : row) micro.inputs.push_back(token.get<int32_t>());
  for (const auto& row : batch["targets"])
    for (const auto& token : row) micro.targets.push_back(token.get<int32_t>());
  ASSERT_EQ(micro.inputs.size(), 64u);
  ASSERT_EQ(micro.targets.size(), 64u);

  const LossResult loss = model.evaluate(micro);
  const json expected = json::parse(testing::read_text_file(folder + "/expected_loss.json"));
  const double expected_loss = expected["loss"].get<double>();
  EXPECT_EQ(loss.count, expected["counted_targets"].get<int64_t>());
  EXPECT_NEAR(loss.loss_sum / double(loss.count), expected_loss, 1e-5 * std::abs(expected_loss));
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfReference, ::testing::Values("", "--shards 2", "--tied"),
                         [](const auto& info) {
                           return info.param.empty()       ? std::string("single_file")
                                  : info.param == "--tied" ? std::string("tied")
                                                           : std::string("two_shards");
                         });

// ---- bad Hugging Face folders --------------------------------------------------------------

ModelConfig small_llama() {
  ModelConfig m;
  m.family = Family::llama;
  m.n_layers = 2;
  m.d_model = 16;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.d_ff = 32;
  m.vocab_size = 50;
  m.max_seq_len = 16;
  return m;
}

// A Hugging Face folder written here, independently of the exporter and the python tool.
class HfFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = random_weights(table_, 3);
    config_ = {{"architectures", {"LlamaForCausalLM"}},
               {"hidden_size", 16},
               {"intermediate_size", 32},
               {"num_hidden_layers", 2},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"rms_norm_eps", 1e-5},
               {"rope_theta", 10000.0},
               {"vocab_size", 50},
               {"max_position_embeddings", 16},
               {"tie_word_embeddings", false}};
  }
  // Writes config.json and the tensors, all in model.safetensors or half in each of two
  // shards with an index; skip names a tensor to leave out.
  void write(bool sharded = false, const std::string& skip = "") {
    fs::create_directories(folder());
    testing::write_text_file(folder() + "/config.json", config_.dump(2));
    SafetensorsWriter first, second;
    json weight_map = json::object();
    const auto& specs = table_.specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == skip) continue;
      const bool in_second = sharded && i >= specs.size() / 2;
      (in_second ? second : first)
          .add_bf16(specs[i].name, specs[i].shape, weights_.data() + specs[i].offset);
      weight_map[specs[i].name] = in_second ? "part-2.safetensors" : "part-1.safetensors";
    }
    if (!sharded) {
      first.write(folder() + "/model.safetensors");
      return;
    }
    first.write(folder() + "/part-1.safetensors");
    second.write(folder() + "/part-2.safetensors");
    testing::write_text_file(folder() + "/model.safetensors.index.json",
                             json{{"weight_map", weight_map}}.dump());
  }
  std::string folder() const { return dir_.file("hf"); }

  TempDir dir_;
  ModelConfig model_ = small_llama();
  ParamTable table_{model_};
  std::vector<float> weights_;
  json config_;
};

TEST_F(HfFolder, Bf16WeightsLoadRoundedAndTiedHeadIsTheEmbedding) {
  write(true);
  std::vector<float> loaded;
  load_pretrained_weights(folder(), model_, table_, loaded);
  for (size_t i = 0; i < weights_.size(); ++i)
    ASSERT_EQ(loaded[i], bf16_to_float(float_to_bf16(weights_[i]))) << "element " << i;

  fs::remove_all(folder());
  config_["tie_word_embeddings"] = true;
  write(false, "lm_head.weight");
  load_pretrained_weights(folder(), model_, table_, loaded);
  const ParamSpec& head = table_.find(ParamRole::lm_head);
  const ParamSpec& embedding = table_.find(ParamRole::token_embedding);
  EXPECT_EQ(0, std::memcmp(loaded.data() + head.offset, loaded.data() + embedding.offset,
                           size_t(head.numel) * sizeof(float)));
}

TEST_F(HfFolder, ConfigMismatchNamesFileKeyAndBothValues) {
  config_["intermediate_size"] = 48;
  write();
  const std::string error = load_error(folder(), model_);
  EXPECT_MENTIONS(error, folder() + "/config.json");
  EXPECT_MENTIONS(error, "intermediate_size is 48 but model.d_ff is 32");

  config_["intermediate_size"] = 32;
  config_.erase("num_key_value_heads");  // absent: as many as the attention heads
  write();
  EXPECT_MENTIONS(load_error(folder(), model_),
                  "num_key_value_heads is 4 but model.n_kv_heads is 2");

  config_["num_key_value_heads"] = 2;
  config_["rms_norm_eps"] = 1e-6;
  write();
  EXPECT_MENTIONS(load_error(folder(), model_),
                  "rms_norm_eps is 1e-06 but model.norm_eps is 1e-05");

  // A different RoPE base is allowed (context extension); the weights load.
  config_["rms_norm_eps"] = 1e-5;
  config_["rope_theta"] = 500000.0;
  write();
  EXPECT_EQ(load_error(folder(), model_), "");

  ModelConfig gpt2 = model_;
  gpt2.family = Family::gpt2;
  gpt2.n_kv_heads = 4;
  EXPECT_MENTIONS(load_error(folder(), gpt2), "model.family is gpt2");
}

TEST_F(HfFolder, MissingOrMisshapenTensorIsNamedWithItsFile) {
  write(false, "model.layers.1.mlp.up_proj.weight");
  std::string error = load_error(folder(), model_);
  EXPECT_MENTIONS(error, "model.layers.1.mlp.up_proj.weight");
  EXPECT_MENTIONS(error, folder() + "/model.safetensors");

  fs::remove_all(folder());
  write(false, "lm_head.weight");
  EXPECT_MENTIONS(load_error(folder(), model_), "tie_word_embeddings false");

  fs::remove_all(folder());
  write(true, "model.norm.weight");
  error = load_error(folder(), model_);
  EXPECT_MENTIONS(error, "model.norm.weight");
  EXPECT_MENTIONS(error, "model.safetensors.index.json");

  // Another model's tensor of the same name but another shape.
  ModelConfig wider = model_;
  wider.d_ff = 48;
  ParamTable wider_table(wider);
  std::vector<float> wider_weights = random_weights(wider_table, 4);
  fs::remove_all(folder());
  write();
  SafetensorsWriter mixed;
  for (const ParamSpec& spec : table_.specs()) {
    const ParamSpec& source = spec.role == ParamRole::gate_weight && spec.layer == 0
                                  ? *wider_table.find_by_name(spec.name)
                                  : spec;
    mixed.add(spec.name, source.shape,
              (&source == &spec ? weights_.data() : wider_weights.data()) + source.offset);
  }
  mixed.write(folder() + "/model.safetensors");
  error = load_error(folder(), model_);
  EXPECT_MENTIONS(error, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_MENTIONS(error, "shape [48, 16]");
  EXPECT_MENTIONS(error, folder() + "/model.safetensors");
}

TEST_F(HfFolder, MissingShardOrWeightsFileIsNamed) {
  write(true);
  fs::remove(folder() + "/part-2.safetensors");
  const std::string error = load_error(folder(), model_);
  EXPECT_MENTIONS(error, folder() + "/part-2.safetensors");
  EXPECT_MENTIONS(error, "missing");

  fs::remove(folder() + "/model.safetensors.index.json");
  EXPECT_MENTIONS(load_error(folder(), model_), "neither model.safetensors nor");

  EXPECT_MENTIONS(load_error(dir_.file("nothing"), model_), "does not exist");
  testing::write_text_file(folder() + "/config.json", "{\"hidden_size\": ");
  EXPECT_MENTIONS(load_error(folder(), model_), folder() + "/config.json");
}

// ---- llm.c GPT-2 files ---------------------------------------------------------------------

ModelConfig small_gpt2() {
  ModelConfig m;
  m.family = Family::gpt2;
  m.n_layers = 2;
  m.d_model = 16;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  m.d_ff = 64;
  m.vocab_size = 50;
  m.max_seq_len = 8;
  return m;
}

// llm.c's layout spelled out by name, independently of the importer's role order.
std::vector<float> llmc_payload(const ParamTable& table, const std::vector<float>& weights,
                                int n_layers, int64_t padding_rows, int64_t width) {
  std::vector<float> payload;
  auto append = [&](const std::string& name) {
    const ParamSpec& spec = *table.find_by_name(name);
    payload.insert(payload.end(), weights.begin() + spec.offset,
                   weights.begin() + spec.offset + spec.numel);
  };
  append("transformer.wte.weight");
  payload.resize(payload.size() + size_t(padding_rows * width), 0.0f);
  append("transformer.wpe.weight");
  for (const char* suffix :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (int layer = 0; layer < n_layers; ++layer)
      append("transformer.h." + std::to_string(layer) + "." + suffix);
  append("transformer.ln_f.weight");
  append("transformer.ln_f.bias");
  return payload;
}

class LlmcFile : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = random_weights(table_, 9);
    header_ = {20240326, 3, 8, 50, 2, 4, 16, 128};
    write();
  }
  void write() {
    std::vector<int32_t> header(256, 0);
    std::copy(header_.begin(), header_.end(), header.begin());
    std::vector<float> payload = llmc_payload(table_, weights_, 2, 128 - 50, 16);
    std::ofstream out(path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(payload.data()), std::streamsize(payload.size() * 4));
  }
  std::string path() const { return dir_.file("gpt2.bin"); }

  TempDir dir_;
  ModelConfig model_ = small_gpt2();
  ParamTable table_{model_};
  std::vector<float> weights_;
  std::vector<int32_t> header_;
};

TEST_F(LlmcFile, LoadsBitwiseAndTheExporterWritesTheSameBytes) {
  std::vector<float> loaded;
  load_pretrained_weights(path(), model_, table_, loaded);
  EXPECT_TRUE(bitwise_equal(loaded, weights_));
  // Into folders that do not exist yet: the exporter creates them, as mkdir -p does.
  const std::string exported = dir_.file("exports/gpt2/exported.bin");
  write_llmc(exported, model_, table_, weights_);
  EXPECT_EQ(testing::read_text_file(exported), testing::read_text_file(path()));
}

TEST_F(LlmcFile, BadMagicVersionOrHeaderIsNamed) {
  header_[0] = 20240520;  // a token shard's magic
  write();
  std::string error = load_error(path(), model_);
  EXPECT_MENTIONS(error, path());
  EXPECT_MENTIONS(error, "magic 20240520");

  header_[0] = 20240326;
  header_[1] = 5;
  write();
  error = load_error(path(), model_);
  EXPECT_MENTIONS(error, path());
  EXPECT_MENTIONS(error, "version 5");

  header_[1] = 3;
  header_[6] = 32;
  write();
  error = load_error(path(), model_);
  EXPECT_MENTIONS(error, path());
  EXPECT_MENTIONS(error, "header C is 32 but model.d_model is 16");

  header_[6] = 16;
  header_[7] = 40;
  write();
  EXPECT_MENTIONS(load_error(path(), model_), "Vp 40 is below V 50");

  header_[7] = 128;
  write();
  ModelConfig llama = small_llama();
  EXPECT_MENTIONS(load_error(path(), llama), "model.family is llama");
  ModelConfig wide_mlp = model_;
  wide_mlp.d_ff = 48;
  EXPECT_MENTIONS(load_error(path(), wide_mlp), "model.d_ff is 48");
}

TEST_F(LlmcFile, TruncatedOrOverlongFileIsRefused) {
  const uint64_t full = fs::file_size(path());
  fs::resize_file(path(), full - 4);
  std::string error = load_error(path(), model_);
  EXPECT_MENTIONS(error, path());
  EXPECT_MENTIONS(error, "truncated");

  fs::resize_file(path(), 100);
  error = load_error(path(), model_);
  EXPECT_MENTIONS(error, "truncated");
  EXPECT_MENTIONS(error, "1024-byte header");

  fs::resize_file(path(), 0);
  EXPECT_MENTIONS(load_error(path(), model_), "truncated");

  write();
  fs::resize_file(path(), full + 8);
  EXPECT_MENTIONS(load_error(path(), model_), "8 bytes after the last parameter");
}

// ---- what a checkpoint records about its model -------------------------------------------

TEST(CheckpointModel, RopeThetaAndNormEpsComeFromTrainerStateElseWeightsMetadata) {
  TempDir dir;
  json model = {{"family", "llama"}, {"n_layers", 1}, {"d_model", 8},     {"n_heads", 2},
                {"n_kv_heads", 1},   {"d_ff", 16},    {"vocab_size", 10}, {"max_seq_len", 4}};
  SafetensorsWriter weights;
  const float one = 1.0f;
  weights.add("unused", {1}, &one);
  weights.set_metadata("rope_theta", "250000");
  weights.write(dir.file("model.safetensors"));

  testing::write_text_file(dir.file("trainer_state.json"), json{{"model", model}}.dump());
  CheckpointModel recorded = read_checkpoint_model(dir.path());
  EXPECT_EQ(recorded.model.n_kv_heads, 1);
  EXPECT_EQ(recorded.rope_theta.value_or(0.0), 250000.0);
  EXPECT_FALSE(recorded.norm_eps.has_value());
  EXPECT_EQ(recorded.model.norm_eps, 1e-5);  // the trainer's default

  model["rope_theta"] = 500.0;
  model["norm_eps"] = 1e-6;
  testing::write_text_file(dir.file("trainer_state.json"), json{{"model", model}}.dump());
  recorded = read_checkpoint_model(dir.path());
  EXPECT_EQ(recorded.model.rope_theta, 500.0);
  EXPECT_EQ(recorded.model.norm_eps, 1e-6);

  model["d_model"] = 0;
  testing::write_text_file(dir.file("trainer_state.json"), json{{"model", model}}.dump());
  try {
    read_checkpoint_model(dir.path());
    ADD_FAILURE() << "d_model 0 was accepted";
  } catch (const std::runtime_error& error) {
    EXPECT_MENTIONS(error.what(), "model.d_model is 0");
  }
}

}  // namespace
}  // namespace ulysses
