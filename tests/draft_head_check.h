// The drafts' FP8 head (models/common/draft_head.h) on a bundled model: the same greedy tokens as the target's
// own head, k = 3 every round, and an acceptance within a few percent of it (printed). Leaves the model on
// the target's head.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/generator.h"
#include "io/tokenizer.h"
#include "models/model.h"

namespace nextn::testing {

inline void expect_fp8_draft_head_keeps_tokens_and_acceptance(Model& model, const Tokenizer& tok) {
  const auto ids = tok.encode("The history of the city begins with a small settlement on the river, where", true);
  SamplingParams sp;
  sp.max_tokens = 300;
  SpecOptions so;
  so.num_speculative_tokens = 3;
  so.k_schedule_for_tests = [](int64_t) { return 3; };
  auto rate = [](const GenerationResult& r) {
    return double(r.stats.num_accepted_tokens) / double(r.stats.num_draft_tokens);
  };
  EXPECT_EQ(model.use_draft_head(DraftHeadKind::kTarget).find("FP8 copy"), std::string::npos);
  const auto own = Generator(model).generate(ids, sp, so);
  const std::string what = model.use_draft_head(DraftHeadKind::kFp8);
  EXPECT_NE(what.find("lm_head (BF16) for the target, an FP8 copy"), std::string::npos) << what;
  const auto fp8 = Generator(model).generate(ids, sp, so);
  model.use_draft_head(DraftHeadKind::kTarget);
  EXPECT_EQ(fp8.ids, own.ids);
  ASSERT_GT(own.stats.num_draft_tokens, 0);
  ASSERT_GT(fp8.stats.num_draft_tokens, 0);
  std::printf("[ accept   ] k = 3, drafts' head: the target's %.3f (%lld drafts), FP8 copy %.3f (%lld drafts)\n",
              rate(own), static_cast<long long>(own.stats.num_draft_tokens), rate(fp8),
              static_cast<long long>(fp8.stats.num_draft_tokens));
  EXPECT_GE(rate(fp8), 0.95 * rate(own));
}

}  // namespace nextn::testing
