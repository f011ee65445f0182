// Choosing tokens from a model's logits, and autoregressive generation for
// `ulysses-train sample` (docs/evaluation.md). There is no KV cache: every new token reruns
// the forward pass over the whole context so far. That costs O(n²) forwards for n tokens,
// which is fine for looking at what a model learned, and reuses the trainer's forward as
// it is.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model.h"
#include "data/random.h"

namespace ulysses {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // draw among the k most likely tokens only; 0: all of them
  uint64_t seed = 0;
};

// Picks the next token from one row of logits: the most likely one at temperature 0 (the
// lower id on a tie), otherwise a draw from softmax(logits / temperature) over the top_k
// most likely tokens. The same seed and logits give the same tokens.
class TokenSampler {
 public:
  explicit TokenSampler(const SamplingOptions& options);
  int32_t next(const float* logits, int64_t vocab);

 private:
  SamplingOptions options_;
  SplitMix64 random_;
};

// The model's continuation of prompt by max_new_tokens tokens. model holds one sequence
// of context_len >= prompt.size() + max_new_tokens tokens on one rank; positions past the
// tokens so far hold token 0, which causal attention keeps from the logits read.
std::vector<int32_t> generate(Model& model, int64_t context_len, const std::vector<int32_t>& prompt,
                              int max_new_tokens, TokenSampler& sampler);

}  // namespace ulysses
