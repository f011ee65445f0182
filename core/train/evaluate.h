// Evaluation of a model on a split, sharded like training: each dp rank reads its own
// sequences of every batch, each sp rank its slice of them (docs/evaluation.md). The
// trainer's periodic evaluation (train.eval_every) and `ulysses-train eval` both run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "data/dataset.h"
#include "parallel/mesh.h"

namespace ulysses {

struct EvalResult {
  double loss = 0.0;       // mean cross-entropy over the counted tokens
  double accuracy = -1.0;  // answer accuracy when the data has answers, else -1
  int64_t tokens = 0;      // counted tokens (targets >= 0) over every rank
};

// This rank's slice (sp_rank · seq_local onwards, seq_local = padded_seq_local of
// parallel/sequence_padding.h) of `batch` consecutive sequences from first_sequence, with the
// document starts of each whole sequence when the data has documents. Padding past seq_len is
// token 0 with no target, and forms a document of its own: its positions start at 0 and nothing
// real attends to it.
MicroBatch read_micro_batch(Dataset& dataset, int64_t first_sequence, int64_t batch,
                            int64_t seq_len, int sp, int ring, int sp_rank);

// Collective over mesh.world: `steps` batches of batch_size sequences per dp rank, the
// sequences of batch e being (e · dp + dp_rank) · batch_size onwards, so every run over
// the same mesh reads the same sequences.
EvalResult evaluate_model(Model& model, Dataset& dataset, const Mesh& mesh, int64_t batch_size,
                          int64_t seq_len, int steps);

// Synthetic data: which sp rank's slice holds each queried key and which asks the query, over
// the first `sequences` sequences, so the log can say how many answers needed attention
// across ranks (docs/evaluation.md).
struct QueryPlacement {
  std::vector<int64_t> keys_per_rank;   // [sp]
  std::vector<int64_t> asked_per_rank;  // [sp]
  int64_t across_ranks = 0;             // queries whose key sits on another rank
  int64_t queries = 0;
};
QueryPlacement query_placement(const Dataset& dataset, int64_t sequences, int64_t seq_len, int sp,
                               int ring);
// "keys on sp ranks 0/1/2/3: 17/15/16/16, queries asked by rank 3: 64; 48 of 64 answers need
// attention across ranks"
std::string describe_placement(const QueryPlacement& placement);

}  // namespace ulysses
