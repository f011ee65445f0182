#include "core/config/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/config/config_reader.h"
#include "core/config/seq_len_schedule.h"
#include "data/dataset.h"
#include "data/input_file.h"
#include "data/synthetic.h"
#include "parallel/head_chunks.h"

namespace ulysses {

namespace {

// ---- the table of keys -----------------------------------------------------------------

// The numbers a key accepts: a lower and/or an upper bound, each inclusive or not, and 0
// besides where 0 means "off".
struct Range {
  bool has_low = false, has_high = false;
  double low = 0.0, high = 0.0;
  bool low_open = false, high_open = false;
  bool zero_allowed = false;
  // The value is used in fp32 arithmetic (the kernels, the optimizer): it must be a normal
  // fp32 number, and still in range once rounded to one (0.99999999 is 1.0f).
  bool fp32 = false;
};

Range at_least(double low) {
  return Range{true, false, low, 0.0, false, false};
}
Range above(double low) {
  return Range{true, false, low, 0.0, true, false};
}
Range between(double low, double high, bool low_open = false, bool high_open = false) {
  return Range{true, true, low, high, low_open, high_open};
}
Range zero_or(Range range) {
  range.zero_allowed = true;
  return range;
}
Range in_fp32(Range range) {
  range.fp32 = true;
  return range;
}

// An enum key's member, as the index of its value among its YAML spellings (names_of, beside
// each enum in core/config/config.h and the headers it names).
struct EnumValue {
  std::function<int()> get;
  std::function<void(int)> set;
  const std::vector<std::string>& names;
};

// The accessor of an enum key, made from the table's accessor of any enum member: an enum
// key is its enum (with names_of) and its row, nothing else.
struct EnumRef {
  template <typename Accessor>
  requires std::is_enum_v<std::remove_reference_t<std::invoke_result_t<Accessor, Config&>>> EnumRef(
      Accessor accessor)
      : access([accessor](Config& config) {
          auto& member = accessor(config);
          using E = std::remove_reference_t<decltype(member)>;
          return EnumValue{[&member] { return int(member); }, [&member](int i) { member = E(i); },
                           names_of(E())};
        }) {}
  EnumValue operator()(Config& config) const { return access(config); }

  std::function<EnumValue(Config&)> access;
};

// The member a key fills, by type.
using FieldRef =
    std::variant<int& (*)(Config&), uint64_t& (*)(Config&), double& (*)(Config&),
                 bool& (*)(Config&), std::string& (*)(Config&), TiledMlp& (*)(Config&), EnumRef>;

// One config key, declared once: parsing, overrides, unknown-key suggestions, range and
// choice checks, config_to_yaml (--dry-run) and the key tables of docs/configuration.md
// all come from this table. The default is the member's initializer in core/config/config.h.
// Rules between keys are code (check_cross_keys), named in `allowed`.
struct Field {
  std::string key;  // full dotted key, e.g. "train.checkpoint.dir"
  FieldRef ref;
  std::optional<Range> range;  // checked by check_ranges
  std::string allowed;         // the docs' "allowed" beyond the type, choices and range
  std::string doc;             // the docs' "meaning"
  std::string resolved;        // what a default of 0 resolves to, e.g. "`n_heads`"
};

// clang-format off
#define ULYSSES_KEY(path) #path, [](Config& c) -> auto& { return c.path; }
// clang-format on

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      {ULYSSES_KEY(device), {}, "", "backend; a build without CUDA refuses `cuda`"},

      {ULYSSES_KEY(model.family),
       {},
       "",
       "llama: RMSNorm, RoPE, SwiGLU, optional GQA; gpt2: LayerNorm, learned positions, GELU, "
       "biases, tied LM head"},
      {ULYSSES_KEY(model.n_layers), at_least(1), "", "transformer blocks"},
      {ULYSSES_KEY(model.d_model), at_least(1), "multiple of `n_heads`", "model width"},
      {ULYSSES_KEY(model.n_heads), at_least(1), "", "attention (query) heads"},
      {ULYSSES_KEY(model.n_kv_heads), at_least(0), "divides `n_heads`",
       "key/value heads (grouped-query attention); gpt2: must equal `n_heads`", "`n_heads`"},
      {ULYSSES_KEY(model.d_ff), at_least(0), "",
       "MLP width; 0 = llama: ⌈8/3·d_model⌉ rounded up to a multiple of 32, gpt2: 4·d_model",
       "family default"},
      {ULYSSES_KEY(model.vocab_size), at_least(0), "at least what the data needs",
       "0 = the data source's vocabulary (synthetic: its task size, text: 257); required for "
       "`tokens`",
       "data source"},
      {ULYSSES_KEY(model.max_seq_len), at_least(0), "at least `train.seq_len`",
       "longest sequence the model supports (gpt2: learned positions)", "`train.seq_len`"},
      {ULYSSES_KEY(model.rope_theta), in_fp32(above(0)), "", "RoPE base (llama)"},
      {ULYSSES_KEY(model.norm_eps), in_fp32(above(0)), "", "epsilon of RMSNorm / LayerNorm"},
      {ULYSSES_KEY(model.init_from), {}, "path", "pretrained weights to start from"},

