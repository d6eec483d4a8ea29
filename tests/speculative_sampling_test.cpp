// Speculative sampling keeps the target's distribution: a χ² goodness-of-fit test of the first three
// generated tokens (the 2nd and 3rd come from speculative rounds) against the exact target probabilities
// computed from the engine's own logits, for several sampling settings and k ∈ {1, 3}. The same test
// run with a deliberately broken acceptance rule (accept every draft) must fail: the test has power.
// Seeds are fixed, so the outcome is deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "core/threadpool.h"
#include "engine/generator.h"
#include "models/registry.h"
#include "test_util.h"

namespace nextn {
namespace {

// Regularized upper incomplete gamma Q(a, x): series below a+1, Lentz continued fraction above.
double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double lg = std::lgamma(a);
  if (x < a + 1) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - lg);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(-x + a * std::log(x) - lg) * h;
}

double chi2_sf(double chi2, int dof) { return gamma_q(dof / 2.0, chi2 / 2.0); }

TEST(ChiSquare, SurvivalFunctionKnownValues) {
  EXPECT_NEAR(chi2_sf(3.841458820694124, 1), 0.05, 1e-9);
  EXPECT_NEAR(chi2_sf(18.307038053275146, 10), 0.05, 1e-9);
  EXPECT_NEAR(chi2_sf(2.0, 2), std::exp(-1.0), 1e-12);
}

struct Setting {
  const char* name;
  SamplingParams params;
  bool draft_probs = true;
};

std::vector<Setting> settings() {
  std::vector<Setting> s;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 4;
  s.push_back({"T1_topk4", p});
  p = SamplingParams{};
  p.temperature = 0.8f;
  p.top_k = 6;
  p.top_p = 0.9f;
  s.push_back({"T0.8_topk6_topp0.9", p});
  p = SamplingParams{};
  p.temperature = 1.3f;
  p.top_k = 5;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  s.push_back({"T1.3_topk5_minp_penalties", p});
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.top_k = 6;
  p.logit_bias = {{7, 2.5f}, {12, -100.0f}, {200, 1.0f}};  // (OpenAI's logit_bias: drafts are biased alike)
  s.push_back({"T1_topk6_logit_bias", p});
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.top_k = 6;
  p.min_tokens = 4;  // (the fixtures' greedy first tokens as stop ids: banned for positions 1-4, allowed at 5)
  p.stop_token_ids = {254, 152, 3};
  s.push_back({"T1_topk6_min_tokens", p});
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.top_k = 4;
  s.push_back({"T1_topk4_onehot_q", p, false});
  return s;
}

// The first five generated tokens: their joint law is checked on the first three, and the 4th and 5th
// through their marginals (k = 3 drafts positions 2..5 in the first round).
constexpr int kTokens = 5;

class SpecSampling : public ::testing::TestWithParam<const char*> {
 protected:
  // Serial: thousands of tiny generations, where thread hand-offs would cost more than the math.
  void SetUp() override { model_ = load_model(testing::fixture_path(GetParam()), nullptr); }

  // The target's processed next-token distribution after prompt + prefix (memoized).
  const std::vector<float>& dist(const SamplingParams& params, const std::vector<int32_t>& prefix) {
    auto it = memo_.find(prefix);
    if (it != memo_.end()) return it->second;
    const int64_t V = model_->facts().vocab_size;
    std::vector<int32_t> seq = prompt_;
    seq.insert(seq.end(), prefix.begin(), prefix.end());
    auto state = model_->new_sequence(static_cast<int64_t>(seq.size()));
    std::vector<float> logits(V), probs(V);
    const BatchSegment seg{state.get(), seq.data(), static_cast<int64_t>(seq.size()), false};
    model_->forward(&seg, 1, logits.data(), nullptr);
    TokenHistory h;
    h.reset(V, prompt_);
    for (int32_t t : prefix) h.push(t);
    Sampler sampler(V, params);
    sampler.adjust_logits(logits.data(), h);
    sampler.distribution(logits.data(), probs.data());
    return memo_[prefix] = probs;
  }

  // χ² p-value of observed counts against expected probabilities (cells with expected < 5 pooled).
  static double chi2_p(const std::map<std::vector<int32_t>, double>& expected,
                       std::map<std::vector<int32_t>, int64_t> observed, int64_t trials, int* dof) {
    double chi2 = 0, pooled_exp = 0, pooled_obs = 0;
    int bins = 0;
    int64_t matched = 0;
    for (const auto& [key, prob] : expected) {
      const double e = prob * trials;
      const int64_t o = observed.count(key) ? observed[key] : 0;
      matched += o;
      if (e >= 5) {
        chi2 += (o - e) * (o - e) / e;
        ++bins;
      } else {
        pooled_exp += e;
        pooled_obs += o;
      }
    }
    pooled_obs += trials - matched;  // outcomes the target gives no mass
    if (pooled_exp > 0) {
      chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
      ++bins;
    } else if (pooled_obs > 0) {
      *dof = bins - 1;
      return 0.0;
    }
    *dof = bins - 1;
    return chi2_sf(chi2, std::max(bins - 1, 1));
  }

