#include "core/plan/plan_search.h"

#include <algorithm>

#include "kernels/stopwatch.h"
#include "parallel/head_chunks.h"
#include "parallel/sequence_padding.h"

namespace ulysses {

namespace {

int kv_heads_of(const Config& config) {
  return config.model.n_kv_heads == 0 ? config.model.n_heads : config.model.n_kv_heads;
}

// Heads are split over the Ulysses degree sp / ring only (docs/parallelism.md, "Ulysses ×
// ring"). A ring that does not divide sp is refused with a message of its own, so the head
// rules are then shown for sp alone.
bool ring_divides(int sp, int ring) {
  return ring > 1 && sp % ring == 0;
}
int ulysses_degree(int sp, int ring) {
  return ring_divides(sp, ring) ? sp / ring : sp;
}

std::vector<std::string> with(std::vector<std::string> overrides,
                              const std::vector<std::string>& more) {
  overrides.insert(overrides.end(), more.begin(), more.end());
  return overrides;
}

// The target's config at seq_len on sp ranks with extra overrides; throws ConfigError.
Config config_at(const PlanTarget& target, int64_t seq_len, int sp,
                 const std::vector<std::string>& extra) {
  Config config = load_config(
      target.config_path, with(with(target.overrides, {"train.seq_len=" + std::to_string(seq_len),
                                                       "parallel.sp=" + std::to_string(sp)}),
                               extra));
  validate_for_world(config, target.world_size);
  return config;
}

bool fits(const MemoryPlan& plan, int64_t budget_bytes) {
  return plan.rank_need <= budget_bytes;
}

}  // namespace

std::vector<OptionSet> option_ladder(const Config& config, int world_size) {
  std::vector<OptionSet> ladder;
  std::vector<std::string> current = {
      "parallel.zero_stage=0", "memory.activation_checkpointing=none", "memory.tiled_mlp=false",
      "parallel.head_chunks=1", "memory.offload_checkpoints=false"};
  std::string name = "none";
  auto add = [&](const std::string& step, const std::string& override_text) {
    current.push_back(override_text);
    name = name == "none" ? step : name + " + " + step;
    ladder.push_back({name, current});
  };
  ladder.push_back({name, current});
  if (world_size > 1) {
    for (int stage = 1; stage <= 3; ++stage) {
      current.push_back("parallel.zero_stage=" + std::to_string(stage));
      name = "ZeRO-" + std::to_string(stage);
      ladder.push_back({name, current});
    }
  }
  add("layer checkpointing", "memory.activation_checkpointing=layer");
  add("tiled MLP", "memory.tiled_mlp=auto");
  // A Ulysses degree the heads do not fit has no chunks; its point is refused elsewhere.
  const std::vector<int> chunks =
      valid_head_chunks(config.model.n_heads, kv_heads_of(config),
                        ulysses_degree(config.parallel.sp, config.parallel.ring));
  if (!chunks.empty() && chunks.back() > 1)
    add("head chunks " + std::to_string(chunks.back()),
        "parallel.head_chunks=" + std::to_string(chunks.back()));
  // On the cpu backend offloading moves nothing: the layer inputs are host memory either way.
  if (config.device == Device::cuda) add("offload", "memory.offload_checkpoints=true");
  return ladder;
}

PlanPoint plan_point(const PlanTarget& target, int64_t seq_len, int sp) {
  PlanPoint point;
  point.seq_len = seq_len;
  point.sp = sp;
  try {
    point.config = load_config(target.config_path,
                               with(target.overrides, {"train.seq_len=" + std::to_string(seq_len),
                                                       "parallel.sp=" + std::to_string(sp)}));
    point.loaded = true;
    validate_for_world(point.config, target.world_size);
  } catch (const ConfigError& error) {
    point.verdict = error.what();
    return point;
  }
  point.plan = plan_memory(point.config, target.world_size, target.cpu_threads);
  point.fits = fits(point.plan, target.budget_bytes);
  for (const OptionSet& options : option_ladder(point.config, target.world_size)) {
    Config config;
    try {
      config = config_at(target, seq_len, sp, options.overrides);
    } catch (const ConfigError&) {
      continue;  // an option this model or world cannot take
    }
    MemoryPlan plan = plan_memory(config, target.world_size, target.cpu_threads);
    if (fits(plan, target.budget_bytes)) {
      point.cheapest = options;
      point.cheapest_plan = plan;
      break;
    }
  }
  return point;
}

int64_t longest_fitting_seq(const PlanTarget& target, int sp, const OptionSet& options,
                            int64_t granule) {
  auto fits_at = [&](int64_t multiple) {
    try {
      const Config config = config_at(target, multiple * granule, sp, options.overrides);
      return fits(plan_memory(config, target.world_size, target.cpu_threads), target.budget_bytes);
    } catch (const ConfigError&) {
      return false;
    }
  };
  // seq_len is an int in the config: the search stays below 2^31 tokens.
  const int64_t most = (int64_t(1) << 31) / granule - 1;
  int64_t low = 0, high = 1;  // low fits (or is 0), high does not (or is past most)
  while (high <= most && fits_at(high)) {
    low = high;
    high *= 2;
  }
  high = std::min(high, most + 1);
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    (fits_at(middle) ? low : high) = middle;
  }
  return low * granule;
}

