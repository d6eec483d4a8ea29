// The logits pipeline against hand-computed cases.
#include "engine/sampler.h"
#include "engine/request.h"
#include "ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
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
  s.adjust_logits(logits, h);
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
  s.adjust_logits(logits, h);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.5f - 0.25f * 2);
  EXPECT_FLOAT_EQ(logits[3], 1.0f - 0.5f - 0.25f * 1);
  h.pop(3);  // speculative rows are undone exactly
  float again[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  s.adjust_logits(again, h);
  EXPECT_FLOAT_EQ(again[3], 1.0f);
}

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  SamplingParams p;
  p.logit_bias = {{0, 3.0f}, {2, -100.0f}};
  p.repetition_penalty = 2.0f;
  Sampler s(4, p);
  EXPECT_TRUE(s.adjusts_logits());
  p.temperature = 0.0f;
  EXPECT_FALSE(Sampler(4, p).raw_argmax_decides());  // (greedy with a bias: the biased argmax, not the raw one)
  TokenHistory h;
  h.reset(4, {0});  // token 0 seen: the repetition penalty divides its biased logit
  float logits[4] = {1.0f, 1.5f, 5.0f, 0.0f};
  s.adjust_logits(logits, h);
  EXPECT_FLOAT_EQ(logits[0], (1.0f + 3.0f) / 2.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);
  EXPECT_FLOAT_EQ(logits[2], 5.0f - 100.0f);
  EXPECT_FLOAT_EQ(logits[3], 0.0f);
  EXPECT_EQ(Sampler::argmax(logits, 4), 0);
  SamplingParams bad;
  bad.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(Sampler(4, bad), Error);  // outside the vocabulary
  bad.logit_bias = {{1, 100.5f}};
  EXPECT_THROW(bad.validate(), Error);
  bad.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(bad.validate(), Error);
}

TEST(Sampler, MinTokensBansTheStopIdsUntilThatManyOutputTokens) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {1, 3};
  Sampler s(4, p);
  EXPECT_FALSE(s.raw_argmax_decides());
  TokenHistory h;
  h.reset(4, {1, 1, 1});  // (prompt tokens do not count)
  auto adjusted = [&] {
    std::vector<float> l = {0.5f, 2.0f, 1.0f, 3.0f};
    s.adjust_logits(l.data(), h);
    return l;
  };
  EXPECT_EQ(adjusted(), (std::vector<float>{0.5f, -INFINITY, 1.0f, -INFINITY}));
  h.push(0);
  EXPECT_EQ(adjusted()[3], -INFINITY);
  h.push(2);
  EXPECT_EQ(adjusted(), (std::vector<float>{0.5f, 2.0f, 1.0f, 3.0f}));
  h.pop(2);  // (a rejected draft row: banned again)
  EXPECT_EQ(adjusted()[1], -INFINITY);
  SamplingParams no_stop_ids;
  no_stop_ids.min_tokens = 5;
  EXPECT_TRUE(Sampler(4, no_stop_ids).raw_argmax_decides());  // (nothing to ban)
  no_stop_ids.min_tokens = -1;
  EXPECT_THROW(no_stop_ids.validate(), Error);
  no_stop_ids.min_tokens = no_stop_ids.max_tokens + 1;  // (more than it may generate: refused, not ignored)
  EXPECT_THROW(no_stop_ids.validate(), Error);
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

// Ordinary temperatures give softmax(l · (1/T) - max) with the vectorized exp and sum of ops (the bits the
// speculative-sampling tests and seeded outputs depend on, the same on every call), within 2e-6 of the
// softmax computed in double.
TEST(Sampler, NormalTemperatureDistributionIsTheSoftmaxBitForBit) {
  for (int64_t V : {257, 4099}) {
    std::vector<float> logits(V);
    for (int64_t i = 0; i < V; ++i) logits[i] = std::sin(0.37f * float(i)) * 12.0f - float(i % 7);
    for (float t : {0.05f, 0.7f, 1.0f, 1.3f, 40.0f}) {
      SamplingParams p;
      p.temperature = t;
      Sampler s(V, p);
      std::vector<float> got(V), want(V);
      s.distribution(logits.data(), got.data());
      const float inv_t = 1.0f / t;
      const float mx = *std::max_element(logits.begin(), logits.end()) * inv_t;
      const double z = ops::exp_scaled_sum(logits.data(), V, inv_t, mx, want.data());
      for (int64_t i = 0; i < V; ++i) want[i] = static_cast<float>(want[i] / z);
      const double z2 = ops::sum_as_double(want.data(), V);  // the final renormalization (no filter: by the sum)
      for (int64_t i = 0; i < V; ++i) want[i] = static_cast<float>(want[i] / z2);
      // (each exponent's argument rounded in float, as the kernel and the library's expf before it had it)
      auto arg = [&](int64_t i) {
        volatile float scaled = logits[i] * inv_t;  // (no fused multiply-add)
        return double(scaled - mx);
      };
      double exact_z = 0;
      for (int64_t i = 0; i < V; ++i) exact_z += std::exp(arg(i));
      for (int64_t i = 0; i < V; ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "T " << t << " id " << i;
        const double exact = std::exp(arg(i)) / exact_z;
        ASSERT_NEAR(got[i], exact, 2e-6 * exact + 1e-37) << "T " << t << " id " << i;
      }
    }
  }
}