      {ULYSSES_KEY(train.steps), at_least(1), "", "optimizer steps"},
      {ULYSSES_KEY(train.batch_size), at_least(1), "",
       "sequences per data-parallel rank per micro-step"},
      {ULYSSES_KEY(train.seq_len), at_least(2), "",
       "tokens per sequence (split over the `parallel.sp` ranks of a group)"},
      {ULYSSES_KEY(train.seq_len_schedule),
       {},
       "`\"LEN@STEP, ...\"` or `LENxBATCH@STEP`; LEN ≥ 2, BATCH ≤ 2³¹−1",
       "a sequence-length curriculum (<a id=\"curriculum\"></a>): e.g. "
       "`\"256@0, 1024x8@400, 4096x4@500\"` trains at 256 tokens from step 0, at 1024 with 8 "
       "sequences per rank from step 400 and at 4096 with 4 from step 500. Stages start at step "
       "0, lengths grow, the last is `train.seq_len`; a length `parallel.sp` does not divide is "
       "padded; a stage without `xBATCH` uses `train.batch_size`. At each change the "
       "model is rebuilt for the new shape (weights kept, through the host; optimizer moments "
       "stay), the data reopened, and the log says so. Length and batch are functions of the "
       "step, so resume is exact. `plan` plans the last stage; a run plans every stage against "
       "`memory.limit_gib` before its first step, and `--dry-run` prints each (docs/memory.md). "
       "Empty: `train.seq_len` throughout"},
      {ULYSSES_KEY(train.grad_accum), at_least(1), "", "micro-steps per optimizer step"},
      {ULYSSES_KEY(train.lr), in_fp32(above(0)), "", "peak learning rate"},
      {ULYSSES_KEY(train.min_lr), in_fp32(at_least(0)), "at most `train.lr`",
       "learning rate at the end of the decay"},
      {ULYSSES_KEY(train.warmup_steps), at_least(0), "", "linear warmup steps"},
      {ULYSSES_KEY(train.schedule),
       {},
       "",
       "after the warmup: cosine or linear decay from `lr` to `min_lr` at the last step, or "
       "`lr` throughout; the rate is a function of the step alone, so resume is exact for each"},
      {ULYSSES_KEY(train.weight_decay), in_fp32(at_least(0)), "", "decoupled AdamW weight decay"},
      {ULYSSES_KEY(train.beta1), in_fp32(between(0, 1, false, true)), "", "AdamW β1"},
      {ULYSSES_KEY(train.beta2), in_fp32(between(0, 1, false, true)), "", "AdamW β2"},
      {ULYSSES_KEY(train.eps), in_fp32(above(0)), "", "AdamW ε"},
      {ULYSSES_KEY(train.grad_clip), at_least(0), "", "global gradient-norm clip; 0 = off"},
      {ULYSSES_KEY(train.seed), {}, "0 … 2⁶⁴−1", "seeds initialisation and data order"},
      {ULYSSES_KEY(train.eval_every), at_least(0), "", "steps between evaluations; 0 = none"},
      {ULYSSES_KEY(train.eval_steps), at_least(1), "", "batches per evaluation"},
      {ULYSSES_KEY(train.on_nonfinite),
       {},
       "",
       "a NaN or infinite loss or gradient norm, or a spike (docs/failures.md): `abort` exits 3 "
       "naming the step, the first tensor whose gradient is not finite, and the newest "
       "checkpoint saved before the trouble began; `skip` drops that step's update, logs it and "
       "goes on"},
      {ULYSSES_KEY(train.max_skipped_steps), at_least(1), "",
       "with `skip`: more non-finite or spike steps than this in a row exit 3"},
      {ULYSSES_KEY(train.spike_loss_factor), at_least(0), "0 or > 1",
       "a step whose loss is more than this many times the larger of the running mean of the "
       "loss and ln(`vocab_size`) is a spike, handled as `on_nonfinite` says "
       "(docs/failures.md#loss-spikes); 0 = not checked"},

      {ULYSSES_KEY(train.checkpoint.dir), {}, "path", "checkpoint folder; empty = no checkpoints"},
      {ULYSSES_KEY(train.checkpoint.every), at_least(0), "",
       "steps between checkpoints; 0 = only at the end"},
      {ULYSSES_KEY(train.checkpoint.keep_last), at_least(0), "",
       "checkpoints kept; 0 = all. The newest checkpoint whose weights a normal step measured "
       "(the one to go back to, docs/failures.md#loss-spikes) is always kept as well"},
      {ULYSSES_KEY(train.checkpoint.overwrite),
       {},
       "",
       "a run started without `--resume` refuses (exit 2) a `dir` that already holds "
       "checkpoints, and a resume from an older step than the newest intact one there; `true` "
       "lets it replace them, once it has written and verified its first checkpoint "
       "(docs/checkpoints.md#overwriting)"},

      {ULYSSES_KEY(data.source), {}, "", "see [Data sources](#data-sources)"},
      {ULYSSES_KEY(data.path),
       {},
       "file, folder or glob",
       "text files or token shards; required for `text` and `tokens`"},
      {ULYSSES_KEY(data.val_path),
       {},
       "file, folder or glob",
       "separate validation data; empty = hold out the tail of `data.path`"},
      {ULYSSES_KEY(data.val_fraction), between(0, 1, false, true), "",
       "fraction of the stream held out for validation when `val_path` is empty"},
      {ULYSSES_KEY(data.order),
       {},
       "",
       "`text`/`tokens`: each epoch in a seeded shuffled order, or sequences 0, 1, 2, … in "
       "stream order every epoch (as llm.c reads its shards with shuffling off; the seed does "
       "not matter then); synthetic sequences are generated from their index, so the order "
       "does not apply"},
      {ULYSSES_KEY(data.documents),
       {},
       "",
       "`eos`: sequences are packed documents, cut after each end-of-text token (`text`: also "
       "after each blank line) and packed greedily into `train.seq_len` windows; attention is "
       "masked to each document, RoPE and learned positions restart at each, and a document's "
       "last token is not scored against the next one's first (docs/parallelism.md, \"Packed "
       "documents\"); `synthetic`: `documents_per_sequence` passkey documents per sequence"},
      {ULYSSES_KEY(data.eos_id), at_least(-1), "below `model.vocab_size`",
       "end-of-text token id for `documents: eos`; -1 = the source's: 256 for `text`, 50256 "
       "(GPT-2's end of text) for `tokens`"},
      {ULYSSES_KEY(data.documents_per_sequence), at_least(1), "",
       "synthetic with `documents: eos`: passkey documents per sequence, each with its own "
       "keys and queries"},
      {ULYSSES_KEY(data.ask_previous_document),
       {},
       "",
       "synthetic with `documents: eos`: every document after the first asks the previous "
       "document's questions, whose answers it does not hold: a leakage probe (answered no "
       "better than chance when documents are masked)"},
      {ULYSSES_KEY(data.n_pairs), at_least(1), "at most `n_keys`",
       "synthetic: key-value pairs planted per sequence"},
      {ULYSSES_KEY(data.n_queries), at_least(1), "at most `n_pairs`",
       "synthetic: pairs asked for at the end"},
      {ULYSSES_KEY(data.n_keys), at_least(1), "at least `n_pairs`",
       "synthetic: distinct key symbols"},
      {ULYSSES_KEY(data.n_values), at_least(1), "", "synthetic: distinct value symbols"},
      {ULYSSES_KEY(data.n_filler), at_least(1), "", "synthetic: distinct filler symbols"},
      {ULYSSES_KEY(data.plant_fraction), between(0, 1, true, false), "",
       "synthetic: pairs are planted in this first fraction of the sequence"},

