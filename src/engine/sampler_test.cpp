// The logits pipeline against hand-computed cases.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// A temperature so small that logit / T overflows acts as its limit T -> 0: all weight on the argmax (shared
// by tied maxima), whatever the sign of the logits; the draw then picks the argmax for every seed.
TEST(Sampler, TinyTemperatureActsAsGreedy) {
  const float large[5] = {1.0f, 5.0f, 4.0f, 10.0f, 7.0f};         // 10 / 1e-38 overflows
  const float negative[4] = {-5.0f, -3.0f, -9.0f, -4.0f};          // every -l / 1e-38 overflows to -inf
  const float tied[4] = {2.0f, 9.0f, 1.0f, 9.0f};
  for (float t : {1e-38f, 1e-45f /* subnormal: 1 / T is inf */}) {
    SamplingParams p;
    p.temperature = t;
    float probs[5];
    Sampler s5(5, p);
    s5.distribution(large, probs);
    EXPECT_EQ(probs[3], 1.0f) << t;
    EXPECT_EQ(probs[0] + probs[1] + probs[2] + probs[4], 0.0f) << t;
    Sampler s4(4, p);
    s4.distribution(negative, probs);
    EXPECT_EQ(probs[1], 1.0f) << t;
    EXPECT_EQ(probs[0] + probs[2] + probs[3], 0.0f) << t;
    s4.distribution(tied, probs);
    EXPECT_EQ(probs[1], 0.5f) << t;
    EXPECT_EQ(probs[3], 0.5f) << t;
    EXPECT_EQ(probs[0] + probs[2], 0.0f) << t;
    for (uint64_t seed = 0; seed < 50; ++seed) {
      p.seed = seed;
      Sampler drawn(5, p);
      drawn.distribution(large, probs);
      EXPECT_EQ(drawn.sample(probs), 3) << t << " seed " << seed;
    }
  }
}

// Ordinary temperatures keep the exact bits of softmax(l * (1/T) - max) computed as before the overflow
// guard (the speculative-sampling tests and seeded outputs depend on them).
TEST(Sampler, NormalTemperatureDistributionIsUnchangedBitForBit) {
  constexpr int64_t V = 257;
  std::vector<float> logits(V);
  for (int64_t i = 0; i < V; ++i) logits[i] = std::sin(0.37f * float(i)) * 12.0f - float(i % 7);
  for (float t : {0.05f, 0.7f, 1.0f, 1.3f, 40.0f}) {
    SamplingParams p;
    p.temperature = t;
    Sampler s(V, p);
    std::vector<float> got(V), want(V);
    s.distribution(logits.data(), got.data());
    const float inv_t = 1.0f / t;
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[i] * inv_t);
    double z = 0;
    for (int64_t i = 0; i < V; ++i) {
      volatile float scaled = logits[i] * inv_t;  // rounded as the library rounds it (no fused multiply-add)
      want[i] = std::exp(scaled - mx);
      z += want[i];
    }
    for (int64_t i = 0; i < V; ++i) want[i] = static_cast<float>(want[i] / z);
    double z2 = 0;  // the final renormalization (no filter is set, so it divides by the sum)
    for (int64_t i = 0; i < V; ++i) z2 += want[i];
    for (int64_t i = 0; i < V; ++i) want[i] = static_cast<float>(want[i] / z2);
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "T " << t << " id " << i;
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
