#include "core/evaluate.h"

namespace ulysses {

MicroBatch read_micro_batch(Dataset& dataset, int64_t first_sequence, int64_t batch,
                            int64_t seq_local, int sp_rank) {
  MicroBatch micro;
  micro.batch = batch;
  micro.seq_local = seq_local;
  micro.pos_offset = int64_t(sp_rank) * seq_local;
  micro.inputs.resize(size_t(batch * seq_local));
  micro.targets.resize(micro.inputs.size());
  for (int64_t b = 0; b < batch; ++b)
    dataset.read_slice(first_sequence + b, micro.pos_offset, seq_local,
                       micro.inputs.data() + b * seq_local, micro.targets.data() + b * seq_local);
  return micro;
}

EvalResult evaluate_model(Model& model, Dataset& dataset, const Mesh& mesh, int64_t batch_size,
                          int64_t seq_local, int steps) {
  double totals[3] = {0.0, 0.0, 0.0};  // loss sum, counted tokens, correct answers
  for (int e = 0; e < steps; ++e) {
    const int64_t first_sequence = (int64_t(e) * mesh.dp_size + mesh.dp_rank) * batch_size;
    const LossResult loss = model.evaluate(
        read_micro_batch(dataset, first_sequence, batch_size, seq_local, mesh.sp_rank));
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

}  // namespace ulysses
