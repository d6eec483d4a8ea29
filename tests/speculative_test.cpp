// Greedy MTP speculative decoding must be token-for-token the target's plain greedy output, whatever k,
// the number of MTP layers, the prompt length relative to index_topk, and however many drafts the
// target accepts.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/generator.h"
#include "models/registry.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::fixture_dir;

std::vector<std::vector<int32_t>> make_prompts(int count, int64_t vocab, int64_t topk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    // lengths from 1 to well past index_topk: generations cross the sparse window
    const int64_t len = 1 + (i * (2 * topk + 6)) / count;
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
    prompts.push_back(p);
  }
  return prompts;
}

class SpecExactness : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { model_ = load_model(testing::fixture_path(GetParam()), &pool_); }
  GenerationResult plain(const std::vector<int32_t>& prompt, int n) {
    SamplingParams sp;
    sp.max_tokens = n;
    SpecOptions so;
    so.enabled = false;
    return Generator(*model_).generate(prompt, sp, so);
  }
  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
};

TEST_P(SpecExactness, GreedySpeculativeEqualsPlainGreedy) {
  const auto& c = model_->facts();
  ASSERT_GE(model_->facts().num_mtp_layers, 1);
  auto prompts = make_prompts(20, c.vocab_size, c.sparse_budget, 7);
  const int N = 2 * c.sparse_budget + 4;
  int64_t rounds = 0;
  for (const auto& prompt : prompts) {
    const auto ref = plain(prompt, N);
    ASSERT_EQ(int(ref.ids.size()), N);
    for (int k : {1, 2, 3, 4, 7}) {
      SamplingParams sp;
      sp.max_tokens = N;
      SpecOptions so;
      so.num_speculative_tokens = k;
      auto got = Generator(*model_).generate(prompt, sp, so);
      ASSERT_EQ(got.ids, ref.ids) << "prompt length " << prompt.size() << " k " << k;
      EXPECT_GT(got.stats.num_drafts, 0);
      EXPECT_LE(got.stats.target_forwards, ref.stats.target_forwards);
      rounds += got.stats.num_drafts;
    }
  }
  EXPECT_GT(rounds, 0);
}

// k tuned by measured speed (the CLI's greedy default): the output stays the target's whatever k each step
// uses. The seam makes k = 1 the fastest: the tuner climbs 0 -> 1 -> 2 -> 3 (one step past the slower
// k = 2), stops, runs k = 1.
TEST_P(SpecExactness, TunedKEqualsPlainGreedy) {
  const auto& c = model_->facts();
  auto prompts = make_prompts(4, c.vocab_size, c.sparse_budget, 13);
  const int N = std::max<int>(2 * c.sparse_budget + 4, 96);  // long enough to measure, then to choose
  for (const auto& prompt : prompts) {
    const auto ref = plain(prompt, N);
    SamplingParams sp;
    sp.max_tokens = N;
    SpecOptions so;
    so.num_speculative_tokens = 3;
    so.tune_k = true;
    so.round_seconds_for_tests = [](int k, int emitted) { return (k == 1 ? 0.5 : 1.0) * emitted; };
    auto got = Generator(*model_).generate(prompt, sp, so);
    ASSERT_EQ(got.ids, ref.ids) << "prompt length " << prompt.size();
    ASSERT_EQ(got.stats.rounds_at_k.size(), 4u);
    for (int k = 0; k <= 2; ++k) EXPECT_GE(got.stats.rounds_at_k[k], 1) << "k " << k;
    int64_t total = 0;
    for (int64_t r : got.stats.rounds_at_k) total += r;
    EXPECT_GT(got.stats.rounds_at_k[1], total / 2);
  }
  // Sampling with a seed to reproduce keeps k fixed: no tuning. Without one, k is tuned as for greedy.
  SamplingParams sp;
  sp.max_tokens = 8;
  sp.temperature = 1.0f;
  sp.seed = 5;
  SpecOptions so;
  so.tune_k = true;
  EXPECT_TRUE(Generator(*model_).generate(prompts[0], sp, so).stats.rounds_at_k.empty());
  SamplingParams unseeded = sp;
  unseeded.reproducible = false;
  unseeded.max_tokens = N;
  so.round_seconds_for_tests = [](int k, int emitted) { return (k == 1 ? 0.5 : 1.0) * emitted; };
  const auto tuned = Generator(*model_).generate(prompts[0], unseeded, so);
  ASSERT_EQ(tuned.stats.rounds_at_k.size(), 4u);
  int64_t total = 0;
  for (int64_t r : tuned.stats.rounds_at_k) total += r;
  EXPECT_GT(tuned.stats.rounds_at_k[1], total / 2);
  EXPECT_EQ(tuned.ids.size(), size_t(N));
  SpecOptions both = so;
  both.round_seconds_for_tests = nullptr;
  both.adaptive = true;
  EXPECT_THROW(Generator(*model_).generate(prompts[0], sp, both), Error);
}