// The definition of the top-k / top-p cut that distribution() must keep bit for bit: the whole vocabulary sorted
// by descending probability (ties by ascending id), as the sampler did before it sorted only the head.
void reference_cut(const SamplingParams& p, float* probs, int64_t V) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
  std::sort(order.begin(), order.end(),
            [probs](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  int64_t keep = V;
  if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
  if (p.top_p < 1.0f) {
    double cum = 0;
    int64_t n = 0;
    for (; n < keep; ++n) {
      cum += probs[order[size_t(n)]];
      if (cum >= p.top_p) {
        ++n;
        break;
      }
    }
    keep = std::min(keep, std::max<int64_t>(n, 1));
  }
  for (int64_t i = keep; i < V; ++i) probs[order[size_t(i)]] = 0.0f;
}

// Logits of one of six kinds for the cut's test: broad, few distinct values (ties), flat (every token tied),
// peaked, masked tokens (-inf, as an output format leaves them) and so spread that probabilities underflow.
std::vector<float> test_logits(int64_t V, int pattern, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) {
    const float g = normal(rng);
    switch (pattern) {
      case 0: logits[size_t(i)] = 3.0f * g; break;
      case 1: logits[size_t(i)] = std::round(2.0f * g); break;
      case 2: logits[size_t(i)] = 0.5f; break;
      case 3: logits[size_t(i)] = (i % 97 == 3 ? 25.0f : 0.0f) + g; break;
      case 4: logits[size_t(i)] = i % 3 == 0 && i > 0 ? -INFINITY : 2.0f * g; break;
      default: logits[size_t(i)] = 60.0f * g; break;
    }
  }
  return logits;
}

// distribution(logits) against the definition: the softmax, the full-sort cut, min-p, the renormalization.
void expect_cut_as_defined(const std::vector<float>& logits, const SamplingParams& p) {
  const int64_t V = int64_t(logits.size());
  Sampler s(V, p);
  std::vector<float> got(static_cast<size_t>(V)), want(static_cast<size_t>(V));
  s.distribution(logits.data(), got.data());
  const float inv_t = 1.0f / p.temperature;
  const float mx = *std::max_element(logits.begin(), logits.end()) * inv_t;
  const double z = ops::exp_scaled_sum(logits.data(), V, inv_t, mx, want.data());
  for (float& q : want) q = static_cast<float>(q / z);
  reference_cut(p, want.data(), V);
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * *std::max_element(want.begin(), want.end());
    for (float& q : want)
      if (q < floor) q = 0.0f;
  }
  const double sum = ops::sum_as_double(want.data(), V);
  for (float& q : want) q = static_cast<float>(q / sum);
  for (int64_t i = 0; i < V; ++i)
    ASSERT_EQ(std::memcmp(&got[size_t(i)], &want[size_t(i)], 4), 0)
        << "V " << V << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p "
        << p.min_p << " id " << i << ": " << got[size_t(i)] << " vs " << want[size_t(i)];
}

// The cut sorts only the head of the order (sampler.cpp): it must keep what sorting every token keeps, bit
// for bit, over small vocabularies with every setting, and over a real checkpoint's with the common ones.
TEST(Sampler, TopKTopPCutMatchesTheFullSortBitForBit) {
  std::mt19937 rng(7);
  int cases = 0;
  for (int64_t V : {1, 2, 5, 257, 4096, 32000, 129280}) {
    const bool large = V > 4096;
    for (int pattern = 0; pattern < 6; ++pattern) {
      const std::vector<float> logits = test_logits(V, pattern, rng);
      for (float t : {0.05f, 0.8f, 1.0f, 3.0f}) {
        if (large && t != 0.8f) continue;
        for (int top_k : {0, 1, 2, 50, int(V) - 1, int(V) + 5}) {
          if (large && top_k != 0 && top_k != 50) continue;
          for (float top_p : {1.0f, 0.9f, 0.5f, 0.999f, 1e-6f, 0.99999994f}) {
            if ((top_k <= 0 || top_k >= V) && top_p >= 1.0f) continue;  // (nothing cut)
            if (large && top_p != 1.0f && top_p != 0.9f && top_p != 0.99999994f) continue;
            for (float min_p : {0.0f, 0.05f}) {
              if (large && min_p > 0.0f) continue;
              SamplingParams p;
              p.temperature = t;
              p.top_k = std::max(top_k, 0);
              p.top_p = top_p;
              p.min_p = min_p;
              expect_cut_as_defined(logits, p);
              if (HasFatalFailure()) return;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

// A token's logprob and its top alternatives as defined: log-softmax in double, the alternatives by a sort of
// every token (descending logit, ties by ascending id), over rows with ties, -inf tokens and a flat one.
TEST(TokenLogprob, TopAlternativesAreTheFullSortsHead) {
  std::mt19937 rng(11);
  for (int64_t V : {1, 3, 257, 32000}) {
    for (int pattern = 0; pattern < 6; ++pattern) {
      const std::vector<float> logits = test_logits(V, pattern, rng);
      for (int top_n : {0, 1, 2, 5, 20}) {
        const int32_t token = int32_t(V / 2);
        const TokenLogprob got = token_logprob(logits.data(), V, token, top_n);
        float mx = -INFINITY;
        for (float l : logits) mx = std::max(mx, l);
        double z = 0;
        for (float l : logits) z += std::exp(double(l) - mx);
        const float lz = float(std::log(z)) + mx;
        EXPECT_EQ(got.token, token);
        EXPECT_EQ(got.logprob, logits[size_t(token)] - lz);
        std::vector<int32_t> order(static_cast<size_t>(V));
        for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        const size_t n = std::min<size_t>(size_t(top_n), size_t(V));
        ASSERT_EQ(got.top.size(), n) << "V " << V << " pattern " << pattern;
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(got.top[i].first, order[i]) << "V " << V << " pattern " << pattern << " top_n " << top_n << " #" << i;
          EXPECT_EQ(got.top[i].second, logits[size_t(order[i])] - lz);
        }
      }
    }
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
