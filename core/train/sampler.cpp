#include "core/train/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ulysses {

TokenSampler::TokenSampler(const SamplingOptions& options)
    : options_(options), random_(options.seed) {
  if (!(options.temperature >= 0.0))
    throw std::invalid_argument("temperature must be >= 0, got " +
                                std::to_string(options.temperature));
  if (options.top_k < 0)
    throw std::invalid_argument("top_k must be >= 0, got " + std::to_string(options.top_k));
}

int32_t TokenSampler::next(const float* logits, int64_t vocab) {
  // Token ids by decreasing logit, the lower id first on a tie.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const size_t k =
      options_.top_k > 0 ? std::min(size_t(options_.top_k), order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(k), order.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  if (options_.temperature == 0.0 || k == 1) return order[0];

  std::vector<double> weights(k);
  double total = 0.0;
  for (size_t i = 0; i < k; ++i) {
    weights[i] =
        std::exp((double(logits[order[i]]) - double(logits[order[0]])) / options_.temperature);
    total += weights[i];
  }
  const double uniform = double(random_.next() >> 11) * 0x1.0p-53;  // in [0, 1)
  double threshold = uniform * total;
  for (size_t i = 0; i < k; ++i) {
    threshold -= weights[i];
    if (threshold < 0.0) return order[i];
  }
  return order[k - 1];  // round-off left the threshold at the very end
}

std::vector<int32_t> generate(Model& model, int64_t context_len, const std::vector<int32_t>& prompt,
                              int max_new_tokens, TokenSampler& sampler) {
  if (prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  if (int64_t(prompt.size()) + max_new_tokens > context_len)
    throw std::invalid_argument("the prompt and the new tokens do not fit the context");
  MicroBatch context;
  context.batch = 1;
  context.seq_local = context_len;
  context.inputs.assign(size_t(context_len), 0);
  context.targets.assign(size_t(context_len), -1);
  std::copy(prompt.begin(), prompt.end(), context.inputs.begin());
  int64_t length = int64_t(prompt.size());
  std::vector<int32_t> continuation;
  for (int i = 0; i < max_new_tokens; ++i) {
    const std::vector<float> logits = model.logits(context, {length - 1});
    const int32_t token = sampler.next(logits.data(), int64_t(logits.size()));
    continuation.push_back(token);
    context.inputs[size_t(length++)] = token;
  }
  return continuation;
}

}  // namespace ulysses