// A long run of k = 0 rounds (plain decoding, as the tuner picks at high concurrency) runs no MTP forward
// after the prompt's: the deferred positions past the window are dropped. Drafting that resumes after it
// restarts the layers' chains from the newest positions, and the output stays the target's.
TEST_P(SpecExactness, LongPlainStretchRunsNoDraftForwardsAndResumesExactly) {
  const auto& c = model_->facts();
  const std::vector<int32_t> prompt = make_prompts(1, c.vocab_size, c.sparse_budget, 17)[0];
  const int N = 200;  // many more k = 0 rounds than the deferred window, then drafting again
  ASSERT_LT(int64_t(prompt.size()) + N + 8, c.context);
  const auto ref = plain(prompt, N);
  SamplingParams sp;
  sp.max_tokens = N;
  SpecOptions so;
  so.num_speculative_tokens = 2;
  so.k_schedule_for_tests = [](int64_t) { return 0; };
  const auto all_plain = Generator(*model_).generate(prompt, sp, so);
  ASSERT_EQ(all_plain.ids, ref.ids);
  EXPECT_LE(all_plain.stats.draft_forwards, c.num_mtp_layers);  // the prompt's catch-up only
  EXPECT_EQ(all_plain.stats.num_drafts, 0);
  for (int64_t resume : {150, 170}) {
    so.k_schedule_for_tests = [resume](int64_t round) { return round < resume ? 0 : 2; };
    const auto got = Generator(*model_).generate(prompt, sp, so);
    ASSERT_EQ(got.ids, ref.ids) << "resumed at round " << resume;
    EXPECT_GT(got.stats.num_drafts, 0);
  }
}

// Drafts forced to the right answer (from the plain run) except at chosen positions: exercises full
// acceptance with bonus tokens, partial acceptance and rollback of target and draft caches.
TEST_P(SpecExactness, ForcedAcceptancePatternsStayExact) {
  const auto& c = model_->facts();
  auto prompts = make_prompts(6, c.vocab_size, c.sparse_budget, 11);
  const int N = 2 * c.sparse_budget + 4;
  for (const auto& prompt : prompts) {
    const auto ref = plain(prompt, N);
    const int64_t n = prompt.size();
    for (int k : {1, 3, 4, 7}) {
      for (int wrong_every : {0, 2, 3, 5}) {  // 0: every draft right
        SamplingParams sp;
        sp.max_tokens = N;
        SpecOptions so;
        so.num_speculative_tokens = k;
        int wrong_drafts = 0;
        so.draft_hook = [&](int64_t pos, int, int32_t d) -> int32_t {
          const int64_t i = pos - n;  // index into the generated ids
          if (i < 0 || i >= int64_t(ref.ids.size())) return d;
          const int32_t right = ref.ids[i];
          if (wrong_every && pos % wrong_every == 0) {
            ++wrong_drafts;
            return (right + 1) % int32_t(c.vocab_size);
          }
          return right;
        };
        auto got = Generator(*model_).generate(prompt, sp, so);
        ASSERT_EQ(got.ids, ref.ids) << "k " << k << " wrong_every " << wrong_every << " prompt " << n;
        if (wrong_every == 0) {
          // all drafts (inside the length budget) accepted: k+1 tokens per target forward from the
          // first round on (after the prefill's token)
          EXPECT_EQ(got.stats.num_accepted_tokens, got.stats.num_draft_tokens);
          EXPECT_GT(got.stats.mean_acceptance_length(), 1.0);
          EXPECT_EQ(got.stats.target_forwards, 1 + (N - 1 + k) / (k + 1)) << "k " << k << " prompt " << n;
        } else if (wrong_drafts > 0) {
          EXPECT_LT(got.stats.num_accepted_tokens, got.stats.num_draft_tokens);
        }
      }
    }
  }
}

