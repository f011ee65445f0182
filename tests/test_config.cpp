#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, overrides, "config.yaml");
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << yaml;
  return "";
}

std::string world_error(const Config& config, int world) {
  try {
    validate_for_world(config, world);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ConfigError for world " << world;
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One bad config: the message must name the key, the file line and what is allowed.
struct BadConfig {
  std::string kind;
  std::string yaml;
  std::string key;
  int line;
  std::string explains;  // a fragment saying what is wrong or allowed
};

const std::vector<BadConfig> kBadConfigs = {
    {"unknown key in a section", "train:\n  steps: 3\n  lrr: 0.1\n", "train.lrr", 3,
     "did you mean 'train.lr'"},
    {"unknown section", "model:\n  n_layers: 2\ntrian:\n  steps: 3\n", "trian", 3,
     "did you mean 'train'"},
    {"key in the wrong section", "train:\n  vocab_size: 300\n", "train.vocab_size", 2,
     "did you mean 'model.vocab_size'"},
    {"integer expected", "train:\n  steps: abc\n", "train.steps", 2,
     "expected an integer, got 'abc'"},
    {"integer given a fraction", "model:\n  n_layers: 2.5\n", "model.n_layers", 2,
     "expected an integer, got '2.5'"},
    {"length with plan's suffix", "train:\n  seq_len: 32k\n", "train.seq_len", 2,
     "got '32k'; a config takes the number itself: 32768 (as plan reads '32k') or 32000"},
    {"length with plan's m suffix", "model:\n  max_seq_len: 1M\n", "model.max_seq_len", 2,
     "1048576 (as plan reads '1M') or 1000000"},
    {"integer given a list", "train:\n  seq_len: [1, 2]\n", "train.seq_len", 2,
     "expected an integer, got a list"},
    {"number expected", "train:\n  lr: fast\n", "train.lr", 2, "expected a number, got 'fast'"},
    {"boolean expected", "parallel:\n  overlap: maybe\n", "parallel.overlap", 2,
     "expected true or false"},
    {"non-negative seed", "train:\n  seed: -1\n", "train.seed", 2, "non-negative integer"},
    {"string given a map", "data:\n  path: {a: 1}\n", "data.path", 2, "expected a string"},
    {"noncharacter escaped in a string", "data:\n  path: \"a\\uFFFFb\"\n", "data.path", 2,
     "holds U+FFFF, a Unicode noncharacter, which YAML cannot print"},
    {"noncharacter written in a string", "log:\n  metrics_file: m\xef\xbf\xbe.jsonl\n",
     "log.metrics_file", 2, "holds U+FFFE"},
    {"noncharacter of the FDD0 block", "data:\n  path: \"\\uFDEF\"\n", "data.path", 2,
     "holds U+FDEF"},
    {"noncharacter of the last plane", "data:\n  val_path: \"x\\U0010FFFF\"\n", "data.val_path", 2,
     "holds U+10FFFF"},
    {"steps below 1", "train:\n  steps: 0\n", "train.steps", 2, ">= 1, got 0"},
    {"lr not positive", "\ntrain:\n  lr: -0.1\n", "train.lr", 3, "> 0"},
    {"beta1 of 1", "train:\n  beta1: 1.0\n", "train.beta1", 2, "< 1"},
    {"beta2 negative", "train:\n  beta2: -0.5\n", "train.beta2", 2, ">= 0"},
    {"eps zero", "train:\n  eps: 0\n", "train.eps", 2, "> 0"},
    {"batch size zero", "train:\n  batch_size: 0\n", "train.batch_size", 2, ">= 1"},
    {"seq_len of 1", "train:\n  seq_len: 1\n", "train.seq_len", 2, ">= 2"},
    {"negative grad_clip", "train:\n  grad_clip: -1\n", "train.grad_clip", 2, ">= 0"},
    {"negative weight decay", "train:\n  weight_decay: -0.1\n", "train.weight_decay", 2, ">= 0"},
    {"negative warmup", "train:\n  warmup_steps: -5\n", "train.warmup_steps", 2, ">= 0"},
    {"min_lr above lr", "train:\n  lr: 0.001\n  min_lr: 0.01\n", "train.min_lr", 3,
     "train.lr = 0.001 (config.yaml:2)"},
    {"no layers", "model:\n  n_layers: 0\n", "model.n_layers", 2, ">= 1"},
    {"zero d_model", "model:\n  d_model: 0\n", "model.d_model", 2, ">= 1"},
    {"negative loss tile", "memory:\n  loss_tile_tokens: -1\n", "memory.loss_tile_tokens", 2,
     ">= 0"},
    {"auto where 0 resolves nothing", "train:\n  grad_clip: auto\n", "train.grad_clip", 2,
     "expected a number, got 'auto'"},
    {"negative memory limit", "memory:\n  limit_gib: -2\n", "memory.limit_gib", 2,
     "must be 0 or between 1e-06"},
    {"log every zero", "log:\n  every: 0\n", "log.every", 2, ">= 1"},
    {"head chunks zero", "parallel:\n  head_chunks: 0\n", "parallel.head_chunks", 2, ">= 1"},
    {"zero stage 4", "parallel:\n  zero_stage: 4\n", "parallel.zero_stage", 2, "between 0 and 3"},
    {"unknown family", "model:\n  family: lama\n", "model.family", 2, "llama or gpt2"},
    {"unknown device", "device: tpu\n", "device", 1, "cpu or cuda"},
    {"unknown data source", "data:\n  source: csv\n", "data.source", 2,
     "synthetic, text or tokens"},
    {"unknown checkpointing", "memory:\n  activation_checkpointing: full\n",
     "memory.activation_checkpointing", 2, "none or layer"},
    {"unknown attention kernel", "kernels:\n  attention: flash\n", "kernels.attention", 2,
     "native or cudnn"},
    {"cudnn on cpu", "device: cpu\nkernels:\n  attention: cudnn\n", "kernels.attention", 3,
     "device = 'cpu' (config.yaml:1)"},
    {"cudnn with head dim 36",
     "device: cuda\nmodel:\n  d_model: 144\n  n_heads: 4\nkernels:\n  attention: cudnn\n",
     "kernels.attention", 6, "multiple of 8 and at most 128, but it is 36"},
    {"unknown device comm", "parallel:\n  device_comm: gloo\n", "parallel.device_comm", 2,
     "auto, nccl or mpi"},
    {"nccl on cpu", "device: cpu\nparallel:\n  device_comm: nccl\n", "parallel.device_comm", 3,
     "device = 'cpu' (config.yaml:1)"},
    {"d_model not divisible by heads", "model:\n  d_model: 100\n  n_heads: 3\n", "model.d_model", 2,
     "model.n_heads = 3 (config.yaml:3)"},
    {"heads not divisible by kv heads", "model:\n  n_heads: 4\n  n_kv_heads: 3\n",
     "model.n_kv_heads", 3, "1, 2 or 4"},
    {"odd llama head_dim", "model:\n  d_model: 36\n  n_heads: 4\n", "model.d_model", 2, "RoPE"},
    {"gpt2 with grouped kv heads", "model:\n  family: gpt2\n  n_heads: 4\n  n_kv_heads: 2\n",
     "model.n_kv_heads", 4, "gpt2"},
    {"seq_len above max_seq_len", "model:\n  max_seq_len: 128\ntrain:\n  seq_len: 256\n",
     "train.seq_len", 4, "model.max_seq_len = 128 (config.yaml:2)"},
    {"vocabulary too small for the task", "model:\n  vocab_size: 50\n", "model.vocab_size", 2,
     "83"},
    {"text without a path", "data:\n  source: text\n", "data.path", 2, "data.source = 'text'"},
    {"tokens without a vocabulary", "data:\n  source: tokens\n  path: shards/*.bin\n",
     "model.vocab_size", 2, "required"},
    {"more queries than pairs", "data:\n  n_pairs: 2\n  n_queries: 3\n", "data.n_queries", 3,
     "data.n_pairs = 2 (config.yaml:2)"},
    {"sequence too short for the task", "train:\n  seq_len: 16\n", "train.seq_len", 2,
     "too short for the synthetic task: BOS + 3 tokens for each of data.n_pairs = 4 (default) and "
     "data.n_queries = 4 (default), which need 25"},
    {"sequence too short for its documents",
     "train:\n  seq_len: 64\ndata:\n  documents: eos\n  documents_per_sequence: 3\n",
     "train.seq_len", 2, "too short for 3 synthetic documents (data.documents_per_sequence)"},
    {"curriculum stage too short for its documents",
     "train:\n  seq_len: 128\n  seq_len_schedule: '64@0, 128@5'\ndata:\n  documents: eos\n"
     "  documents_per_sequence: 3\n",
     "train.seq_len_schedule", 3, "the first stage's length 64 is too short for 3 synthetic"},
    {"val_fraction of 1", "data:\n  val_fraction: 1\n", "data.val_fraction", 2, "< 1"},
    {"section that is not a map", "model:\n  n_layers: 2\ntrain: 5\n", "train", 3,
     "expected a map"},
    {"key given twice", "train:\n  steps: 3\n  steps: 4\n", "train.steps", 3, "given twice"},
    {"integer above its type", "train:\n  seq_len: 1000000000000\n", "train.seq_len", 2,
     "1000000000000 is out of range; the largest allowed is 2147483647"},
    {"integer below its type", "train:\n  steps: -99999999999\n", "train.steps", 2,
     "the smallest allowed is -2147483648"},
    {"tiny memory limit", "memory:\n  limit_gib: 1e-12\n", "memory.limit_gib", 2,
     "must be 0 or between 1e-06 and 1073741824, got 1e-12"},
    {"huge memory limit", "memory:\n  limit_gib: 1e30\n", "memory.limit_gib", 2,
     "and 1073741824, got 1e+30"},
    {"unknown non-finite policy", "train:\n  on_nonfinite: ignore\n", "train.on_nonfinite", 2,
     "abort or skip"},
    {"no skips allowed", "train:\n  max_skipped_steps: 0\n", "train.max_skipped_steps", 2, ">= 1"},
    {"tiled mlp of yes", "memory:\n  tiled_mlp: true\n", "memory.tiled_mlp", 2,
     "use false, auto or a tile count"},
    {"tiled mlp of no tiles", "memory:\n  tiled_mlp: 0\n", "memory.tiled_mlp", 2,
     "use false, auto or a tile count >= 1"},
    {"offload without checkpointing", "memory:\n  offload_checkpoints: true\n",
     "memory.offload_checkpoints", 2, "memory.activation_checkpointing = 'none'"},
    {"no traced steps", "log:\n  trace_steps: 0\n", "log.trace_steps", 2, ">= 1"},
    {"negative watchdog timeout", "parallel:\n  timeout_s: -1\n", "parallel.timeout_s", 2,
     "must be 0 or >= 1, got -1"},
    {"watchdog timeout below a second", "parallel:\n  timeout_s: 1e-9\n", "parallel.timeout_s", 2,
     "must be 0 or >= 1, got 1e-09"},
    {"bucket beyond int64 elements", "parallel:\n  bucket_mb: 1e300\n", "parallel.bucket_mb", 2,
     "<= 1e+09, got 1e+300"},
    {"beta2 that is 1 in fp32", "train:\n  beta2: 0.99999999\n", "train.beta2", 2,
     "0.99999999 is 1 in fp32, which training computes in; must be >= 0 and < 1 there (at most "
     "0.99999994)"},
    {"beta1 that is 1 in fp32", "train:\n  beta1: 0.999999999\n", "train.beta1", 2, "is 1 in fp32"},
    {"eps that is 0 in fp32", "train:\n  eps: 1e-46\n", "train.eps", 2,
     "1e-46 is below 1.1754944e-38, the smallest normal number in fp32"},
    {"eps that is subnormal in fp32", "train:\n  eps: 1e-40\n", "train.eps", 2,
     "below 1.1754944e-38"},
    {"lr that is infinite in fp32", "train:\n  lr: 1e39\n", "train.lr", 2,
     "1e+39 is above 3.4028235e+38, the largest number in fp32"},
    {"norm eps that is 0 in fp32", "model:\n  norm_eps: 1e-50\n", "model.norm_eps", 2,
     "smallest normal number in fp32"},
    {"schedule stage batch above int", "train:\n  seq_len_schedule: \"8x99999999999@0, 256@1\"\n",
     "train.seq_len_schedule", 2, "has batch 99999999999, above 2147483647"},
    {"schedule number above int64",
     "train:\n  seq_len_schedule: \"8x99999999999999999999@0, 256@1\"\n", "train.seq_len_schedule",
     2, "holds a number above 9223372036854775807"},
    {"schedule stage of one token", "train:\n  seq_len_schedule: \"1@0, 256@1\"\n",
     "train.seq_len_schedule", 2, "has length 1; a length is at least 2 tokens"},
    {"model too wide", "model:\n  d_model: 1073741824\n  n_heads: 4\n  d_ff: 64\n", "model.d_model",
     2, "supports at most 2^40"},
    {"model too deep", "model:\n  n_layers: 2147483647\n", "model.n_layers", 2,
     "above the 100000 layers"},
    {"activations beyond a PiB",
     "model:\n  max_seq_len: 2000000000\ntrain:\n  seq_len: 2000000000\n  batch_size: "
     "2000000\n",
     "train.seq_len", 4, "would exceed 1 PiB"},
    {"a stage's activations beyond a PiB",
     "train:\n  seq_len: 65536\n  seq_len_schedule: \"32768x2147483647@0, 65536@1\"\n",
     "train.seq_len_schedule", 3, "the stage from step 0, 2147483647 sequences of 32768 tokens"},
};

TEST(Config, EveryKindOfBadConfigNamesTheKeyLineAndWhatIsAllowed) {
  for (const BadConfig& bad : kBadConfigs) {
    std::string message = config_error(bad.yaml);
    EXPECT_TRUE(contains(message, bad.key)) << bad.kind << ": " << message;
    EXPECT_TRUE(contains(message, "config.yaml:" + std::to_string(bad.line)))
        << bad.kind << ": " << message;
    EXPECT_TRUE(contains(message, bad.explains)) << bad.kind << ": " << message;
  }
}

TEST(Config, InvalidYamlReportsTheParserLine) {
  std::string message = config_error("train:\n  steps: 3\n  lr: [0.1, 0.2\n");
  EXPECT_TRUE(contains(message, "invalid YAML")) << message;
  EXPECT_TRUE(contains(message, "config.yaml:")) << message;
  message = config_error("- one\n- two\n");
  EXPECT_TRUE(contains(message, "config.yaml:1")) << message;
  EXPECT_TRUE(contains(message, "map of sections")) << message;
}

TEST(Config, MissingFileIsAConfigError) {
  try {
    load_config("/nonexistent/run.yaml", {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(contains(error.what(), "'/nonexistent/run.yaml' does not exist")) << error.what();
  }
}

std::string load_error(const std::string& path) {
  try {
    load_config(path, {});
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << path;
  return "";
}

// A FIFO with no writer used to block the read forever; a link loop was "does not exist".
TEST(Config, AConfigThatIsNotARegularFileIsRefusedWithoutBlocking) {
  testing::TempDir dir;
  ASSERT_EQ(mkfifo(dir.file("fifo.yaml").c_str(), 0600), 0);
  EXPECT_TRUE(
      contains(load_error(dir.file("fifo.yaml")),
               "'" + dir.file("fifo.yaml") + "' is a FIFO (named pipe), not a regular file"));
  std::filesystem::create_symlink("loop.yaml", dir.file("loop.yaml"));
  EXPECT_TRUE(contains(load_error(dir.file("loop.yaml")), "is a symbolic link loop"));
  EXPECT_TRUE(contains(load_error("/dev/null"), "'/dev/null' is a character device"));
  EXPECT_TRUE(contains(load_error(dir.path()), "is a folder; --config takes a YAML file"));
}

TEST(Config, AConfigThatSetsNoKeyWarnsButAnyKeyDoesNot) {
  std::vector<std::string> warnings;
  parse_config("# nothing here\n", {"train.steps=3"}, "empty.yaml", &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(contains(warnings[0], "empty.yaml: the config sets no keys")) << warnings[0];
  EXPECT_TRUE(contains(warnings[0], "100 steps of a 2-layer llama model")) << warnings[0];
  warnings.clear();
  parse_config("model:\n", {}, "sections.yaml", &warnings);
  EXPECT_EQ(warnings.size(), 1u);
  warnings.clear();
  parse_config("train:\n  steps: 3\n", {}, "run.yaml", &warnings);
  EXPECT_TRUE(warnings.empty());
}

// The fp32 rule refuses only what fp32 cannot hold: the largest beta below 1 and the smallest
// normal eps are accepted.
TEST(Config, Fp32EdgesThatHoldAreAccepted) {
  const Config config = parse_config("train:\n  beta2: 0.99999994\n  eps: 1.2e-38\n", {}, "c.yaml");
  EXPECT_LT(float(config.train.beta2), 1.0f);
  EXPECT_GT(float(config.train.eps), 0.0f);
  EXPECT_EQ(parse_config("parallel:\n  timeout_s: 1\n", {}, "c.yaml").parallel.timeout_s, 1.0);
}

TEST(Config, LoadsAFileAndNamesItInErrors) {
  testing::TempDir dir;
  testing::write_text_file(dir.file("run.yaml"), "train:\n  steps: 7\n");
  EXPECT_EQ(load_config(dir.file("run.yaml"), {}).train.steps, 7);
  testing::write_text_file(dir.file("bad.yaml"), "train:\n  steps: 7\n  lr: 0\n");
  try {
    load_config(dir.file("bad.yaml"), {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(contains(error.what(), dir.file("bad.yaml") + ":3: train.lr")) << error.what();
  }
}

TEST(Config, EmptyConfigGivesTheDefaults) {
  Config config = parse_config("", {}, "empty.yaml");
  Config defaults;
  EXPECT_EQ(name_of(config.device), "cpu");
  EXPECT_EQ(config.train.steps, defaults.train.steps);
  EXPECT_EQ(config.train.lr, defaults.train.lr);
  EXPECT_EQ(name_of(config.data.source), "synthetic");
  EXPECT_EQ(config.parallel.sp, 1);
}

TEST(Config, OverridesAreParsedAsYamlAndWinOverTheFile) {
  Config config =
      parse_config("train:\n  lr: 0.1\n  steps: 10\n",
                   {"train.lr=1e-3", "data.source=text", "data.path=corpus/*.txt",
                    "parallel.bucket_mb=8", "train.checkpoint.dir=ckpt", "model.n_layers=3"},
                   "config.yaml");
  EXPECT_DOUBLE_EQ(config.train.lr, 1e-3);
  EXPECT_EQ(config.train.steps, 10);
  EXPECT_EQ(name_of(config.data.source), "text");
  EXPECT_EQ(config.data.path, "corpus/*.txt");
  EXPECT_DOUBLE_EQ(config.parallel.bucket_mb, 8.0);
  EXPECT_EQ(config.train.checkpoint.dir, "ckpt");
  EXPECT_EQ(config.model.n_layers, 3);
  EXPECT_EQ(config.model.vocab_size, 257);  // resolved after the override of data.source
}

TEST(Config, BadOverridesNameTheOverride) {
  std::string message = config_error("", {"train.lrr=1"});
  EXPECT_TRUE(contains(message, "override 'train.lrr=1'")) << message;
  EXPECT_TRUE(contains(message, "did you mean 'train.lr'")) << message;

  message = config_error("", {"train.lr"});
  EXPECT_TRUE(contains(message, "override 'train.lr'")) << message;
  EXPECT_TRUE(contains(message, "key=value")) << message;

  message = config_error("", {"train.steps=abc"});
  EXPECT_TRUE(contains(message, "override 'train.steps=abc'")) << message;
  EXPECT_TRUE(contains(message, "train.steps: expected an integer, got 'abc'")) << message;

  message = config_error("", {"train=3"});
  EXPECT_TRUE(contains(message, "override 'train=3'")) << message;
  EXPECT_TRUE(contains(message, "section")) << message;

  message = config_error("", {"train.lr=[1"});
  EXPECT_TRUE(contains(message, "override 'train.lr=[1'")) << message;

  message = config_error("model:\n  n_heads: 4\n", {"model.d_model=30"});
  EXPECT_TRUE(contains(message, "override 'model.d_model=30': model.d_model")) << message;
  EXPECT_TRUE(contains(message, "config.yaml:2")) << message;
}

TEST(Config, DefaultsThatDependOnOtherKeys) {
  Config llama =
      parse_config("model:\n  d_model: 64\n  n_heads: 4\ntrain:\n  seq_len: 512\n", {}, "c.yaml");
  EXPECT_EQ(llama.model.n_kv_heads, 4);
  EXPECT_EQ(llama.model.d_ff, 192);  // ceil(8·64/3) = 171, rounded up to a multiple of 32
  EXPECT_EQ(llama.model.max_seq_len, 512);
  EXPECT_EQ(llama.model.vocab_size, 3 + 16 + 32 + 32);

  Config llama96 = parse_config("model:\n  d_model: 96\n", {}, "c.yaml");
  EXPECT_EQ(llama96.model.d_ff, 256);

  Config gpt2 = parse_config("model:\n  family: gpt2\n  d_model: 48\n  n_heads: 4\n", {}, "c.yaml");
  EXPECT_EQ(gpt2.model.d_ff, 192);
  EXPECT_EQ(gpt2.model.n_kv_heads, 4);

  Config text = parse_config("data:\n  source: text\n  path: x.txt\n", {}, "c.yaml");
  EXPECT_EQ(text.model.vocab_size, 257);

  Config explicit_values = parse_config(
      "model:\n  n_heads: 8\n  n_kv_heads: 2\n  d_ff: 100\n  vocab_size: 1000\n  "
      "max_seq_len: 4096\n",
      {}, "c.yaml");
  EXPECT_EQ(explicit_values.model.n_kv_heads, 2);
  EXPECT_EQ(explicit_values.model.d_ff, 100);
  EXPECT_EQ(explicit_values.model.vocab_size, 1000);
  EXPECT_EQ(explicit_values.model.max_seq_len, 4096);
}

TEST(Config, AutoSpellsTheZeroThatAKeyResolves) {
  Config config =
      parse_config("model:\n  n_heads: 8\n  n_kv_heads: auto\nmemory:\n  loss_tile_tokens: auto\n",
                   {}, "c.yaml");
  EXPECT_EQ(config.model.n_kv_heads, 8);
  EXPECT_EQ(config.memory.loss_tile_tokens, 0);
  EXPECT_EQ(parse_config("", {"memory.loss_tile_tokens=auto"}, "c.yaml").memory.loss_tile_tokens,
            0);
  EXPECT_EQ(parse_config("", {"memory.loss_tile_tokens=512"}, "c.yaml").memory.loss_tile_tokens,
            512);
}

TEST(Config, ResolvedYamlParsesBackToTheSameConfig) {
  const std::string yaml = R"(device: cpu
model:
  family: llama
  n_layers: 3
  d_model: 128
  n_heads: 8
  n_kv_heads: 2
  vocab_size: 300
  rope_theta: 500000
  norm_eps: 1e-6
train:
  steps: 50
  batch_size: 2
  seq_len: 1024
  grad_accum: 2
  lr: 0.0003
  min_lr: 3e-5
  warmup_steps: 10
  weight_decay: 0.1
  beta1: 0.8
  beta2: 0.99
  eps: 1e-10
  grad_clip: 0.5
  seed: 18446744073709551615
  eval_every: 10
  eval_steps: 2
  checkpoint:
    dir: "runs/ckpt: one"
    every: 25
    keep_last: 2
data:
  source: text
  path: corpus/*.txt
  val_path: ""
  val_fraction: 0.1
parallel:
  sp: 4
  zero_stage: 0
  head_chunks: 1
  overlap: false
  bucket_mb: 12.5
memory:
  activation_checkpointing: none
  tiled_mlp: false
  loss_tile_tokens: 128
  limit_gib: 1.5
log:
  every: 5
  metrics_file: metrics.jsonl
  trace_file: trace.json
  trace_steps: 3
  verdict_every: 50
)";
  Config c = parse_config(yaml, {}, "round.yaml");
  std::string resolved = config_to_yaml(c);
  Config back = parse_config(resolved, {}, "resolved.yaml");
  EXPECT_EQ(config_to_yaml(back), resolved);

  EXPECT_EQ(back.device, c.device);
  EXPECT_EQ(name_of(back.model.family), "llama");
  EXPECT_EQ(back.model.n_layers, 3);
  EXPECT_EQ(back.model.d_model, 128);
  EXPECT_EQ(back.model.n_heads, 8);
  EXPECT_EQ(back.model.n_kv_heads, 2);
  EXPECT_EQ(back.model.d_ff, c.model.d_ff);
  EXPECT_EQ(back.model.vocab_size, 300);
  EXPECT_EQ(back.model.max_seq_len, 1024);
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  EXPECT_EQ(back.model.norm_eps, 1e-6);
  EXPECT_EQ(back.train.steps, 50);
  EXPECT_EQ(back.train.batch_size, 2);
  EXPECT_EQ(back.train.seq_len, 1024);
  EXPECT_EQ(back.train.grad_accum, 2);
  EXPECT_EQ(back.train.lr, 0.0003);
  EXPECT_EQ(back.train.min_lr, 3e-5);
  EXPECT_EQ(back.train.warmup_steps, 10);
  EXPECT_EQ(back.train.weight_decay, 0.1);
  EXPECT_EQ(back.train.beta1, 0.8);
  EXPECT_EQ(back.train.beta2, 0.99);
  EXPECT_EQ(back.train.eps, 1e-10);
  EXPECT_EQ(back.train.grad_clip, 0.5);
  EXPECT_EQ(back.train.seed, 18446744073709551615ull);
  EXPECT_EQ(back.train.eval_every, 10);
  EXPECT_EQ(back.train.eval_steps, 2);
  EXPECT_EQ(back.train.checkpoint.dir, "runs/ckpt: one");
  EXPECT_EQ(back.train.checkpoint.every, 25);
  EXPECT_EQ(back.train.checkpoint.keep_last, 2);
  EXPECT_EQ(name_of(back.data.source), "text");
  EXPECT_EQ(back.data.path, "corpus/*.txt");
  EXPECT_EQ(back.data.val_path, "");
  EXPECT_EQ(back.data.val_fraction, 0.1);
  EXPECT_EQ(back.parallel.sp, 4);
  EXPECT_EQ(back.parallel.zero_stage, 0);
  EXPECT_EQ(back.parallel.head_chunks, 1);
  EXPECT_FALSE(back.parallel.overlap);
  EXPECT_EQ(back.parallel.bucket_mb, 12.5);
  EXPECT_EQ(name_of(back.memory.activation_checkpointing), "none");
  EXPECT_EQ(tiled_mlp_text(back.memory.tiled_mlp), "false");
  EXPECT_EQ(back.memory.loss_tile_tokens, 128);
  EXPECT_EQ(back.memory.limit_gib, 1.5);
  EXPECT_EQ(name_of(back.kernels.attention), "auto");
  EXPECT_EQ(back.log.every, 5);
  EXPECT_EQ(back.log.metrics_file, "metrics.jsonl");
  EXPECT_EQ(back.log.trace_file, "trace.json");
  EXPECT_EQ(back.log.trace_steps, 3);
  EXPECT_EQ(back.log.verdict_every, 50);
}

TEST(Config, ResolvedYamlListsEveryKey) {
  std::string resolved = config_to_yaml(parse_config("", {}, "c.yaml"));
  for (const char* key :
       {"device:",           "family:",      "n_kv_heads:",   "d_ff:",
        "vocab_size:",       "max_seq_len:", "rope_theta:",   "init_from:",
        "checkpoint:",       "keep_last:",   "source:",       "val_fraction:",
        "plant_fraction:",   "head_chunks:", "bucket_mb:",    "activation_checkpointing:",
        "loss_tile_tokens:", "attention:",   "metrics_file:", "trace_file:"}) {
    EXPECT_TRUE(contains(resolved, key)) << key << " missing from:\n" << resolved;
  }
}

Config config_with(const std::string& yaml) {
  return parse_config(yaml, {}, "c.yaml");
}

TEST(ValidateForWorld, SpMustDivideTheWorld) {
  Config config = config_with(
      "parallel:\n  sp: 3\nmodel:\n  n_heads: 6\n  d_model: 48\n"
      "train:\n  seq_len: 96\n");
  EXPECT_EQ(world_error(config, 4),
            "parallel.sp=3 does not divide the 4 ranks of the job; sp can be 1, 2 or 4 "
            "(--set parallel.sp=...), or start a multiple of 3 ranks (mpirun -np 3)");
  EXPECT_NO_THROW(validate_for_world(config, 6));
}

TEST(ValidateForWorld, SpMustDivideTheHeads) {
  Config config = config_with("parallel:\n  sp: 8\nmodel:\n  n_heads: 12\n  d_model: 96\n");
  EXPECT_EQ(world_error(config, 8),
            "model.n_heads=12 is not divisible by parallel.sp=8; sp can be 1, 2, 3, 4, 6 or 12");
}

TEST(ValidateForWorld, KvHeadsAreSplitOrReplicatedOrRefused) {
  Config split = config_with("parallel:\n  sp: 2\nmodel:\n  n_heads: 8\n  n_kv_heads: 4\n");
  EXPECT_NO_THROW(validate_for_world(split, 2));
  Config replicated = config_with("parallel:\n  sp: 4\nmodel:\n  n_heads: 8\n  n_kv_heads: 2\n");
  EXPECT_NO_THROW(validate_for_world(replicated, 4));
  Config refused =
      config_with("parallel:\n  sp: 2\nmodel:\n  n_heads: 6\n  n_kv_heads: 3\n  d_model: 48\n");
  std::string message = world_error(refused, 2);
  EXPECT_TRUE(contains(message, "model.n_kv_heads=3")) << message;
  EXPECT_TRUE(contains(message, "parallel.sp=2")) << message;
  // The sp values that work on these ranks: they divide the 6 heads and the 6 ranks and
  // split (1, 3) or replicate (6) the 3 kv heads.
  message = world_error(refused, 6);
  EXPECT_TRUE(contains(message, "on 6 ranks sp can be 1, 3 or 6")) << message;
}

TEST(ValidateForWorld, CudnnIsRefusedWithDocumentsOrPadding) {
  EXPECT_NE(config_error("device: cuda\ndata:\n  documents: eos\nkernels:\n  attention: cudnn\n")
                .find("kernels.attention: cudnn cannot mask packed documents"),
            std::string::npos);
  Config padded = config_with(
      "device: cuda\nparallel:\n  sp: 4\ntrain:\n  seq_len: 250\nkernels:\n  attention: cudnn\n");
  EXPECT_NE(world_error(padded, 4).find("kernels.attention: cudnn cannot mask the padding of "
                                        "train.seq_len=250"),
            std::string::npos);
  EXPECT_TRUE(attention_has_documents(padded));
  padded.train.seq_len = 256;
  EXPECT_FALSE(attention_has_documents(padded));
  EXPECT_NO_THROW(validate_for_world(padded, 4));
  // With ring 4 the zigzag's 8 chunks pad 260 (which sp 4 divides) to 264.
  padded.parallel.ring = 4;
  padded.train.seq_len = 260;
  EXPECT_TRUE(attention_has_documents(padded));
  const std::string message = world_error(padded, 4);
  EXPECT_TRUE(contains(message, "on parallel.sp=4 with parallel.ring=4; use a multiple of 8"))
      << message;
}

TEST(ValidateForWorld, AnySeqLenIsAcceptedOnAnySp) {
  // A length sp does not divide is padded (docs/parallelism.md, "Any length under any sp").
  Config config = config_with("parallel:\n  sp: 4\ntrain:\n  seq_len: 250\n");
  EXPECT_NO_THROW(validate_for_world(config, 4));
  // With a ring too: also padded to a multiple of 2·ring, the zigzag's chunks.
  config.parallel.ring = 4;
  config.train.seq_len = 57;
  EXPECT_NO_THROW(validate_for_world(config, 4));
  EXPECT_TRUE(has_padding(config));
  config.train.seq_len = 64;
  EXPECT_FALSE(has_padding(config));
}

TEST(ValidateForWorld, HeadChunksMustSplitEachRanksHeadsIntoWholeStages) {
  Config config = config_with("parallel:\n  sp: 2\n  head_chunks: 3\nmodel:\n  n_heads: 8\n");
  std::string message = world_error(config, 2);
  EXPECT_TRUE(contains(message, "parallel.head_chunks=3 does not divide the 4 heads per rank"))
      << message;
  EXPECT_TRUE(contains(message, "1, 2 or 4")) << message;
  config.parallel.head_chunks = 4;
  EXPECT_NO_THROW(validate_for_world(config, 4));
  // 24 heads in groups of 6 per kv head, 12 per rank: stages of 4 heads would straddle groups.
  Config gqa = config_with(
      "parallel:\n  sp: 2\n  head_chunks: 3\nmodel:\n  n_heads: 24\n  n_kv_heads: 4\n  "
      "d_model: 96\n");
  message = world_error(gqa, 2);
  EXPECT_TRUE(contains(message, "stages of 4, which neither hold whole groups of the 6"))
      << message;
  EXPECT_TRUE(contains(message, "head_chunks can be 1, 2, 4, 6 or 12")) << message;
}

TEST(Config, AFolderGivenAsTheConfigIsRefused) {
  testing::TempDir dir;
  try {
    load_config(dir.path(), {});
    ADD_FAILURE() << "a folder was accepted as a config";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(contains(error.what(), dir.path() + ": is a folder")) << error.what();
  }
}

TEST(Config, ASecondYamlDocumentIsRefusedNotIgnored) {
  std::string message = config_error("train:\n  steps: 3\n---\ntrain:\n  steps: 9\n");
  EXPECT_TRUE(contains(message, "config.yaml:4")) << message;
  EXPECT_TRUE(contains(message, "2 YAML documents")) << message;
  // A lone document marker at either end is still one document.
  EXPECT_EQ(parse_config("---\ntrain:\n  steps: 3\n...\n", {}, "c.yaml").train.steps, 3);
}

TEST(Config, ReliabilityKeysHaveSafeDefaults) {
  Config config = parse_config("", {}, "c.yaml");
  EXPECT_EQ(name_of(config.train.on_nonfinite), "abort");
  EXPECT_EQ(config.train.max_skipped_steps, 8);
  EXPECT_FALSE(config.train.checkpoint.overwrite);
  EXPECT_EQ(config.parallel.timeout_s, 600.0);
  EXPECT_EQ(parse_config("parallel:\n  timeout_s: 0\n", {}, "c.yaml").parallel.timeout_s, 0.0);
}

// Each spelling of a fixed-choice key is read into its enum and printed back as given (the
// YAML of --dry-run and checkpoints), with the other keys its rules between keys need.
TEST(Config, EveryChoiceReadsAndPrintsBackItsSpelling) {
  struct Choices {
    std::string key;
    std::vector<std::string> names;
    std::vector<std::string> needs;
  };
  const std::vector<std::string> cuda = {"device=cuda", "model.d_model=256"};
  const std::vector<Choices> keys = {
      {"device", kDeviceNames, {}},
      {"model.family", kFamilyNames, {}},
      {"train.schedule", kLrScheduleNames, {}},
      {"train.on_nonfinite", kOnNonfiniteNames, {}},
      {"data.source", kDataSourceNames, {"data.path=corpus/", "model.vocab_size=300"}},
      {"data.order", kDataOrderNames, {}},
      {"parallel.device_comm", kDeviceCommNames, cuda},
      {"parallel.progress_thread", kProgressThreadSettingNames, {}},
      {"memory.activation_checkpointing", kActivationCheckpointingNames, {}},
      {"kernels.attention", kAttentionKernelNames, cuda},
  };
  for (const Choices& choices : keys) {
    for (const std::string& name : choices.names) {
      std::vector<std::string> overrides = choices.needs;
      overrides.push_back(choices.key + "=" + name);
      const std::vector<std::string> lines =
          config_key_values(parse_config("", overrides, "c.yaml"));
      EXPECT_TRUE(std::find(lines.begin(), lines.end(), choices.key + "=" + name) != lines.end())
          << choices.key << "=" << name;
    }
  }
}

TEST(Config, KeyValuesListEveryResolvedKeyOnce) {
  const std::vector<std::string> lines = config_key_values(parse_config("", {}, "c.yaml"));
  EXPECT_TRUE(std::find(lines.begin(), lines.end(), "model.n_kv_heads=4") != lines.end());
  EXPECT_TRUE(std::find(lines.begin(), lines.end(), "train.on_nonfinite=abort") != lines.end());
  std::vector<std::string> keys;
  for (const std::string& line : lines) keys.push_back(line.substr(0, line.find('=')));
  std::sort(keys.begin(), keys.end());
  EXPECT_TRUE(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
}

TEST(Config, EveryZeroStageIsAccepted) {
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_EQ(parse_config("parallel:\n  zero_stage: " + std::to_string(stage) + "\n", {}, "c.yaml")
                  .parallel.zero_stage,
              stage);
}

TEST(Config, MlpTilesFollowTheSetting) {
  MemoryConfig memory;
  EXPECT_EQ(mlp_tiles(memory, 1000, 64, 176, 3), 1);
  memory.tiled_mlp = {TiledMlp::Mode::tiles, 4};
  EXPECT_EQ(mlp_tiles(memory, 1000, 64, 176, 3), 4);
  EXPECT_EQ(mlp_tiles(memory, 3, 64, 176, 3), 3);  // never more tiles than rows
  memory.tiled_mlp = {TiledMlp::Mode::automatic,
                      0};  // 3 intermediates of 176 per row against 64: ceil(8.25)
  EXPECT_EQ(mlp_tiles(memory, 1000, 64, 176, 3), 9);
  EXPECT_EQ(mlp_tiles(memory, 1000, 64, 256, 2), 8);
}

TEST(Config, OffloadIsAcceptedOnCudaAndNeedsLayerCheckpointing) {
  EXPECT_NO_THROW(parse_config(
      "device: cuda\nmemory:\n  activation_checkpointing: layer\n  offload_checkpoints: true\n", {},
      "c.yaml"));
  const std::string message = config_error("device: cuda\nmemory:\n  offload_checkpoints: true\n");
  EXPECT_TRUE(contains(message, "offloads the layer inputs that layer checkpointing keeps"))
      << message;
}

// Ring attention runs on cuda through staged point to point; NCCL has none here.
TEST(Config, RingIsAcceptedOnCudaButNotOverNccl) {
  EXPECT_NO_THROW(parse_config("device: cuda\nparallel:\n  sp: 4\n  ring: 2\n", {}, "c.yaml"));
  const std::string message =
      config_error("device: cuda\nparallel:\n  sp: 4\n  ring: 2\n  device_comm: nccl\n");
  EXPECT_TRUE(contains(message, "nccl has no point to point here, which parallel.ring > 1 needs"))
      << message;
}

}  // namespace
}  // namespace ulysses