      {ULYSSES_KEY(parallel.sp), at_least(1),
       "divides the world and `n_heads` (`sp / ring` does, with `parallel.ring`)",
       "ranks per sequence-parallel group; the rest of the world is data parallel"},
      {ULYSSES_KEY(parallel.ring), at_least(1),
       "divides `sp`; `n_heads` and `n_kv_heads` rules apply to `sp / ring`; `2·ring` divides "
       "`seq_len` padded to a multiple of `sp`; on cuda not with `parallel.device_comm: nccl`",
       "ring attention inside each sp group (docs/parallelism.md, \"Ulysses × ring\"): sp/ring "
       "Ulysses ranks (contiguous) × ring ranks; K/V blocks travel the ring, zigzag-split for "
       "causal balance; packed documents and padding mask as on one rank. Lifts sp past the "
       "head count"},
      {ULYSSES_KEY(parallel.zero_stage), between(0, 3), "",
       "state sharded over the whole dp×sp world (docs/memory.md): 0 replicated, gradients "
       "all-reduced; 1 AdamW moments and fp32 master weights sharded, gradients "
       "reduce-scattered, weights all-gathered after the update; 2 gradients sharded too (each "
       "unit reduce-scattered as the backward finishes it); 3 weights sharded too (each unit "
       "all-gathered when used). Ignored on one rank"},
      {ULYSSES_KEY(parallel.head_chunks), at_least(1),
       "divides `n_heads / sp`; stages hold whole kv groups or lie inside one",
       "UPipe (docs/memory.md): each rank's heads go through projection, all-to-all, attention "
       "and all-to-all back in this many stages, so the full-sequence q/k/v/out of one stage "
       "exist at a time and none is kept for the backward, which recomputes them; same results "
       "(to round-off), more FLOPs and all-to-alls"},
      {ULYSSES_KEY(parallel.overlap),
       {},
       "",
       "async Ulysses (docs/performance.md): each all-to-all starts as soon as its input exists "
       "(q's while k and v are projected; dO's during the output projection's weight gradient; "
       "with head chunks the next stage's exchanges during this stage's attention) and is "
       "waited for only where its output is needed; same bits either way"},
      {ULYSSES_KEY(parallel.bucket_mb), between(0, 1e9, true, false), "",
       "ZeRO unit size (MiB of fp32): consecutive whole layers are merged into one unit while "
       "they fit; a unit is one reduce-scatter and one all-gather, and stages 2–3 hold one unit "
       "whole. Embeddings and the tensors after the last layer are units of their own"},
      {ULYSSES_KEY(parallel.prefetch),
       {},
       "",
       "ZeRO-3 gathers the next unit while this one computes, and ZeRO-2/3 reduce a unit's "
       "gradient while the next unit computes its backward (docs/profiling.md); costs one more "
       "unit of gathered weights and of staged gradient per rank. Same results either way"},
      {ULYSSES_KEY(parallel.progress_thread),
       {},
       "",
       "a thread per rank that keeps MPI's non-blocking collectives moving while compute runs "
       "(needs `MPI_THREAD_MULTIPLE`); it takes one core from the compute threads. `auto`: "
       "where a rank has two or more cores; `on` where it cannot work exits 2 "
       "(docs/profiling.md)"},
      {ULYSSES_KEY(parallel.device_comm),
       {},
       "`nccl` needs `device: cuda` and `parallel.ring: 1`",
       "how device buffers travel between ranks (docs/cuda.md): `auto` takes NCCL when the "
       "build has it, `parallel.ring` is 1 and every rank of a node has its own GPU, else MPI "
       "staged through "
       "page-locked host memory; `nccl` insists (exit 2 where it cannot work, e.g. two ranks on "
       "one GPU); `mpi` always stages. No effect with `device: cpu` (MPI moves host memory "
       "directly)"},
      {ULYSSES_KEY(parallel.timeout_s), zero_or(at_least(1)), "",
       "watchdog (docs/failures.md): a rank that waits longer than this in a collective ends "
       "the whole job with exit 4, naming the rank, step, phase and collective; waits that "
       "overlap another rank's checkpoint I/O or weight loading get 10× as long; 0 = off"},

      {ULYSSES_KEY(memory.activation_checkpointing),
       {},
       "",
       "`layer`: keep only each block's input (tracked as `checkpoints`) and recompute the "
       "block's activations right before its backward; same results, activation memory of one "
       "block instead of all"},
      {ULYSSES_KEY(memory.tiled_mlp),
       {},
       "`false`, `auto`, a tile count ≥ 1",
       "run the MLP over this many tiles of the rank's rows, forward and backward (the backward "
       "recomputes each tile's intermediates), so `[rows, d_ff]` never exists whole; `auto` "
       "makes a tile's intermediates about the size of the layer input (⌈k·d_ff / d_model⌉ "
       "tiles, k = 3 for the SwiGLU MLP (llama), 2 for GELU (gpt2)). Same results to round-off "
       "(docs/memory.md)"},
      {ULYSSES_KEY(memory.offload_checkpoints),
       {},
       "`true` needs `activation_checkpointing: layer`",
       "the layer inputs that layer checkpointing keeps live in host memory (tracked as "
       "`checkpoints_host`, not counted against `limit_gib`); on the cpu backend they are there "
       "already, so nothing moves; on cuda they are copied to pinned host memory on a side "
       "stream as the forward makes them and brought back one layer ahead in backward, two "
       "staying on the device (docs/memory.md; compiled, not yet run on a GPU)"},
      {ULYSSES_KEY(memory.loss_tile_tokens), at_least(0), "`auto` (0) or a tile ≥ 1",
       "tokens per tile of the fused LM-head + loss (logits never exist for the whole slice); "
       "`auto`: 256 on the cpu backend; on cuda the tile doubles from 256 to 4096 while its "
       "buffers take at most 1/128 of the memory limit (for a vocabulary of 32000 at width "
       "2048: 4096 on a 141 GiB H200, 2048 on an 80 GiB GPU; docs/memory.md)",
       "auto"},
      {ULYSSES_KEY(memory.limit_gib), zero_or(between(kSmallestLimitGib, kLargestLimitGib)), "",
       "cap on tracked memory per rank: an allocation past it fails with an out-of-memory error "
       "listing the bytes held by category; 0 = unlimited"},