std::vector<RingSplit> ring_splits(const PlanTarget& target, int64_t seq_len, int sp) {
  std::vector<RingSplit> splits;
  for (int ring = 1; ring <= sp; ++ring) {
    if (sp % ring != 0) continue;
    RingSplit split;
    split.ring = ring;
    try {
      const Config config =
          config_at(target, seq_len, sp, {"parallel.ring=" + std::to_string(ring)});
      split.plan = plan_memory(config, target.world_size, target.cpu_threads);
      split.fits = fits(split.plan, target.budget_bytes);
    } catch (const std::exception& error) {
      split.error = error.what();
    }
    splits.push_back(split);
  }
  return splits;
}

LongestFits longest_fits(const PlanTarget& target, int sp, int64_t granule) {
  LongestFits result;
  const PlanPoint probe = plan_point(target, granule * sp, sp);
  result.verdict = probe.verdict;
  if (!result.verdict.empty()) return result;
  for (const OptionSet& options : option_ladder(probe.config, target.world_size)) {
    const Stopwatch clock;
    const int64_t longest = longest_fitting_seq(target, sp, options, granule * sp);
    result.fits.push_back({options, longest, clock.seconds()});
  }
  return result;
}

std::vector<std::string> distinct_overrides(const std::vector<std::string>& overrides) {
  std::vector<std::string> distinct;
  for (const std::string& text : overrides) {
    const std::string key = text.substr(0, text.find('='));
    auto same_key = [&](const std::string& seen) { return seen.substr(0, seen.find('=')) == key; };
    auto found = std::find_if(distinct.begin(), distinct.end(), same_key);
    if (found == distinct.end())
      distinct.push_back(text);
    else
      *found = text;
  }
  return distinct;
}

std::vector<std::string> divisibility_verdicts(const Config& config, int64_t seq_len, int sp) {
  const int heads = config.model.n_heads, kv = kv_heads_of(config);
  const int chunks = config.parallel.head_chunks;
  const int ring = config.parallel.ring;
  const bool with_ring = ring_divides(sp, ring);
  const int ulysses = ulysses_degree(sp, ring);
  const std::string degree = (with_ring ? "sp/ring " : "sp ") + std::to_string(ulysses);
  auto status = [](bool ok) { return ok ? std::string("ok") : std::string("REFUSED"); };
  std::vector<std::string> lines;
  lines.push_back("heads " + std::to_string(heads) + " % " + degree + ": " +
                  status(heads % ulysses == 0));
  const std::string kv_rule = kv % ulysses == 0   ? "split over the ranks"
                              : ulysses % kv == 0 ? "replicated (" + degree + " % kv heads == 0)"
                                                  : "neither divides the other";
  lines.push_back("kv heads " + std::to_string(kv) + " on " + degree + ": " + kv_rule + ": " +
                  status(kv % ulysses == 0 || ulysses % kv == 0));
  // The padding of docs/parallelism.md, "Any length under any sp": to a multiple of sp, and
  // with a ring of 2·ring too.
  const int64_t padded = padded_seq_len(seq_len, sp, with_ring ? ring : 1);
  const int64_t multiple = padding_multiple(sp, with_ring ? ring : 1);
  lines.push_back("seq_len " + std::to_string(seq_len) + " % " +
                  (with_ring ? std::to_string(multiple) + " (sp " + std::to_string(sp) +
                                   ", 2·ring " + std::to_string(2 * ring) + ")"
                             : "sp " + std::to_string(sp)) +
                  ": " +
                  (padded == seq_len ? std::string("ok") : "padded to " + std::to_string(padded)));
  if (heads_fit_ulysses(heads, kv, ulysses)) {
    const std::vector<int> valid = valid_head_chunks(heads, kv, ulysses);
    std::string choices;
    for (int u : valid) choices += (choices.empty() ? "" : ", ") + std::to_string(u);
    lines.push_back("head_chunks " + std::to_string(chunks) + " (valid: " + choices +
                    "): " + status(std::find(valid.begin(), valid.end(), chunks) != valid.end()));
  }
  return lines;
}

}  // namespace ulysses