// Layer 1's catch-up runs draft step 1 in the same forward: the draft distributions of every step must be
// bit-identical to those of step 1 run on its own, across rollbacks (drafts mostly right, some wrong).
TEST_P(SpecExactness, MergedDraftStepGivesTheSameDrafts) {
  const auto& c = model_->facts();
  auto prompts = make_prompts(4, c.vocab_size, c.sparse_budget, 17);
  const int N = 2 * c.sparse_budget + 4;
  int64_t steps = 0;
  for (const auto& prompt : prompts) {
    const auto ref = plain(prompt, N);
    const int64_t n = prompt.size();
    for (int k : {2, 3, 4}) {
      std::vector<std::vector<float>> q_of[2];
      std::vector<int32_t> ids[2];
      for (int unmerged = 0; unmerged < 2; ++unmerged) {
        SamplingParams sp;
        sp.max_tokens = N;
        SpecOptions so;
        so.num_speculative_tokens = k;
        so.unmerged_catch_up_for_tests = unmerged == 1;
        so.draft_dist_hook = [&](const std::vector<int32_t>&, float* q) {
          q_of[unmerged].emplace_back(q, q + c.vocab_size);
        };
        so.draft_hook = [&](int64_t pos, int, int32_t d) -> int32_t {
          const int64_t i = pos - n;
          if (i < 0 || i >= int64_t(ref.ids.size())) return d;
          return pos % 5 == 0 ? (ref.ids[i] + 1) % int32_t(c.vocab_size) : ref.ids[i];
        };
        ids[unmerged] = Generator(*model_).generate(prompt, sp, so).ids;
      }
      ASSERT_EQ(ids[0], ref.ids) << "k " << k << " prompt " << n;
      ASSERT_EQ(ids[1], ref.ids) << "k " << k << " prompt " << n;
      ASSERT_EQ(q_of[0].size(), q_of[1].size()) << "k " << k << " prompt " << n;
      for (size_t i = 0; i < q_of[0].size(); ++i)
        ASSERT_EQ(q_of[0][i], q_of[1][i]) << "draft step " << i << " k " << k << " prompt " << n;
      steps += int64_t(q_of[0].size());
    }
  }
  EXPECT_GT(steps, 0);
}

TEST_P(SpecExactness, StopsAtStopTokenAndMaxTokens) {
  auto prompt = make_prompts(1, model_->facts().vocab_size, 4, 3)[0];
  const auto ref = plain(prompt, 12);
  SamplingParams sp;
  sp.max_tokens = 12;
  sp.stop_token_ids = {ref.ids[5]};
  SpecOptions so;
  so.num_speculative_tokens = 4;
  auto got = Generator(*model_).generate(prompt, sp, so);
  const auto stop_at = std::find(ref.ids.begin(), ref.ids.end(), ref.ids[5]) - ref.ids.begin();
  EXPECT_EQ(got.ids, std::vector<int32_t>(ref.ids.begin(), ref.ids.begin() + stop_at + 1));
  EXPECT_EQ(got.finish_reason, "stop");
  sp.stop_token_ids.clear();
  sp.max_tokens = 7;
  got = Generator(*model_).generate(prompt, sp, so);
  EXPECT_EQ(got.ids.size(), 7u);
  EXPECT_EQ(got.finish_reason, "length");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecExactness,
                         ::testing::Values("hy_v4/a_fp32", "hy_v4/b_fp32", "hy_v4/c_bf16", "qwen4_exp/a_fp32",
                                           "qwen4_exp/b_fp32", "qwen4_exp/c_bf16", "qwen4_exp/d_fp8"),
                         [](const auto& param_info) { return testing::fixture_test_name(param_info.param); });