      {ULYSSES_KEY(kernels.attention),
       {},
       "`cudnn` needs `device: cuda` and a head dim that is a multiple of 8, at most 128",
       "attention implementation (docs/cuda.md): `native`, the hand-written flash-style "
       "kernels; `cudnn`, cuDNN's fused engines; `auto`, cuDNN where the build has it, the "
       "loaded library is 9.16 or newer and the head dim (`d_model / n_heads`) fits, else "
       "native (one log line says which and why; the cpu backend is always native)"},

      {ULYSSES_KEY(log.every), at_least(1), "", "steps between log lines"},
      {ULYSSES_KEY(log.metrics_file), {}, "path", "JSON-lines metrics file; empty = none"},
      {ULYSSES_KEY(log.trace_file),
       {},
       "path",
       "Chrome trace-event JSON (Perfetto, chrome://tracing) of every phase on every rank for "
       "the first `trace_steps` steps; `scripts/plot-trace.py` draws it (docs/profiling.md)"},
      {ULYSSES_KEY(log.trace_steps), at_least(1), "", "steps the trace covers"},
      {ULYSSES_KEY(log.verdict_every), at_least(0), "",
       "steps between verdicts on what bounds the run (communication, launches, compute, "
       "memory, overhead); 0 = only at the end of the run"},
      {ULYSSES_KEY(log.device_timing),
       {},
       "",
       "on a backend with a device stream (cuda), time every phase with CUDA events where its "
       "work runs, read back once per step: the metrics, the table and the verdict use device "
       "time (docs/profiling.md); `false` times phases on the host only, to measure what the "
       "events cost. No effect with `device: cpu`"},
  };
  return table;
}

#undef ULYSSES_KEY

const Field* find_field(const std::string& key) {
  for (const Field& field : fields()) {
    if (field.key == key) return &field;
  }
  return nullptr;
}

// The value as YAML writes it (config_to_yaml, --dry-run, the docs' defaults).
template <typename T>
std::string scalar_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_same_v<T, TiledMlp>) {
    return tiled_mlp_text(value);
  } else if constexpr (std::is_same_v<T, EnumValue>) {
    return value.names[size_t(value.get())];
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(value);
  } else {
    return std::to_string(value);
  }
}

// The value in a message: strings and choices quoted.
template <typename T>
std::string format_value(const T& value) {
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, TiledMlp> ||
                std::is_same_v<T, EnumValue>) {
    return "'" + scalar_text(value) + "'";
  } else {
    return scalar_text(value);
  }
}

// The reader's conversions, beside the ones below (an overload here would hide them).
using ::ulysses::convert;

// An enum key: one of its spellings, else the message names them all.
std::string convert(const YAML::Node& node, const EnumValue& out) {
  int index = 0;
  std::string problem = convert_choice(node, out.names, index);
  if (problem.empty()) out.set(index);
  return problem;
}

// memory.tiled_mlp: false, auto or a tile count of at least 1.
std::string convert(const YAML::Node& node, TiledMlp& out) {
  std::string text;
  std::string problem = convert(node, text);
  if (!problem.empty()) return problem;
  int tiles = 0;
  if (text == "false")
    out = TiledMlp{};
  else if (text == "auto")
    out = TiledMlp{TiledMlp::Mode::automatic, 0};
  else if (parse_integer(text, tiles) && tiles >= 1)
    out = TiledMlp{TiledMlp::Mode::tiles, tiles};
  else
    return "'" + text + "' is not allowed; use false, auto or a tile count >= 1";
  return "";
}

// ---- reading the tree ------------------------------------------------------------------

std::vector<std::string> key_names() {
  std::vector<std::string> keys;
  for (const Field& field : fields()) keys.push_back(field.key);
  return keys;
}

// Stores every given key into the config, checking its type.
void fill(const ConfigReader& reader, Config& config) {
  for (const Field& field : fields()) {
    const YAML::Node* given = reader.given(field.key);
    if (given == nullptr) continue;
    // `auto` spells the 0 of a key whose 0 is resolved (its `resolved` column).
    const bool automatic =
        !field.resolved.empty() && given->IsScalar() && given->Scalar() == "auto";
    std::string problem = std::visit(
        [&](auto ref) { return convert(automatic ? YAML::Node(0) : *given, ref(config)); },
        field.ref);
    if (!problem.empty()) reader.fail(field.key, problem);
  }
}

std::string value_text(const Config& config, const std::string& key) {
  Config copy = config;  // the table's accessors take a mutable Config
  return std::visit([&](auto ref) { return format_value(ref(copy)); }, find_field(key)->ref);
}

// "model.n_heads = 12 (config.yaml:5)", for messages that involve a second key.
std::string key_shown(const ConfigReader& reader, const Config& config, const std::string& key) {
  std::string location = reader.where(key);
  return key + " = " + value_text(config, key) + " (" + (location.empty() ? "default" : location) +
         ")";
}

// ---- validation ------------------------------------------------------------------------

// Ascending. Pairs d and n / d up to sqrt(n): n may be as large as the int range (a config
// is checked before its size is), where counting up to n would take seconds and overflow.
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

// The range as a message ("must be >= 1") and as the docs' "allowed" column ("≥ 1").
std::string range_rule(const Range& range) {
  std::string rule = range.zero_allowed ? "must be 0 or" : "must be";
  if (range.has_low && range.has_high && !range.low_open && !range.high_open)
    return rule + " between " + format_double(range.low) + " and " + format_double(range.high);
  if (range.has_low) rule += (range.low_open ? " > " : " >= ") + format_double(range.low);
  if (range.has_low && range.has_high) rule += " and";
  if (range.has_high) rule += (range.high_open ? " < " : " <= ") + format_double(range.high);
  return rule;
}

std::string range_docs(const Range& range) {
  std::string docs = range.zero_allowed ? "0 or " : "";
  if (!range.has_high)
    docs += (range.low_open ? "> " : "≥ ") + format_double(range.low);
  else if (!range.low_open && !range.high_open)
    docs += format_double(range.low) + " … " + format_double(range.high);
  else
    docs += (range.low_open ? "(" : "[") + format_double(range.low) + ", " +
            format_double(range.high) + (range.high_open ? ")" : "]");
  if (range.fp32) docs += " in fp32";
  return docs;
}

