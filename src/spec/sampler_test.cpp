// The logits pipeline against hand-computed cases.
#include "spec/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace nextn {
namespace {

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(5, p);
  TokenHistory h;
  h.reset(5, {1, 3});  // prompt tokens count for the repetition penalty
  float logits[5] = {1.0f, 4.0f, -2.0f, -3.0f, 0.5f};
  s.apply_penalties(logits, h);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 2.0f);   // 4 / 2
  EXPECT_FLOAT_EQ(logits[2], -2.0f);
  EXPECT_FLOAT_EQ(logits[3], -6.0f);  // -3 * 2
  EXPECT_FLOAT_EQ(logits[4], 0.5f);
}

TEST(Sampler, PresenceAndFrequencyCountOutputTokensOnly) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(4, p);
  TokenHistory h;
  h.reset(4, {0, 0});  // prompt: no presence/frequency effect
  h.push(2);
  h.push(2);
  h.push(3);
  float logits[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  s.apply_penalties(logits, h);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.5f - 0.25f * 2);
  EXPECT_FLOAT_EQ(logits[3], 1.0f - 0.5f - 0.25f * 1);
  h.pop(3);  // speculative rows are undone exactly
  float again[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  s.apply_penalties(again, h);
  EXPECT_FLOAT_EQ(again[3], 1.0f);
}

TEST(Sampler, TemperatureTopKTopPMinP) {
  // logits ln(4), ln(3), ln(2), ln(1): softmax at T=1 is 0.4, 0.3, 0.2, 0.1
  const float logits[4] = {std::log(4.0f), std::log(3.0f), std::log(2.0f), 0.0f};
  float probs[4];
  {
    SamplingParams p;
    p.temperature = 1.0f;
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_NEAR(probs[0], 0.4, 1e-6);
    EXPECT_NEAR(probs[3], 0.1, 1e-6);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 2;  // 0.4, 0.3 -> 4/7, 3/7
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_NEAR(probs[0], 4.0 / 7, 1e-6);
    EXPECT_NEAR(probs[1], 3.0 / 7, 1e-6);
    EXPECT_EQ(probs[2], 0.0f);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 0.65f;  // 0.4 + 0.3 reaches 0.65 -> keep two
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_NEAR(probs[1], 3.0 / 7, 1e-6);
    EXPECT_EQ(probs[2], 0.0f);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.6f;  // floor 0.24: keeps 0.4 and 0.3
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_NEAR(probs[0], 4.0 / 7, 1e-6);
    EXPECT_EQ(probs[2], 0.0f);
  }
  {
    SamplingParams p;
    p.temperature = 0.5f;  // logits*2: 16, 9, 4, 1 over 30
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_NEAR(probs[0], 16.0 / 30, 1e-6);
    EXPECT_NEAR(probs[3], 1.0 / 30, 1e-6);
  }
  {
    SamplingParams p;  // greedy: one-hot at the argmax
    Sampler s(4, p);
    s.distribution(logits, probs);
    EXPECT_EQ(probs[0], 1.0f);
    EXPECT_EQ(probs[1] + probs[2] + probs[3], 0.0f);
  }
}

TEST(Sampler, SamplingIsDeterministicForASeedAndFollowsTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  const float probs[3] = {0.5f, 0.3f, 0.2f};
  Sampler a(3, p), b(3, p);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 20000; ++i) {
    int32_t x = a.sample(probs);
    ASSERT_EQ(x, b.sample(probs));
    ++counts[x];
  }
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.015);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.015);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.015);
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  try {
    p.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p = SamplingParams{};
  p.temperature = -1;
  EXPECT_THROW(p.validate(), Error);
  p = SamplingParams{};
  p.repetition_penalty = 0;
  EXPECT_THROW(p.validate(), Error);
}

}  // namespace
}  // namespace nextn