TEST(SpecStats, ArithmeticFollowsVllmDefinitions) {
  SpecStats s;
  s.add_round(3, 3);
  s.add_round(3, 1);
  s.add_round(3, 0);
  s.add_round(2, 2);
  EXPECT_EQ(s.num_drafts, 4);
  EXPECT_EQ(s.num_draft_tokens, 11);
  EXPECT_EQ(s.num_accepted_tokens, 6);
  EXPECT_DOUBLE_EQ(s.mean_acceptance_length(), 1.0 + 6.0 / 4.0);
  auto pp = s.per_position_acceptance();
  ASSERT_EQ(pp.size(), 3u);
  EXPECT_DOUBLE_EQ(pp[0], 3.0 / 4.0);  // rounds 1, 2, 4 accepted position 0
  EXPECT_DOUBLE_EQ(pp[1], 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(pp[2], 1.0 / 4.0);
  SpecStats empty;
  EXPECT_DOUBLE_EQ(empty.mean_acceptance_length(), 1.0);
}

TEST(SpecOptions, RejectsOutOfRangeK) {
  SpecOptions so;
  so.num_speculative_tokens = 0;
  EXPECT_THROW(so.validate(), Error);
  so.num_speculative_tokens = 9;
  EXPECT_THROW(so.validate(), Error);
  so.num_speculative_tokens = 8;
  EXPECT_NO_THROW(so.validate());
}

}  // namespace
}  // namespace nextn

namespace nextn {
namespace {

class SpecOptIns : public ::testing::Test {
 protected:
  void SetUp() override { model_ = std::make_unique<HYV4Model>(testing::fixture_dir("b_fp32"), nullptr); }
  std::unique_ptr<HYV4Model> model_;
};

// Adaptive k only changes how much is drafted, never what is emitted.
TEST_F(SpecOptIns, AdaptiveSpeculationStaysExact) {
  const auto& c = model_->config();
  for (const auto& prompt : make_prompts(5, c.vocab_size, c.index_topk, 21)) {
    SamplingParams sp;
    sp.max_tokens = 40;
    SpecOptions plain;
    plain.enabled = false;
    const auto ref = Generator(*model_).generate(prompt, sp, plain);
    SpecOptions so;
    so.num_speculative_tokens = 4;
    so.adaptive = true;
    so.adaptive_threshold = 0.5f;  // random drafts: k shrinks to 0, then probes
    so.adaptive_window = 2;
    so.adaptive_probe_interval = 3;
    const auto got = Generator(*model_).generate(prompt, sp, so);
    EXPECT_EQ(got.ids, ref.ids);
    // k went down: fewer draft tokens than 4 per round on average
    EXPECT_LT(double(got.stats.num_draft_tokens), 4.0 * got.stats.num_drafts);
    EXPECT_GT(got.stats.num_drafts, 0);  // probes kept happening
  }
}

// Relaxed acceptance (lossy, opt-in) accepts at least what exact matching accepts, and every token it
// emits is within the target's top-N.
TEST_F(SpecOptIns, RelaxedAcceptanceStaysInTargetTopN) {
  const auto& c = model_->config();
  const int64_t V = c.vocab_size;
  for (const auto& prompt : make_prompts(4, V, c.index_topk, 33)) {
    SamplingParams sp;
    sp.max_tokens = 24;
    SpecOptions strict;
    strict.num_speculative_tokens = 3;
    SpecOptions relaxed = strict;
    relaxed.relaxed = true;
    relaxed.relaxed_top_n = 4;
    relaxed.relaxed_delta = 1.0f;  // any of the top 4
    const auto a = Generator(*model_).generate(prompt, sp, strict);
    const auto b = Generator(*model_).generate(prompt, sp, relaxed);
    EXPECT_GE(double(b.stats.num_accepted_tokens) / b.stats.num_draft_tokens,
              double(a.stats.num_accepted_tokens) / a.stats.num_draft_tokens);
    // every emitted token is in the top 4 of the target given the emitted prefix
    std::vector<int32_t> seq = prompt;
    std::vector<float> logits(V);
    for (int32_t t : b.ids) {
      KVCache cache = model_->new_cache(seq.size());
      model_->forward(seq.data(), seq.size(), cache, logits.data(), nullptr, false);
      int rank = 0;
      for (int64_t v = 0; v < V; ++v) rank += logits[v] > logits[t];
      EXPECT_LT(rank, 4);
      seq.push_back(t);
    }
  }
}

}  // namespace
}  // namespace nextn