bool in_range(const Range& range, double value) {
  if (range.zero_allowed && value == 0.0) return true;
  if (range.has_low && !(range.low_open ? value > range.low : value >= range.low)) return false;
  if (range.has_high && !(range.high_open ? value < range.high : value <= range.high)) return false;
  return true;
}

std::string format_float(float value) {
  char text[32];
  auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

// What is wrong with a key's value once rounded to fp32 (Range::fp32), or "".
std::string fp32_problem(const Range& range, double value) {
  const std::string why = " in fp32, which training computes in";
  constexpr float kSmallest = std::numeric_limits<float>::min();  // normal: not flushed to 0
  constexpr float kLargest = std::numeric_limits<float>::max();
  if (value != 0.0 && std::abs(value) < double(kSmallest))
    return format_double(value) + " is below " + format_float(kSmallest) +
           ", the smallest normal number" + why + " (it would be 0 or lose its precision there)";
  if (std::abs(value) > double(kLargest))
    return format_double(value) + " is above " + format_float(kLargest) + ", the largest number" +
           why;
  const float rounded = float(value);
  if (in_range(range, double(rounded))) return "";
  std::string problem = format_double(value) + " is " + format_float(rounded) + why + "; " +
                        range_rule(range) + " there";
  if (range.has_high && range.high_open && double(rounded) >= range.high)
    problem += " (at most " +
               format_float(std::nextafter(float(range.high), -std::numeric_limits<float>::max())) +
               ")";
  return problem;
}

// The ranges of the key table; a choice was checked as it was read (fill).
void check_ranges(const ConfigReader& reader, const Config& c) {
  Config copy = c;  // the table's accessors take a mutable Config
  for (const Field& field : fields()) {
    if (!field.range) continue;
    std::visit(
        [&](auto ref) {
          const auto& value = ref(copy);
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
            if (!in_range(*field.range, double(value)))
              reader.fail(field.key, range_rule(*field.range) + ", got " + format_value(value));
            if (field.range->fp32) {
              const std::string problem = fp32_problem(*field.range, double(value));
              if (!problem.empty()) reader.fail(field.key, problem);
            }
          }
        },
        field.ref);
  }

  // Rules of single keys that a range does not say.
  // A spike factor of 1 or less would call ordinary steps spikes.
  if (c.train.spike_loss_factor > 0.0 && c.train.spike_loss_factor <= 1.0)
    reader.fail("train.spike_loss_factor", "must be 0 (not checked) or above 1, got " +
                                               format_double(c.train.spike_loss_factor));
}

// Defaults that depend on other keys.
void resolve_defaults(const ConfigReader& reader, Config& c) {
  ModelConfig& m = c.model;
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  if (m.d_ff == 0) {
    // In 64 bits: d_model is any int here (check_model_size judges the size later).
    const int64_t d_model = m.d_model;
    int64_t d_ff = 4 * d_model;
    if (architecture(m.family).mlp == MlpKind::swiglu) {
      const int64_t eight_thirds = (8 * d_model + 2) / 3;  // ceil(8·d / 3)
      d_ff = (eight_thirds + 31) / 32 * 32;
    }
    if (d_ff > std::numeric_limits<int>::max()) {
      reader.fail("model.d_model", std::to_string(m.d_model) +
                                       " is too large: the default model.d_ff would be " +
                                       std::to_string(d_ff) + ", above the largest int");
    }
    m.d_ff = int(d_ff);
  }
  if (m.max_seq_len == 0) m.max_seq_len = c.train.seq_len;
  if (m.vocab_size == 0) {
    if (c.data.source == DataSource::tokens) {
      reader.fail("model.vocab_size", "is required with " + key_shown(reader, c, "data.source") +
                                          ": token shards do not say their vocabulary; set "
                                          "it to the tokenizer's vocabulary size");
    }
    m.vocab_size = default_vocab_size(c.data);
  }
}

// Sizes far beyond any real model would overflow the arithmetic of the parameter table and
// the buffers long before an allocation could fail cleanly: refused with the numbers.
void check_model_size(const ConfigReader& reader, const Config& c) {
  constexpr long double kMaxActivationBytes = 1125899906842624.0L;  // 2^50: 1 PiB per rank
  const ModelConfig& m = c.model;
  if (m.n_layers > kMaxLayers) {
    reader.fail("model.n_layers", std::to_string(m.n_layers) + " is above the " +
                                      std::to_string(kMaxLayers) + " layers ulysses supports");
  }
  const long double C = m.d_model, F = m.d_ff;
  const long double params = approximate_parameter_count(m);
  if (params > kMaxParameters) {
    char text[64];
    std::snprintf(text, sizeof text, "%.3Lg", params);
    reader.fail("model.d_model", std::string("the model would have about ") + text +
                                     " parameters (" + key_shown(reader, c, "model.n_layers") +
                                     ", " + key_shown(reader, c, "model.d_ff") + ", " +
                                     key_shown(reader, c, "model.vocab_size") +
                                     "); ulysses supports at most 2^40 (1.1e12)");
  }
  const long double activation_bytes = 4.0L * c.train.batch_size * c.train.seq_len * std::max(C, F);
  if (activation_bytes > kMaxActivationBytes) {
    reader.fail("train.seq_len", "one activation of " + key_shown(reader, c, "train.batch_size") +
                                     " sequences of " + std::to_string(c.train.seq_len) +
                                     " tokens would exceed 1 PiB; lower the batch or the length");
  }
  for (const SeqLenStage& stage : parse_seq_len_schedule(c.train.seq_len_schedule)) {
    const long double batch = stage.batch_size > 0 ? stage.batch_size : c.train.batch_size;
    if (4.0L * batch * stage.seq_len * std::max(C, F) > kMaxActivationBytes)
      reader.fail("train.seq_len_schedule",
                  "one activation of the stage from step " + std::to_string(stage.first_step) +
                      ", " + std::to_string(int64_t(batch)) + " sequences of " +
                      std::to_string(stage.seq_len) +
                      " tokens, would exceed 1 PiB; lower its batch or length");
  }
}

