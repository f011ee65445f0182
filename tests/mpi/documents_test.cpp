// Packed documents (docs/parallelism.md, "Packed documents") through the whole model, on sp
// groups of every size the world allows: a sequence of four documents gives each document
// the loss and the gradients it has alone (within 1e-6, relative), and a document's loss and
// gradients are the same bits whatever another document holds (no leakage), for llama with
// grouped-query attention, with head stages and overlap, and for gpt2 (learned positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/train/evaluate.h"
#include "parallel/head_chunks.h"
#include "parallel/mesh.h"
#include "parallel/sequence_padding.h"
#include "tests/mpi/mpi_testing.h"
#include "tests/mpi/trainer_testing.h"

namespace ulysses {
namespace {

constexpr int64_t kSeqLen = 64;
// Four documents; every length is a multiple of 4, so each one alone splits over sp 4 too.
const std::vector<int64_t> kStarts = {0, 20, 32, 56};

Config documents_config(const std::string& family, int sp) {
  const std::string kv = family == "llama" ? ", n_kv_heads: 2" : "";
  return parse_config("model: {family: " + family + ", n_layers: 2, d_model: 32, n_heads: 4" + kv +
                          ", d_ff: 48, vocab_size: 96, max_seq_len: 64}\n"
                          "train: {batch_size: 1, seq_len: 64, seed: 9}\n"
                          "parallel: {sp: " +
                          std::to_string(sp) + "}\n",
                      {}, "documents.yaml");
}

std::vector<int32_t> packed_tokens(uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(kSeqLen));
  uint64_t state = seed;
  for (int32_t& token : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    token = int32_t((state >> 33) % 40);
  }
  return tokens;
}

// The loss (sum over the sp group) and the gradient (summed over the sp group) of the tokens
// of one document, with every other target not counted.
struct DocumentResult {
  double loss_sum = 0.0;
  std::vector<double> gradient;
};

// tokens[first, end) of a sequence of seq_len tokens given to one model: with `documents`
// the whole packed sequence, only [first, end) scored; without, the document alone.
DocumentResult run_document(Backend& backend, const Config& config, Mesh& mesh,
                            const std::vector<int32_t>& sequence, const Documents& documents,
                            int64_t first, int64_t end) {
  const int64_t seq_len = int64_t(sequence.size()), seq_local = seq_len / mesh.sp_size;
  std::vector<int32_t> targets(size_t(seq_len), -1);
  for (int64_t t = first; t + 1 < end; ++t) targets[size_t(t)] = sequence[size_t(t + 1)];
  MicroBatch batch;
  batch.batch = 1;
  batch.seq_local = seq_local;
  batch.pos_offset = int64_t(mesh.sp_rank) * seq_local;
  batch.inputs.assign(sequence.begin() + batch.pos_offset,
                      sequence.begin() + batch.pos_offset + seq_local);
  batch.targets.assign(targets.begin() + batch.pos_offset,
                       targets.begin() + batch.pos_offset + seq_local);
  batch.documents = documents;

  Model model(config, backend, *mesh.sp, *mesh.sp, 1, seq_local);
  model.init_weights(uint64_t(config.train.seed));
  model.zero_grads();
  DocumentResult result;
  result.loss_sum = model.forward_backward(batch, 1.0f).loss_sum;
  mesh.sp->all_reduce_host(&result.loss_sum, 1, ReduceOp::sum);
  std::vector<float> local(size_t(model.num_params()));
  model.download_gradients(local.data());
  result.gradient.assign(local.begin(), local.end());
  mesh.sp->all_reduce_host(result.gradient.data(), int(result.gradient.size()), ReduceOp::sum);
  return result;
}

// The whole of `sequence` scored (each token against the next; the last against
// `last_target`) on the sp group of mesh, padded as read_micro_batch pads a length sp does
// not divide; documents are the sequence's own starts ({0}: one document).
DocumentResult run_padded(Backend& backend, const Config& config, Mesh& mesh,
                          const std::vector<int32_t>& sequence, std::vector<int64_t> starts,
                          int32_t last_target) {
  const int64_t seq_len = int64_t(sequence.size());
  const int64_t seq_local = padded_seq_local(seq_len, mesh.sp_size, mesh.ring_size);
  const int64_t padded_len = seq_local * mesh.sp_size;
  std::vector<int32_t> inputs(static_cast<size_t>(padded_len), 0);
  std::vector<int32_t> targets(static_cast<size_t>(padded_len), -1);
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[size_t(t)] = sequence[size_t(t)];
    targets[size_t(t)] = t + 1 < seq_len ? sequence[size_t(t + 1)] : last_target;
  }
  if (padded_len > seq_len) starts.push_back(seq_len);
  MicroBatch batch;
  batch.batch = 1;
  batch.seq_local = seq_local;
  batch.pos_offset = int64_t(mesh.sp_rank) * seq_local;
  batch.inputs.assign(inputs.begin() + batch.pos_offset,
                      inputs.begin() + batch.pos_offset + seq_local);
  batch.targets.assign(targets.begin() + batch.pos_offset,
                       targets.begin() + batch.pos_offset + seq_local);
  if (starts.size() > 1) batch.documents.starts = {starts};

