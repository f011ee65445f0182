// The rules between a config and the job it runs in: the world size, sp, ring and head
// chunks (validate_for_world), and where the sequence is padded (docs/parallelism.md).
#include <algorithm>

#include "core/config/config.h"
#include "core/config/config_error.h"
#include "core/config/config_reader.h"
#include "core/config/seq_len_schedule.h"
#include "parallel/head_chunks.h"
#include "parallel/sequence_padding.h"

namespace ulysses {

bool has_padding(const Config& config) {
  const auto padded = [&](int64_t length) {
    return padded_seq_len(length, config.parallel.sp, config.parallel.ring) != length;
  };
  if (padded(config.train.seq_len)) return true;
  for (const SeqLenStage& stage : parse_seq_len_schedule(config.train.seq_len_schedule))
    if (padded(stage.seq_len)) return true;
  return false;
}

bool attention_has_documents(const Config& config) {
  return config.data.documents == DataDocuments::eos || has_padding(config);
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
                      join_choices(divisors_of(world_size)) +
                      " (--set parallel.sp=...), or start a multiple of " + std::to_string(sp) +
                      " ranks (mpirun -np " + std::to_string(sp) + ")");
  }
  const int ring = config.parallel.ring;
  if (sp % ring != 0)
    throw ConfigError("parallel.ring=" + std::to_string(ring) + " does not divide parallel.sp=" +
                      std::to_string(sp) + "; ring can be " + join_choices(divisors_of(sp)));
  // The head rules bind the Ulysses degree sp / ring only (heads are not split by the ring).
  const int ulysses = sp / ring;
  if (ring > 1 && !heads_fit_ulysses(n_heads, n_kv_heads, ulysses)) {
    std::vector<std::string> working;
    for (int r = 1; r <= sp; ++r)
      if (sp % r == 0 && heads_fit_ulysses(n_heads, n_kv_heads, sp / r))
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
  // Any train.seq_len works: a length sp (and with a ring 2·ring) does not divide is padded
  // (docs/parallelism.md, "Any length under any sp"), masked as a document of its own, which
  // cuDNN's attention here cannot do.
  if (config.kernels.attention == AttentionKernel::cudnn && has_padding(config)) {
    const int64_t multiple = padding_multiple(sp, ring);
    throw ConfigError("kernels.attention: cudnn cannot mask the padding of train.seq_len=" +
                      std::to_string(config.train.seq_len) + " (or a train.seq_len_schedule " +
                      "stage) on parallel.sp=" + std::to_string(sp) +
                      (ring > 1 ? " with parallel.ring=" + std::to_string(ring) : std::string()) +
                      "; use a multiple of " + std::to_string(multiple) +
                      ", or kernels.attention: native or auto");
  }
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

}  // namespace ulysses