void check_cross_keys(const ConfigReader& reader, const Config& c) {
  auto show = [&](const std::string& key) { return key_shown(reader, c, key); };
  const ModelConfig& m = c.model;

  if (c.train.min_lr > c.train.lr) {
    reader.fail("train.min_lr", format_double(c.train.min_lr) + " is above " + show("train.lr") +
                                    "; the schedule decays from lr down to min_lr");
  }
  if (m.d_model % m.n_heads != 0) {
    reader.fail("model.d_model", std::to_string(m.d_model) + " is not divisible by " +
                                     show("model.n_heads") + "; heads split d_model evenly");
  }
  if (m.n_kv_heads > m.n_heads || m.n_heads % m.n_kv_heads != 0) {
    reader.fail("model.n_kv_heads",
                std::to_string(m.n_kv_heads) + " does not divide " + show("model.n_heads") +
                    "; each kv head serves a whole group of query heads; n_kv_heads can be " +
                    join_choices(divisors_of(m.n_heads)));
  }
  if (architecture(m.family).positions == PositionKind::rope && m.head_dim() % 2 != 0) {
    reader.fail("model.d_model", "head_dim = d_model / n_heads = " + std::to_string(m.head_dim()) +
                                     " is odd (" + show("model.n_heads") +
                                     "); RoPE rotates pairs of dimensions and needs it even");
  }
  if (!architecture(m.family).grouped_query && m.n_kv_heads != m.n_heads) {
    reader.fail("model.n_kv_heads", std::to_string(m.n_kv_heads) + " differs from " +
                                        show("model.n_heads") +
                                        "; model.family gpt2 has no grouped-query attention");
  }
  std::vector<SeqLenStage> stages;
  try {
    stages = parse_seq_len_schedule(c.train.seq_len_schedule);
  } catch (const std::invalid_argument& error) {
    reader.fail("train.seq_len_schedule", error.what());
  }
  const std::string schedule_problem =
      seq_len_schedule_problem(stages, c.train.seq_len, c.train.steps);
  if (!schedule_problem.empty()) reader.fail("train.seq_len_schedule", schedule_problem);
  if (c.train.seq_len > m.max_seq_len) {
    reader.fail("train.seq_len",
                std::to_string(c.train.seq_len) + " is above " + show("model.max_seq_len"));
  }
  if (c.data.source != DataSource::synthetic && c.data.path.empty()) {
    reader.fail("data.path",
                "is required with " + show("data.source") + ": give a file, a folder or a glob");
  }
  if (c.data.source == DataSource::synthetic) {
    if (c.data.n_queries > c.data.n_pairs) {
      reader.fail("data.n_queries", std::to_string(c.data.n_queries) + " is above " +
                                        show("data.n_pairs") +
                                        "; each query asks for a different planted pair");
    }
    if (c.data.n_keys < c.data.n_pairs) {
      reader.fail("data.n_keys", std::to_string(c.data.n_keys) + " is below " +
                                     show("data.n_pairs") + "; planted keys are distinct");
    }
    int64_t needed = synthetic_min_seq_len(c.data);
    if (!stages.empty() && stages.front().seq_len < needed) {
      reader.fail("train.seq_len_schedule",
                  "the first stage's length " + std::to_string(stages.front().seq_len) +
                      " is too short for the synthetic task, which needs " +
                      std::to_string(needed));
    }
    if (c.train.seq_len < needed) {
      reader.fail("train.seq_len",
                  std::to_string(c.train.seq_len) +
                      " is too short for the synthetic task: BOS + 3 tokens for each of " +
                      show("data.n_pairs") + " and " + show("data.n_queries") + " needs " +
                      std::to_string(needed));
    }
  }
  int needed_vocab = default_vocab_size(c.data);
  if (m.vocab_size < needed_vocab) {
    reader.fail("model.vocab_size", std::to_string(m.vocab_size) + " is below the " +
                                        std::to_string(needed_vocab) + " tokens data.source " +
                                        name_of(c.data.source) + " needs");
  }
  if (c.parallel.device_comm == DeviceComm::nccl && c.device != Device::cuda) {
    reader.fail("parallel.device_comm", "nccl needs device: cuda, but " + show("device"));
  }
  if (c.parallel.device_comm == DeviceComm::nccl && c.parallel.ring > 1) {
    reader.fail("parallel.device_comm",
                "nccl has no point to point here, which parallel.ring > 1 needs; use "
                "parallel.device_comm: mpi or auto (docs/parallelism.md, \"Ulysses × ring\")");
  }
  if (c.kernels.attention == AttentionKernel::cudnn && c.device != Device::cuda) {
    reader.fail("kernels.attention", "cudnn needs device: cuda, but " + show("device"));
  }
  if (c.kernels.attention == AttentionKernel::cudnn && m.n_heads > 0) {
    const int head_dim = m.d_model / m.n_heads;
    if (head_dim % 8 != 0 || head_dim > 128)
      reader.fail("kernels.attention",
                  "cudnn needs a head dim (model.d_model / model.n_heads) that is a multiple of 8 "
                  "and at most 128, but it is " +
                      std::to_string(head_dim) + "; use kernels.attention: native");
  }
  if (c.kernels.attention == AttentionKernel::cudnn && c.data.documents == DataDocuments::eos) {
    reader.fail("kernels.attention",
                "cudnn cannot mask packed documents (" + show("data.documents") +
                    "): cuDNN's graphs here have no document mask; use kernels.attention: "
                    "native or auto");
  }
  if (c.data.ask_previous_document &&
      (c.data.source != DataSource::synthetic || c.data.documents != DataDocuments::eos ||
       c.data.documents_per_sequence < 2))
    reader.fail("data.ask_previous_document",
                "needs data.source: synthetic, data.documents: eos and "
                "data.documents_per_sequence >= 2, but " +
                    show("data.source") + ", " + show("data.documents") + ", " +
                    show("data.documents_per_sequence"));
  check_model_size(reader, c);
  // Keys of features that are specified but not built yet: refused rather than ignored, so
  // a run never silently differs from what its config says.

  if (c.memory.offload_checkpoints &&
      c.memory.activation_checkpointing != ActivationCheckpointing::layer)
    reader.fail("memory.offload_checkpoints",
                "offloads the layer inputs that layer checkpointing keeps, but " +
                    show("memory.activation_checkpointing"));
}

// ---- YAML output -----------------------------------------------------------------------

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  std::string part;
  while (std::getline(stream, part, '.')) parts.push_back(part);
  return parts;
}

std::string scalar_text(Config& config, const Field& field) {
  return std::visit([&](auto ref) { return scalar_text(ref(config)); }, field.ref);
}

}  // namespace

