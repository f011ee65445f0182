// The resolved configuration of a run: one struct per YAML section (docs/configuration.md).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config/config_error.h"
#include "data/data_config.h"
#include "kernels/backend.h"
#include "parallel/device_comm.h"

namespace ulysses {

// Options with a fixed set of values are enums, parsed once by the config loader. Each has
// its YAML spellings in the enum's order: names_of lists them (the config table reads an
// enum key through it), name_of gives one (messages, logs and --dry-run).
// The enums of the lower layers' choices are theirs (kernels/backend.h,
// parallel/device_comm.h); the config only names them.
using Device = BackendKind;
inline const std::vector<std::string> kDeviceNames = {"cpu", "cuda"};
inline const std::string& name_of(Device value) {
  return kDeviceNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(Device) {
  return kDeviceNames;
}

enum class Family { llama, gpt2 };
inline const std::vector<std::string> kFamilyNames = {"llama", "gpt2"};
inline const std::string& name_of(Family value) {
  return kFamilyNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(Family) {
  return kFamilyNames;
}

enum class LrSchedule { cosine, linear, constant };
inline const std::vector<std::string> kLrScheduleNames = {"cosine", "linear", "constant"};
inline const std::string& name_of(LrSchedule value) {
  return kLrScheduleNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(LrSchedule) {
  return kLrScheduleNames;
}

enum class OnNonfinite { abort, skip };
inline const std::vector<std::string> kOnNonfiniteNames = {"abort", "skip"};
inline const std::string& name_of(OnNonfinite value) {
  return kOnNonfiniteNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(OnNonfinite) {
  return kOnNonfiniteNames;
}

inline const std::vector<std::string> kDeviceCommNames = {"auto", "nccl", "mpi"};
inline const std::string& name_of(DeviceComm value) {
  return kDeviceCommNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(DeviceComm) {
  return kDeviceCommNames;
}

// Named apart from ProgressThread, the thread itself (parallel/progress_thread.h).
enum class ProgressThreadSetting { automatic, on, off };
inline const std::vector<std::string> kProgressThreadSettingNames = {"auto", "on", "off"};
inline const std::string& name_of(ProgressThreadSetting value) {
  return kProgressThreadSettingNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(ProgressThreadSetting) {
  return kProgressThreadSettingNames;
}

enum class ActivationCheckpointing { none, layer };
inline const std::vector<std::string> kActivationCheckpointingNames = {"none", "layer"};
inline const std::string& name_of(ActivationCheckpointing value) {
  return kActivationCheckpointingNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(ActivationCheckpointing) {
  return kActivationCheckpointingNames;
}

inline const std::vector<std::string> kAttentionKernelNames = {"auto", "native", "cudnn"};
inline const std::string& name_of(AttentionKernel value) {
  return kAttentionKernelNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(AttentionKernel) {
  return kAttentionKernelNames;
}

// What the model code branches on: a family is one row of the table in core/config/config.cpp
// (architecture()), so adding a family is that row plus its kernels and parameter names
// (docs/design.md).
enum class NormKind { rms, layer };         // RMSNorm, or LayerNorm with a bias
enum class MlpKind { swiglu, gelu };        // down(SiLU(gate)·up), or proj(GELU(fc))
enum class PositionKind { rope, learned };  // rotary q and k, or a learned position embedding
struct Architecture {
  NormKind norm;
  MlpKind mlp;
  PositionKind positions;
  bool biases;         // every linear layer has a bias
  bool tied_head;      // the LM head is the token embedding
  bool grouped_query;  // n_kv_heads may be below n_heads
};
const Architecture& architecture(Family family);

struct ModelConfig {
  Family family = Family::llama;
  int n_layers = 2;
  int d_model = 64;
  int n_heads = 4;
  int n_kv_heads = 0;   // 0 = n_heads
  int d_ff = 0;         // 0 = family default (llama: 8/3·d rounded to 32; gpt2: 4·d)
  int vocab_size = 0;   // 0 = taken from the data source
  int max_seq_len = 0;  // 0 = train.seq_len
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  std::string init_from;  // pretrained weights to start from (docs/checkpoints.md)

  int head_dim() const { return d_model / n_heads; }
};

struct CheckpointConfig {
  std::string dir;         // empty = no checkpoints
  int every = 0;           // steps; 0 = only at the end
  int keep_last = 0;       // 0 = keep all
  bool overwrite = false;  // a fresh run may replace the checkpoints already in dir
};

struct TrainConfig {
  int steps = 100;
  int batch_size = 1;  // sequences per data-parallel rank per micro-step
  int seq_len = 256;
  // A sequence-length curriculum ending at seq_len, "256@0, 4096@500"
  // (core/config/seq_len_schedule.h); empty = seq_len throughout.
  std::string seq_len_schedule;
  int grad_accum = 1;
  double lr = 3e-3;
  double min_lr = 0.0;
  int warmup_steps = 0;
  // After the warmup: cosine or linear decay to min_lr at the last step, or constant lr.
  LrSchedule schedule = LrSchedule::cosine;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 = no clipping
  uint64_t seed = 1234;
  int eval_every = 0;  // 0 = no periodic eval
  int eval_steps = 4;  // batches per eval
  // A NaN or infinite loss or gradient norm, or a spike: abort (exit 3) or skip the update,
  // up to max_skipped_steps in a row (docs/failures.md).
  OnNonfinite on_nonfinite = OnNonfinite::abort;
  int max_skipped_steps = 8;
  // A spike (core/train/divergence_guard.h): a loss above this many times the larger of its running
  // mean and ln(vocab_size); 0 = not checked.
  double spike_loss_factor = 3.0;
  CheckpointConfig checkpoint;
};

struct ParallelConfig {
  int sp = 1;
  // Ring attention's degree inside each sp group: sp/ring Ulysses ranks × ring ring ranks
  // (docs/parallelism.md, "Ulysses × ring").
  int ring = 1;
  int zero_stage = 0;
  int head_chunks = 1;
  bool overlap = false;
  double bucket_mb = 25.0;
  // ZeRO-3 gathers the next unit while this one computes, and ZeRO-2/3 reduce a unit's
  // gradient while the next one computes its backward (one more unit of memory each).
  bool prefetch = true;
  // How device buffers travel between ranks (cuda): auto | nccl | mpi (staged through the host).
  DeviceComm device_comm = DeviceComm::automatic;
  // A thread per rank that drives MPI's progress while compute runs: auto (when a rank has
  // two or more cores), on, off. It takes one of the rank's cores from the compute threads.
  ProgressThreadSetting progress_thread = ProgressThreadSetting::automatic;
  // Watchdog: a rank that waits longer than this in a collective ends the job (0 = off).
  double timeout_s = 600.0;
};

// memory.tiled_mlp: the MLP over tiles of this rank's rows, so [R, d_ff] never exists whole:
// off (false), auto (a tile's intermediates about the size of the layer input) or a tile
// count (docs/memory.md).
struct TiledMlp {
  enum class Mode { off, automatic, tiles };
  Mode mode = Mode::off;
  int tiles = 0;  // Mode::tiles: at least 1
};

// As the config spells it: "false", "auto" or the tile count.
std::string tiled_mlp_text(const TiledMlp& tiled);

struct MemoryConfig {
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
  TiledMlp tiled_mlp;
  // Layer inputs kept for the recompute live in host memory (with layer checkpointing).
  bool offload_checkpoints = false;
  int loss_tile_tokens = 0;  // 0: auto (kernels/op_scratch.h)
  double limit_gib = 0.0;    // 0 = unlimited (cpu)
};

struct KernelsConfig {
  AttentionKernel attention = AttentionKernel::automatic;
};

struct LogConfig {
  int every = 1;
  std::string metrics_file;
  // Chrome trace-event JSON of the first trace_steps steps, all ranks (docs/profiling.md).
  std::string trace_file;
  int trace_steps = 10;
  // Steps between verdicts on what bounds the run; 0 = only at the end.
  int verdict_every = 0;
  // Phases timed on the device where the backend has one (docs/profiling.md, "Device time").
  bool device_timing = true;
};

struct Config {
  Device device = Device::cpu;
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  MemoryConfig memory;
  KernelsConfig kernels;
  LogConfig log;
};

// memory.tiled_mlp as a tile count for a slice of `rows` tokens: 1 when off; auto keeps a
// tile's intermediates (`intermediates` [rows, d_ff] tensors) about the size of the layer
// input [rows, d_model]. Never more tiles than rows.
int64_t mlp_tiles(const MemoryConfig& memory, int64_t rows, int d_model, int d_ff,
                  int intermediates);

// Reads a YAML file (a regular file: data/input_file.h), applies "a.b=value" overrides, checks
// every key, type and range and fills defaults that depend on other keys. Throws ConfigError
// naming the key and line. What is valid but likely not meant (a file that sets no key) is
// added to *warnings when given.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   std::vector<std::string>* warnings = nullptr);
// Same, from YAML text (tests); source_name appears in messages.
Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source_name, std::vector<std::string>* warnings = nullptr);

// memory.limit_gib and `plan --device-gib`: a smaller limit rounds to a few bytes (a typo for
// 0, no limit), a larger one's byte count would not fit an int64.
constexpr double kSmallestLimitGib = 1e-6;
constexpr double kLargestLimitGib = 1073741824.0;  // 2^30 GiB = 1 EiB

// The largest model this build handles (beyond, the parameter table's arithmetic and the
// buffers would overflow before an allocation could fail cleanly), and the parameter
// count the limit is checked on: an upper estimate from the shape alone.
constexpr int kMaxLayers = 100000;
constexpr long double kMaxParameters = 1099511627776.0L;  // 2^40
long double approximate_parameter_count(const ModelConfig& model);

// Checks that depend on the number of ranks (world % sp, heads % sp, GQA, head stages, and
// kernels.attention: cudnn with padding); the message names the numbers and what would work.
void validate_for_world(const Config& config, int world_size);
// Whether some length the run trains at (train.seq_len or a schedule stage) is padded on
// parallel.sp ranks and parallel.ring (docs/parallelism.md, "Any length under any sp").
bool has_padding(const Config& config);
// Whether attention gets document starts: packed documents, or padding.
bool attention_has_documents(const Config& config);

// The key tables of docs/configuration.md ("### Top level" to the last row of `log`), made
// from the key table: default, allowed values and meaning of every key. Printed by
// `ulysses-train config-reference`; tests/test_config_docs.cpp compares it with the docs.
std::string config_reference_markdown();

// The resolved config as YAML, for --dry-run and the run log.
std::string config_to_yaml(const Config& config);
// Every key as "key=value" (resolved values), in the order of the key table.
std::vector<std::string> config_key_values(const Config& config);
// The resolved keys that decide which tokens each step reads: the data.* keys of the configured
// kind of source (synthetic, or files), train.seed, train.seq_len and train.seq_len_schedule
// (recorded in checkpoints; docs/checkpoints.md#resuming).
std::map<std::string, std::string> data_order_keys(const Config& config);
// The resolved keys the learning rate of every step is a function of: train.lr,
// train.warmup_steps, train.schedule and, for a decaying schedule, train.steps and train.min_lr
// (recorded in checkpoints; docs/checkpoints.md#resuming).
std::map<std::string, std::string> lr_schedule_keys(const Config& config);

}  // namespace ulysses
