#include "core/config/config_keys.h"

#include <set>
#include <sstream>

namespace ulysses {

namespace config_keys {

namespace {

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

}  // namespace

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
       "divides `sp`; `n_heads` and `n_kv_heads` rules apply to `sp / ring`; `seq_len` is padded "
       "to a multiple of `2·ring` too; on cuda not with `parallel.device_comm: nccl`",
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
       "listing the bytes held by category; 0 = no cap of your own: a run then checks every "
       "stage's planned step peak against the memory the machine has before it builds the "
       "model (host memory split among the node's ranks; on cuda the GPU's free memory, which "
       "is also the cap); set, that check is only a warning (docs/memory.md)"},

      {ULYSSES_KEY(kernels.attention),
       {},
       "`cudnn` needs `device: cuda` and a head dim that is a multiple of 8, at most 128",
       "attention implementation (docs/cuda.md): `native`, the hand-written flash-style "
       "kernels; `cudnn`, cuDNN's fused engines; `auto`, cuDNN where the build has it, the "
       "loaded library is 9.16 or newer and the head dim (`d_model / n_heads`) fits, else "
       "native (one log line says which and why; the cpu backend is always native)"},

      {ULYSSES_KEY(log.every), at_least(1), "", "steps between log lines"},
      {ULYSSES_KEY(log.metrics_file),
       {},
       "path",
       "JSON-lines metrics file, one run's at a time (a second run naming it while the first "
       "writes exits 2); missing folders are created; empty = none"},
      {ULYSSES_KEY(log.trace_file),
       {},
       "path",
       "Chrome trace-event JSON (Perfetto, chrome://tracing) of every phase on every rank for "
       "the first `trace_steps` steps (missing folders are created); `scripts/plot-trace.py` "
       "draws it (docs/profiling.md)"},
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

std::vector<std::string> key_names() {
  std::vector<std::string> keys;
  for (const Field& field : fields()) keys.push_back(field.key);
  return keys;
}

std::string value_text(const Config& config, const std::string& key) {
  Config copy = config;  // the table's accessors take a mutable Config
  return std::visit([&](auto ref) { return format_value(ref(copy)); }, find_field(key)->ref);
}

std::string key_shown(const ConfigReader& reader, const Config& config, const std::string& key) {
  std::string location = reader.where(key);
  return key + " = " + value_text(config, key) + " (" + (location.empty() ? "default" : location) +
         ")";
}

}  // namespace config_keys

namespace {

using namespace config_keys;

// The range as the docs' "allowed" column ("≥ 1").
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

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  std::string part;
  while (std::getline(stream, part, '.')) parts.push_back(part);
  return parts;
}

std::string scalar_text(Config& config, const Field& field) {
  return std::visit([&](auto ref) { return config_keys::scalar_text(ref(config)); }, field.ref);
}

}  // namespace

std::vector<std::string> config_key_values(const Config& config) {
  Config copy = config;
  std::vector<std::string> lines;
  for (const Field& field : fields()) lines.push_back(field.key + "=" + scalar_text(copy, field));
  return lines;
}

std::map<std::string, std::string> data_order_keys(const Config& config) {
  // The keys of the other kind of source do not change what this one reads.
  static const std::set<std::string> synthetic_only = {"data.n_pairs",
                                                       "data.n_queries",
                                                       "data.n_keys",
                                                       "data.n_values",
                                                       "data.n_filler",
                                                       "data.plant_fraction",
                                                       "data.documents_per_sequence",
                                                       "data.ask_previous_document"};
  static const std::set<std::string> files_only = {
      "data.path", "data.val_path", "data.val_fraction", "data.order", "data.eos_id"};
  const bool synthetic = config.data.source == DataSource::synthetic;
  Config copy = config;
  std::map<std::string, std::string> keys;
  for (const Field& field : fields()) {
    if ((synthetic ? files_only : synthetic_only).count(field.key)) continue;
    if (field.key.rfind("data.", 0) == 0 || field.key == "train.seed" ||
        field.key == "train.seq_len" || field.key == "train.seq_len_schedule")
      keys[field.key] = scalar_text(copy, field);
  }
  return keys;
}

std::map<std::string, std::string> lr_schedule_keys(const Config& config) {
  std::set<std::string> schedule_keys = {"train.lr", "train.warmup_steps", "train.schedule"};
  if (config.train.schedule != LrSchedule::constant)
    schedule_keys.insert({"train.steps", "train.min_lr"});
  Config copy = config;
  std::map<std::string, std::string> keys;
  for (const Field& field : fields())
    if (schedule_keys.count(field.key)) keys[field.key] = scalar_text(copy, field);
  return keys;
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
