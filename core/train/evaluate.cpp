#include "core/train/evaluate.h"

#include <algorithm>
#include <utility>

#include "parallel/sequence_padding.h"

namespace ulysses {

MicroBatch read_micro_batch(Dataset& dataset, int64_t first_sequence, int64_t batch,
                            int64_t seq_len, int sp, int ring, int sp_rank) {
  const int64_t seq_local = padded_seq_local(seq_len, sp, ring);
  const bool padded = seq_local * sp > seq_len;
  MicroBatch micro;
  micro.batch = batch;
  micro.seq_local = seq_local;
  micro.pos_offset = int64_t(sp_rank) * seq_local;
  micro.inputs.assign(size_t(batch * seq_local), 0);
  micro.targets.assign(micro.inputs.size(), -1);
  const int64_t real = std::clamp<int64_t>(seq_len - micro.pos_offset, 0, seq_local);
  for (int64_t b = 0; b < batch; ++b) {
    dataset.read_slice(first_sequence + b, micro.pos_offset, real,
                       micro.inputs.data() + b * seq_local, micro.targets.data() + b * seq_local);
    if (!dataset.has_documents() && !padded) continue;
    std::vector<int64_t> starts = dataset.has_documents()
                                      ? dataset.document_starts(first_sequence + b)
                                      : std::vector<int64_t>{0};
    if (padded) starts.push_back(seq_len);
    micro.documents.starts.push_back(std::move(starts));
  }
  return micro;
}

EvalResult evaluate_model(Model& model, Dataset& dataset, const Mesh& mesh, int64_t batch_size,
                          int64_t seq_len, int steps) {
  double totals[3] = {0.0, 0.0, 0.0};  // loss sum, counted tokens, correct answers
  for (int e = 0; e < steps; ++e) {
    const int64_t first_sequence = (int64_t(e) * mesh.dp_size + mesh.dp_rank) * batch_size;
    const LossResult loss = model.evaluate(read_micro_batch(
        dataset, first_sequence, batch_size, seq_len, mesh.sp_size, mesh.ring_size, mesh.sp_rank));
    totals[0] += loss.loss_sum;
    totals[1] += double(loss.count);
    totals[2] += double(loss.correct);
  }
  mesh.world->all_reduce_host(totals, 3, ReduceOp::sum);
  EvalResult result;
  result.tokens = int64_t(totals[1]);
  result.loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  if (dataset.has_answers() && totals[1] > 0) result.accuracy = totals[2] / totals[1];
  return result;
}

QueryPlacement query_placement(const Dataset& dataset, int64_t sequences, int64_t seq_len, int sp,
                               int ring) {
  QueryPlacement placement;
  placement.keys_per_rank.assign(size_t(sp), 0);
  placement.asked_per_rank.assign(size_t(sp), 0);
  const int64_t seq_local = padded_seq_local(seq_len, sp, ring);
  for (int64_t index = 0; index < sequences; ++index) {
    for (const Dataset::Query& query : dataset.queries(index)) {
      const int64_t key_rank = query.key_at / seq_local, asking_rank = query.asked_at / seq_local;
      placement.keys_per_rank[size_t(key_rank)] += 1;
      placement.asked_per_rank[size_t(asking_rank)] += 1;
      placement.across_ranks += key_rank != asking_rank ? 1 : 0;
      placement.queries += 1;
    }
  }
  return placement;
}

std::string describe_placement(const QueryPlacement& placement) {
  std::string ranks, keys;
  for (size_t rank = 0; rank < placement.keys_per_rank.size(); ++rank) {
    ranks += (rank ? "/" : "") + std::to_string(rank);
    keys += (rank ? "/" : "") + std::to_string(placement.keys_per_rank[rank]);
  }
  std::string asked;
  for (size_t rank = 0; rank < placement.asked_per_rank.size(); ++rank)
    if (placement.asked_per_rank[rank] > 0)
      asked += (asked.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + ": " +
               std::to_string(placement.asked_per_rank[rank]);
  return "keys on sp ranks " + ranks + ": " + keys + ", queries asked by " + asked + "; " +
         std::to_string(placement.across_ranks) + " of " + std::to_string(placement.queries) +
         " answers need attention across ranks";
}

}  // namespace ulysses