const Architecture& architecture(Family family) {
  static const Architecture kLlama = {NormKind::rms,         MlpKind::swiglu,
                                      PositionKind::rope,
                                      /*biases=*/false,      /*tied_head=*/false,
                                      /*grouped_query=*/true};
  static const Architecture kGpt2 = {NormKind::layer,        MlpKind::gelu,
                                     PositionKind::learned,
                                     /*biases=*/true,        /*tied_head=*/true,
                                     /*grouped_query=*/false};
  switch (family) {
    case Family::llama:
      return kLlama;
    case Family::gpt2:
      return kGpt2;
  }
  throw std::logic_error("model family " + std::to_string(int(family)) + " has no architecture");
}

Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source_name, std::vector<std::string>* warnings) {
  ConfigReader reader(source_name, key_names());
  reader.read_file_tree(yaml_text);
  const bool file_sets_keys = reader.keys_given() > 0;
  for (const std::string& override_text : overrides) reader.apply_override(override_text);
  Config config;
  fill(reader, config);
  check_ranges(reader, config);
  resolve_defaults(reader, config);
  check_cross_keys(reader, config);
  if (warnings && !file_sets_keys) {
    const Config defaults;
    warnings->push_back(source_name +
                        ": the config sets no keys, so every key not given with --set has its "
                        "default (docs/configuration.md): " +
                        std::to_string(defaults.train.steps) + " steps of a " +
                        std::to_string(defaults.model.n_layers) + "-layer " +
                        name_of(defaults.model.family) + " model on the " +
                        name_of(defaults.data.source) + " task");
  }
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   std::vector<std::string>* warnings) {
  if (input_folder_problem(path).empty())
    throw ConfigError(path +
                      ": is a folder; --config takes a YAML file (e.g. configs/passkey-sp4.yaml)");
  InputFile file(path);
  std::string text;
  if (!file.read_all(text)) throw ConfigError("config file " + file.problem());
  return parse_config(text, overrides, path, warnings);
}

bool has_padding(const Config& config, int sp) {
  if (config.train.seq_len % sp != 0) return true;
  for (const SeqLenStage& stage : parse_seq_len_schedule(config.train.seq_len_schedule))
    if (stage.seq_len % sp != 0) return true;
  return false;
}

bool attention_has_documents(const Config& config) {
  return config.data.documents == DataDocuments::eos || has_padding(config, config.parallel.sp);
}

void validate_for_world(const Config& config, int world_size) {
  const int sp = config.parallel.sp;
  const int n_heads = config.model.n_heads;
  const int n_kv_heads = config.model.n_kv_heads == 0 ? n_heads : config.model.n_kv_heads;
  if (world_size < 1) {
    throw ConfigError("the job has " + std::to_string(world_size) + " ranks; it needs at least 1");
  }
  if (world_size % sp != 0) {
    throw ConfigError("parallel.sp=" + std::to_string(sp) + " does not divide the " +
                      std::to_string(world_size) + " ranks of the job; sp can be " +
                      join_choices(divisors_of(world_size)));
  }
  const int ring = config.parallel.ring;
  if (sp % ring != 0)
    throw ConfigError("parallel.ring=" + std::to_string(ring) + " does not divide parallel.sp=" +
                      std::to_string(sp) + "; ring can be " + join_choices(divisors_of(sp)));
  if (ring > 1) {
    // The zigzag split cuts the sequence as the ranks hold it, padded to a multiple of sp
    // (docs/parallelism.md, "Any length under any sp"), into 2·ring equal chunks.
    const auto check_zigzag = [&](int64_t length, const std::string& what) {
      const int64_t padded = (length + sp - 1) / sp * sp;
      if (padded % (2 * ring) == 0) return;
      const int64_t step = std::lcm(int64_t(sp), int64_t(2 * ring));
      throw ConfigError(
          what + " has length " + std::to_string(length) +
          (padded != length ? " (padded to " + std::to_string(padded) +
                                  " on parallel.sp=" + std::to_string(sp) + ")"
                            : std::string()) +
          ", not divisible by 2 * parallel.ring=" + std::to_string(2 * ring) +
          "; the zigzag split cuts each sequence into 2·ring equal chunks, e.g. use " +
          std::to_string((padded + step - 1) / step * step));
    };
    check_zigzag(config.train.seq_len, "train.seq_len");
    for (const SeqLenStage& stage : parse_seq_len_schedule(config.train.seq_len_schedule))
      check_zigzag(stage.seq_len,
                   "train.seq_len_schedule: the stage at step " + std::to_string(stage.first_step));
  }
  // The head rules bind the Ulysses degree sp / ring only (heads are not split by the ring).
  const int ulysses = sp / ring;
  const auto heads_fit = [&](int u) {
    return n_heads % u == 0 && (n_kv_heads % u == 0 || u % n_kv_heads == 0);
  };
  if (ring > 1 && !heads_fit(ulysses)) {
    std::vector<std::string> working;
    for (int r = 1; r <= sp; ++r)
      if (sp % r == 0 && heads_fit(sp / r))
        working.push_back("(" + std::to_string(sp / r) + ", " + std::to_string(r) + ")");
    throw ConfigError(
        "model.n_heads=" + std::to_string(n_heads) +
        " and model.n_kv_heads=" + std::to_string(n_kv_heads) +
        " do not fit the Ulysses degree sp/ring=" + std::to_string(sp) + "/" +
        std::to_string(ring) +
        ": it must divide n_heads, and kv heads are split when n_kv_heads % (sp/ring) == 0 or "
        "replicated when (sp/ring) % n_kv_heads == 0; the (sp/ring, ring) pairs that work for "
        "sp=" +
        std::to_string(sp) + " are " +
        (working.empty() ? std::string("none") : join_choices(working)) +
        " (parallel.ring splits the sequence without splitting heads)");
  }
  if (ring == 1) {
    if (n_heads % sp != 0) {
      throw ConfigError("model.n_heads=" + std::to_string(n_heads) +
                        " is not divisible by parallel.sp=" + std::to_string(sp) + "; sp can be " +
                        join_choices(divisors_of(n_heads)));
    }
    if (n_kv_heads % sp != 0 && sp % n_kv_heads != 0) {
      std::vector<std::string> working;
      for (int candidate = 1; candidate <= n_heads; ++candidate) {
        if (n_heads % candidate == 0 && world_size % candidate == 0 &&
            (n_kv_heads % candidate == 0 || candidate % n_kv_heads == 0))
          working.push_back(std::to_string(candidate));
      }
      throw ConfigError("model.n_kv_heads=" + std::to_string(n_kv_heads) +
                        " and parallel.sp=" + std::to_string(sp) +
                        " do not fit: kv heads are split over the sp ranks when n_kv_heads % sp "
                        "== 0, or replicated when sp % n_kv_heads == 0, and neither holds; on " +
                        std::to_string(world_size) + " ranks sp can be " + join_choices(working));
    }
  }
  // Any train.seq_len works: a length sp does not divide is padded to the next multiple
  // (docs/parallelism.md, "Any length under any sp"), masked as a document of its own, which
  // cuDNN's attention here cannot do.
  if (config.kernels.attention == AttentionKernel::cudnn && has_padding(config, sp))
    throw ConfigError("kernels.attention: cudnn cannot mask the padding of train.seq_len=" +
                      std::to_string(config.train.seq_len) + " (or a train.seq_len_schedule " +
                      "stage) on parallel.sp=" + std::to_string(sp) +
                      "; use a length sp divides, or kernels.attention: native or auto");
  const int heads_per_rank = n_heads / ulysses;
  const std::vector<int> chunks = valid_head_chunks(n_heads, n_kv_heads, ulysses);
  if (std::find(chunks.begin(), chunks.end(), config.parallel.head_chunks) == chunks.end()) {
    std::vector<std::string> valid;
    for (int u : chunks) valid.push_back(std::to_string(u));
    const bool divides = heads_per_rank % config.parallel.head_chunks == 0;
    throw ConfigError(
        "parallel.head_chunks=" + std::to_string(config.parallel.head_chunks) +
        (divides
             ? " splits the " + std::to_string(heads_per_rank) + " heads per rank into stages of " +
                   std::to_string(heads_per_rank / config.parallel.head_chunks) +
                   ", which neither hold whole groups of the " +
                   std::to_string(n_heads / n_kv_heads) +
                   " query heads per kv head nor lie inside one (model.n_kv_heads=" +
                   std::to_string(n_kv_heads) + ")"
             : " does not divide the " + std::to_string(heads_per_rank) +
                   " heads per rank (model.n_heads=" + std::to_string(n_heads) +
                   " / (parallel.sp / parallel.ring)=" + std::to_string(ulysses) + ")") +
        "; head_chunks can be " + join_choices(valid));
  }
}

