// Drafting that resumes after a run of plain (k = 0) rounds restarts the MTP layers' chains from the newest
// deferred positions (the older ones were dropped unseen, so that plain decoding runs no MTP forward): its
// drafts must stay nearly as good as those of layers that saw every position. The rounds are run as the k
// tuner runs them at high concurrency: a few k = 2 rounds after each long stretch of k = 0. A trained model
// on its demo text, so that acceptance means something.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/generator.h"
#include "io/tokenizer.h"

namespace nextn::testing {

inline void expect_resumed_drafting_keeps_acceptance(Model& model, const Tokenizer& tok) {
  const auto ids = tok.encode(
      "import os\nimport sys\n\n\nclass Config:\n    \"\"\"Settings read from the environment.\"\"\"\n\n"
      "    def __init__(self, prefix=\"APP_\"):\n        self.prefix = prefix\n        self.values = {}\n",
      true);
  SamplingParams sp;
  sp.max_tokens = 400;
  SpecOptions so;
  so.num_speculative_tokens = 2;
  so.k_schedule_for_tests = [](int64_t) { return 2; };
  const auto always = Generator(model).generate(ids, sp, so);
  so.k_schedule_for_tests = [](int64_t round) { return round % 44 < 40 ? 0 : 2; };
  const auto resumed = Generator(model).generate(ids, sp, so);
  EXPECT_EQ(resumed.ids, always.ids);
  ASSERT_GT(always.stats.num_draft_tokens, 0);
  ASSERT_GT(resumed.stats.num_draft_tokens, 0);
  const double a = double(always.stats.num_accepted_tokens) / double(always.stats.num_draft_tokens);
  const double b = double(resumed.stats.num_accepted_tokens) / double(resumed.stats.num_draft_tokens);
  std::printf("[ accept   ] k = 2 every round %.3f (%lld drafts); after k = 0 stretches %.3f (%lld drafts)\n", a,
              static_cast<long long>(always.stats.num_draft_tokens), b,
              static_cast<long long>(resumed.stats.num_draft_tokens));
  EXPECT_GE(b, 0.8 * a);
}

}  // namespace nextn::testing