  struct Outcome {
    double p_joint, p_x4, p_x5;
    int dof;
    int64_t accepted, drafted;
    double min_p() const { return std::min({p_joint, p_x4, p_x5}); }
  };

  Outcome run(const Setting& s, int k, bool broken, int trials) {
    memo_.clear();
    const int64_t V = model_->facts().vocab_size;
    // Exact laws: joint of (x1, x2, x3), marginals of x4 and x5.
    std::map<std::vector<int32_t>, double> joint, m4, m5;
    std::function<void(std::vector<int32_t>&, double)> walk = [&](std::vector<int32_t>& prefix, double pr) {
      const auto& p = dist(s.params, prefix);
      for (int32_t v = 0; v < V; ++v) {
        if (p[v] <= 0) continue;
        const double q = pr * p[v];
        prefix.push_back(v);
        if (prefix.size() == 3) joint[prefix] += q;
        if (prefix.size() == 4) m4[{v}] += q;
        if (prefix.size() == 5) m5[{v}] += q;
        if (prefix.size() < kTokens) walk(prefix, q);
        prefix.pop_back();
      }
    };
    std::vector<int32_t> root;
    walk(root, 1.0);

    std::map<std::vector<int32_t>, int64_t> oj, o4, o5;
    int64_t accepted = 0, drafted = 0;
    for (int i = 0; i < trials; ++i) {
      SamplingParams p = s.params;
      p.seed = 1000 + i;
      p.max_tokens = kTokens;
      SpecOptions so;
      so.num_speculative_tokens = k;
      so.use_draft_probs = s.draft_probs;
      so.broken_accept_all_for_tests = broken;
      // A random-weight draft barely overlaps the target: mix the target's law into q so that drafts
      // are accepted often (exactness must hold for any q).
      so.draft_dist_hook = [&](const std::vector<int32_t>& ctx, float* q) {
        std::vector<int32_t> prefix(ctx.begin() + prompt_.size(), ctx.end());
        if (prefix.size() >= kTokens) return;
        const auto& target = dist(s.params, prefix);
        for (int64_t v = 0; v < V; ++v) q[v] = 0.6f * target[v] + 0.4f * q[v];
      };
      auto r = Generator(*model_).generate(prompt_, p, so);
      EXPECT_EQ(r.ids.size(), size_t(kTokens));
      ++oj[{r.ids[0], r.ids[1], r.ids[2]}];
      ++o4[{r.ids[3]}];
      ++o5[{r.ids[4]}];
      accepted += r.stats.num_accepted_tokens;
      drafted += r.stats.num_draft_tokens;
    }
    Outcome o{};
    int d4 = 0, d5 = 0;
    o.p_joint = chi2_p(joint, oj, trials, &o.dof);
    o.p_x4 = chi2_p(m4, o4, trials, &d4);
    o.p_x5 = chi2_p(m5, o5, trials, &d5);
    o.accepted = accepted;
    o.drafted = drafted;
    return o;
  }

  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  const std::vector<int32_t> prompt_ = {5, 17, 42, 99, 7, 3};
  std::map<std::vector<int32_t>, std::vector<float>> memo_;
};

TEST_P(SpecSampling, EmittedTokensFollowTheTargetDistribution) {
  for (const Setting& s : settings()) {
    for (int k : {1, 3}) {
      Outcome o = run(s, k, /*broken=*/false, 2000);
      // three tests per setting: each must pass at 1e-3 / 3
      EXPECT_GT(o.min_p(), 1e-3 / 3) << s.name << " k=" << k << " joint " << o.p_joint << " x4 " << o.p_x4
                                      << " x5 " << o.p_x5;
      EXPECT_GT(o.dof, 3) << s.name;
      EXPECT_GT(o.accepted, o.drafted / 10) << "the accept path must be exercised";
      EXPECT_LT(o.accepted, o.drafted) << "the reject path must be exercised";
      std::printf("  %-28s k=%d  p(joint) %.3f p(x4) %.3f p(x5) %.3f  dof %d  acceptance %.3f\n", s.name, k,
                  o.p_joint, o.p_x4, o.p_x5, o.dof, double(o.accepted) / double(std::max<int64_t>(o.drafted, 1)));
    }
  }
}

TEST_P(SpecSampling, BrokenAcceptanceIsDetected) {
  for (int k : {1, 3}) {
    Outcome o = run(settings()[0], k, /*broken=*/true, 2000);
    EXPECT_LT(o.min_p(), 1e-6) << "k=" << k << ": the χ² test cannot tell a broken acceptance rule";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecSampling, ::testing::Values("hy_v4/b_fp32", "qwen4_exp/b_fp32"),
                         [](const auto& param_info) { return testing::fixture_test_name(param_info.param); });

}  // namespace
}  // namespace nextn