int64_t mlp_tiles(const MemoryConfig& memory, int64_t rows, int d_model, int d_ff,
                  int intermediates) {
  int64_t tiles = 1;
  switch (memory.tiled_mlp.mode) {
    case TiledMlp::Mode::off:
      break;
    case TiledMlp::Mode::automatic:
      tiles = (int64_t(intermediates) * d_ff + d_model - 1) / d_model;
      break;
    case TiledMlp::Mode::tiles:
      tiles = memory.tiled_mlp.tiles;
      break;
  }
  return std::max<int64_t>(1, std::min(tiles, rows));
}

std::string tiled_mlp_text(const TiledMlp& tiled) {
  switch (tiled.mode) {
    case TiledMlp::Mode::off:
      return "false";
    case TiledMlp::Mode::automatic:
      return "auto";
    case TiledMlp::Mode::tiles:
      return std::to_string(tiled.tiles);
  }
  return "false";
}

long double approximate_parameter_count(const ModelConfig& m) {
  const long double C = m.d_model, F = m.d_ff, L = m.n_layers;
  return 2.0L * m.vocab_size * C + (long double)m.max_seq_len * C +
         L * (4.0L * C * C + 3.0L * C * F + 6.0L * C + F);
}

std::vector<std::string> config_key_values(const Config& config) {
  Config copy = config;
  std::vector<std::string> lines;
  for (const Field& field : fields()) lines.push_back(field.key + "=" + scalar_text(copy, field));
  return lines;
}

std::string config_reference_markdown() {
  Config defaults;
  std::string text, section = "-";
  for (const Field& field : fields()) {
    const size_t dot = field.key.find('.');
    const std::string top = dot == std::string::npos ? "" : field.key.substr(0, dot);
    if (top != section) {
      if (!text.empty()) text += "\n";
      text += top.empty() ? "### Top level\n" : "### `" + top + "`\n";
      text += "\n| key | default | allowed | meaning |\n| --- | --- | --- | --- |\n";
      section = top;
    }
    const std::string value = scalar_text(defaults, field);
    std::string default_cell = "`" + (value.empty() ? "\"\"" : value) + "`";
    if (!field.resolved.empty()) default_cell += " → " + field.resolved;
    // What the type says (the choices of an enum or a bool), then the range, then the rest.
    std::vector<std::string> allowed;
    std::visit(
        [&](auto ref) {
          using T = std::decay_t<decltype(ref(defaults))>;
          std::vector<std::string> choices;
          if constexpr (std::is_same_v<T, EnumValue>) choices = ref(defaults).names;
          if constexpr (std::is_same_v<T, bool>) choices = {"true", "false"};
          std::string list;
          for (const std::string& choice : choices)
            list += (list.empty() ? "`" : ", `") + choice + "`";
          if (!list.empty()) allowed.push_back(list);
        },
        field.ref);
    if (field.range) allowed.push_back(range_docs(*field.range));
    if (!field.allowed.empty()) allowed.push_back(field.allowed);
    std::string allowed_cell;
    for (const std::string& part : allowed)
      allowed_cell += (allowed_cell.empty() ? "" : "; ") + part;
    text += "| `" + field.key + "` | " + default_cell + " | " + allowed_cell + " | " + field.doc +
            " |\n";
  }
  return text;
}

std::string config_to_yaml(const Config& config) {
  Config copy = config;
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open_sections;
  for (const Field& field : fields()) {
    std::vector<std::string> parts = split_key(field.key);
    std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open_sections.size() && common < sections.size() &&
           open_sections[common] == sections[common]) {
      common++;
    }
    while (open_sections.size() > common) {
      out << YAML::EndMap;
      open_sections.pop_back();
    }
    while (open_sections.size() < sections.size()) {
      out << YAML::Key << sections[open_sections.size()] << YAML::Value << YAML::BeginMap;
      open_sections.push_back(sections[open_sections.size()]);
    }
    out << YAML::Key << parts.back() << YAML::Value << scalar_text(copy, field);
  }
  while (!open_sections.empty()) {
    out << YAML::EndMap;
    open_sections.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ulysses