  Model model(config, backend, *mesh.sp, *mesh.sp, 1, seq_local);
  model.init_weights(uint64_t(config.train.seed));
  model.zero_grads();
  DocumentResult result;
  result.loss_sum = model.forward_backward(batch, 1.0f).loss_sum;
  mesh.sp->all_reduce_host(&result.loss_sum, 1, ReduceOp::sum);
  std::vector<float> local(size_t(model.num_params()));
  model.download_gradients(local.data());
  result.gradient.assign(local.begin(), local.end());
  mesh.sp->all_reduce_host(result.gradient.data(), int(result.gradient.size()), ReduceOp::sum);
  return result;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double difference = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = std::max(difference, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return difference / scale;
}

class PackedDocuments : public testing::MpiTest {
 protected:
  // sp groups of the whole world, of 2 ranks (where that is a smaller group) and of 1.
  std::vector<int> sp_sizes() {
    std::vector<int> sizes = {world().size()};
    if (world().size() > 2) sizes.push_back(2);
    if (world().size() > 1) sizes.push_back(1);
    return sizes;
  }
};

struct Variant {
  std::string family;
  int head_chunks;
  bool overlap;
  std::string name() const {
    return family + (head_chunks > 1 ? " head_chunks " + std::to_string(head_chunks) : "") +
           (overlap ? " overlap" : "");
  }
};

const std::vector<Variant> kVariants = {
    {"llama", 1, false}, {"llama", 2, false}, {"llama", 1, true}, {"gpt2", 1, false}};

TEST_F(PackedDocuments, EachDocumentOfAPackedSequenceTrainsAsItWouldAlone) {
  const std::vector<int32_t> sequence = packed_tokens(5);
  const Documents packed{{kStarts}};
  for (const Variant& variant : kVariants) {
    for (int sp : sp_sizes()) {
      Config config = documents_config(variant.family, sp);
      config.parallel.head_chunks = variant.head_chunks;
      config.parallel.overlap = variant.overlap;
      if (variant.head_chunks > 1 &&
          std::ranges::count(valid_head_chunks(4, config.model.n_kv_heads, sp),
                             variant.head_chunks) == 0)
        continue;  // too few heads per rank for the stages
      Mesh mesh = make_mesh(world(), sp);
      auto backend = testing::make_test_cpu_backend();
      for (size_t d = 0; d < kStarts.size(); ++d) {
        const int64_t first = kStarts[d];
        const int64_t end = d + 1 < kStarts.size() ? kStarts[d + 1] : kSeqLen;
        const DocumentResult in_pack =
            run_document(*backend, config, mesh, sequence, packed, first, end);
        const std::vector<int32_t> alone_tokens(sequence.begin() + first, sequence.begin() + end);
        const DocumentResult alone =
            run_document(*backend, config, mesh, alone_tokens, Documents{}, 0, end - first);
        const std::string what =
            variant.name() + " sp " + std::to_string(sp) + " document " + std::to_string(d);
        // Both sum the same per-token terms; only attention's tiles and the GEMMs' row counts
        // group the fp32 sums differently (docs/design.md, "Bits that do not depend on the
        // machine"), which stays far below 1e-6 of the values.
        EXPECT_LE(std::abs(in_pack.loss_sum - alone.loss_sum), 1e-6 * std::abs(alone.loss_sum))
            << what << ": " << in_pack.loss_sum << " packed, " << alone.loss_sum << " alone";
        EXPECT_LE(relative_difference(in_pack.gradient, alone.gradient), 1e-6) << what;
      }
    }
  }
}

TEST_F(PackedDocuments, NothingOfOneDocumentReachesAnother) {
  const std::vector<int32_t> sequence = packed_tokens(5);
  const Documents packed{{kStarts}};
  // Document 1 ([20, 32)) gets other tokens; every other document's loss and gradient must
  // stay the same bits, both before it (causality alone) and after it (the document mask).
  std::vector<int32_t> changed = sequence;
  for (int64_t t = kStarts[1]; t < kStarts[2]; ++t)
    changed[size_t(t)] = (changed[size_t(t)] + 7) % 40;
  for (const Variant& variant : kVariants) {
    for (int sp : sp_sizes()) {
      Config config = documents_config(variant.family, sp);
      config.parallel.head_chunks = variant.head_chunks;
      config.parallel.overlap = variant.overlap;
      if (variant.head_chunks > 1 &&
          std::ranges::count(valid_head_chunks(4, config.model.n_kv_heads, sp),
                             variant.head_chunks) == 0)
        continue;
      Mesh mesh = make_mesh(world(), sp);
      auto backend = testing::make_test_cpu_backend();
      for (size_t d : {size_t(0), size_t(2), size_t(3)}) {
        const int64_t first = kStarts[d];
        const int64_t end = d + 1 < kStarts.size() ? kStarts[d + 1] : kSeqLen;
        const DocumentResult base =
            run_document(*backend, config, mesh, sequence, packed, first, end);
        const DocumentResult other =
            run_document(*backend, config, mesh, changed, packed, first, end);
        const std::string what =
            variant.name() + " sp " + std::to_string(sp) + " document " + std::to_string(d);
        EXPECT_EQ(base.loss_sum, other.loss_sum) << what;
        EXPECT_TRUE(base.gradient == other.gradient) << what << ": the gradient changed";
      }
      // The changed document itself does see its own tokens (the test can fail).
      const DocumentResult base = run_document(*backend, config, mesh, sequence, packed, 20, 32);
      const DocumentResult other = run_document(*backend, config, mesh, changed, packed, 20, 32);
      EXPECT_NE(base.loss_sum, other.loss_sum) << variant.name() << " sp " << sp;
    }
  }
}

TEST_F(PackedDocuments, LengthsSpDoesNotDivideTrainAsOnOneRank) {
  const int sp = world().size();
  const std::vector<int32_t> tokens = packed_tokens(11);
  int compared = 0;
  for (const std::string family : {"llama", "gpt2"}) {
    const Config config = documents_config(family, sp);
    Mesh one = make_mesh(world(), 1);
    Mesh group = make_mesh(world(), sp);
    auto backend = testing::make_test_cpu_backend();
    // Lengths 1, sp - 1 and sp + 1 (padded by sp - 1, 1 and sp - 1 tokens), and a packed
    // sequence of 4·sp + 1 tokens in two documents.
    const std::vector<int64_t> lengths = {1, sp - 1, sp + 1, 4 * sp + 1};
    for (int64_t length : lengths) {
      if (length < 1) continue;
      const std::vector<int32_t> sequence(tokens.begin(), tokens.begin() + length);
      const std::vector<int64_t> starts =
          length > 4 ? std::vector<int64_t>{0, length / 2} : std::vector<int64_t>{0};
      const DocumentResult alone = run_padded(*backend, config, one, sequence, starts, 3);
      const DocumentResult padded = run_padded(*backend, config, group, sequence, starts, 3);
      const std::string what =
          family + " length " + std::to_string(length) + " on sp " + std::to_string(sp);
      // The padding's rows carry no loss and their gradients are exact zeros; only the
      // grouping of fp32 sums differs (as in the test above).
      EXPECT_LE(std::abs(padded.loss_sum - alone.loss_sum), 1e-6 * std::abs(alone.loss_sum))
          << what << ": " << padded.loss_sum << " padded, " << alone.loss_sum << " alone";
      EXPECT_LE(relative_difference(padded.gradient, alone.gradient), 1e-6) << what;
      ++compared;
    }
  }
  EXPECT_GE(compared, 6);
}

}  // namespace
}  // namespace ulysses
