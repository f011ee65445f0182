// TokenSampler (core/train/sampler.h) on hand-made logits: greedy, top-k, temperature and seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/train/sampler.h"

namespace ulysses {
namespace {

std::vector<int32_t> draws(const SamplingOptions& options, const std::vector<float>& logits,
                           int count) {
  TokenSampler sampler(options);
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i)
    tokens.push_back(sampler.next(logits.data(), int64_t(logits.size())));
  return tokens;
}

TEST(TokenSampler, GreedyPicksTheLargestLogitAndTheLowerIdOnATie) {
  EXPECT_EQ(draws({0.0, 0, 1}, {0.5f, -1.0f, 2.5f, 0.1f}, 1), std::vector<int32_t>{2});
  EXPECT_EQ(draws({0.0, 0, 1}, {0.5f, 3.0f, -1.0f, 3.0f}, 1), std::vector<int32_t>{1});
}

TEST(TokenSampler, TopKOfOneIsGreedyAtAnyTemperature) {
  const std::vector<float> logits = {0.2f, 0.1f, 0.25f, 0.0f};
  EXPECT_EQ(draws({5.0, 1, 9}, logits, 50), std::vector<int32_t>(50, 2));
}

TEST(TokenSampler, DrawsOnlyAmongTheTopKInProportionToTheSoftmax) {
  // Top 2 of these: ids 3 and 1, with probabilities e^1 / (e^1 + e^0) and the rest.
  const std::vector<float> logits = {-1.0f, 0.0f, -2.0f, 1.0f, -0.5f};
  const int count = 20000;
  const std::vector<int32_t> tokens = draws({1.0, 2, 42}, logits, count);
  int threes = 0;
  for (int32_t token : tokens) {
    ASSERT_TRUE(token == 3 || token == 1) << token;
    threes += token == 3;
  }
  const double expected = std::exp(1.0) / (std::exp(1.0) + 1.0);  // 0.731
  // 5 standard deviations of the binomial share.
  EXPECT_NEAR(double(threes) / count, expected, 5.0 * std::sqrt(expected * (1 - expected) / count));
}

TEST(TokenSampler, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = {0.0f, 1.0f};
  auto share_of_one = [&](double temperature) {
    int ones = 0;
    for (int32_t token : draws({temperature, 0, 7}, logits, 4000)) ones += token == 1;
    return ones / 4000.0;
  };
  EXPECT_GT(share_of_one(0.2), 0.97);   // e^5 / (1 + e^5) = 0.993
  EXPECT_LT(share_of_one(20.0), 0.60);  // e^0.05 / (1 + e^0.05) = 0.512
  EXPECT_GT(share_of_one(1.0), share_of_one(20.0));
}

TEST(TokenSampler, TheSameSeedDrawsTheSameTokensAnotherSeedOthers) {
  const std::vector<float> logits(50, 0.0f);  // uniform: every draw is the seed's doing
  EXPECT_EQ(draws({1.0, 0, 11}, logits, 40), draws({1.0, 0, 11}, logits, 40));
  EXPECT_NE(draws({1.0, 0, 11}, logits, 40), draws({1.0, 0, 12}, logits, 40));
}

TEST(TokenSampler, RefusesANegativeTemperatureOrTopK) {
  EXPECT_THROW(TokenSampler({-0.5, 0, 0}), std::invalid_argument);
  EXPECT_THROW(TokenSampler({1.0, -1, 0}), std::invalid_argument);
}

}  // namespace
}  // namespace ulysses
