// Qwen4-Exp against transformers 5.17: prompt logits and pre-mixer streams, incremental decode (HF's recurrent
// Gated DeltaNet path and cached QSA), prefill + decode against full recompute bit for bit, the MTP layers
// teacher-forced, and one live draft round (step 0, and step 1 reusing step 0's QSA selection), on every
// fixture of tests/fixtures/qwen4_exp (tools/fixtures/make_qwen4_exp_fixtures.py).
//
// Tolerances (DEVELOPERS.md): fp32 max|Δ| <= 1e-4 · max|ref| with identical argmax; the bf16 checkpoint
// against transformers' fp32 run over its bf16 weights (`*_f32up`) at 1e-4, and against the bf16 run at 2e-2.
#include <gtest/gtest.h>

#include <cstring>

#include "core/threadpool.h"
#include "models/qwen4_exp/model.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::compare;
using testing::Reference;

struct Fixture {
  const char* name;
  bool bf16;
};

std::string qwen_fixture_dir(const std::string& name) {
  return std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/qwen4_exp/" + name;
}

class Qwen4ExpParity : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    dir_ = qwen_fixture_dir(GetParam().name);
    model_ = std::make_unique<Qwen4ExpModel>(dir_, &pool_);
    ref_ = std::make_unique<Reference>(dir_);
    prompt_ = ref_->ids("input_ids");
    greedy_ = ref_->ids("greedy_ids");
    V_ = model_->config().vocab_size;
    CH_ = model_->config().hc_width();
  }
  std::string exact(const std::string& name) const { return GetParam().bf16 ? name + "_f32up" : name; }

  // One forward of `tokens` on `seq`, all logits.
  void run(SequenceState& seq, const std::vector<int32_t>& tokens, float* logits, float* hidden) {
    BatchSegment seg{&seq, tokens.data(), static_cast<int64_t>(tokens.size()), true};
    model_->forward(&seg, 1, logits, hidden);
  }

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<Qwen4ExpModel> model_;
  std::unique_ptr<Reference> ref_;
  std::vector<int32_t> prompt_, greedy_;
  int64_t V_ = 0, CH_ = 0;
};

TEST_P(Qwen4ExpParity, PromptLogitsAndStreamsMatchTransformers) {
  const int64_t T = prompt_.size();
  auto seq = model_->new_sequence(T);
  std::vector<float> logits(T * V_), hidden(T * CH_);
  run(*seq, prompt_, logits.data(), hidden.data());
  const auto ref = ref_->f32(exact("logits"));
  const auto d = compare(logits.data(), ref.data(), T, V_);
  EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;
  const auto href = ref_->f32(exact("multi_hidden"));
  const auto dh = compare(hidden.data(), href.data(), T, CH_);
  EXPECT_LE(dh.rel(), 1e-4) << "pre-mixer streams max|Δ| " << dh.max_abs;
  if (GetParam().bf16) {
    const auto r16 = ref_->f32("logits");
    const auto d16 = compare(logits.data(), r16.data(), T, V_);
    EXPECT_LE(d16.rel(), 2e-2) << "against transformers' bf16 run";
  }
}

TEST_P(Qwen4ExpParity, IncrementalDecodeMatchesTransformersCache) {
  const int64_t T = prompt_.size(), N = greedy_.size();
  auto seq = model_->new_sequence(T + N);
  std::vector<float> logits(T * V_);
  run(*seq, prompt_, logits.data(), nullptr);
  EXPECT_EQ(std::max_element(logits.end() - V_, logits.end()) - (logits.end() - V_), greedy_[0]);
  const auto ref = ref_->f32(exact("decode_logits"));
  for (int64_t i = 0; i < N; ++i) {
    run(*seq, {greedy_[i]}, logits.data(), nullptr);
    const auto d = compare(logits.data(), ref.data() + i * V_, 1, V_);
    EXPECT_LE(d.rel(), 1e-4) << "decode step " << i << " max|Δ| " << d.max_abs;
    EXPECT_EQ(d.argmax_mismatches, 0) << "decode step " << i;
  }
}

// Prefill, then single rows and a 4-row block (a verify): every row bit-identical to one forward over it all.
TEST_P(Qwen4ExpParity, PrefillPlusDecodeEqualsFullRecomputeBitForBit) {
  const int64_t T = prompt_.size(), n = greedy_.size();
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), greedy_.begin(), greedy_.end());
  std::vector<float> full((T + n) * V_);
  {
    auto seq = model_->new_sequence(T + n);
    run(*seq, all, full.data(), nullptr);
  }
  auto seq = model_->new_sequence(T + n);
  std::vector<float> out(T * V_);
  run(*seq, prompt_, out.data(), nullptr);
  ASSERT_EQ(0, std::memcmp(out.data(), full.data(), T * V_ * sizeof(float))) << "prefill";
  for (int64_t i = 0; i < n;) {
    const int64_t rows = i == 1 ? std::min<int64_t>(4, n - i) : 1;
    run(*seq, std::vector<int32_t>(all.begin() + T + i, all.begin() + T + i + rows), out.data(), nullptr);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(0, std::memcmp(out.data() + r * V_, full.data() + (T + i + r) * V_, V_ * sizeof(float)))
          << "position " << T + i + r << " (step of " << rows << " rows)";
    i += rows;
  }
}

// A rejected verify rolls the recurrent state back by slot: decoding after the rollback equals decoding
// without the rejected rows, bit for bit.
TEST_P(Qwen4ExpParity, RollbackRestoresRecurrentStateExactly) {
  const int64_t T = prompt_.size(), n = greedy_.size();
  std::vector<float> want(V_), got(4 * V_);
  auto ref_seq = model_->new_sequence(T + n);
  std::vector<float> scratch(T * V_);
  run(*ref_seq, prompt_, scratch.data(), nullptr);
  run(*ref_seq, {greedy_[0]}, want.data(), nullptr);
  run(*ref_seq, {greedy_[1]}, want.data(), nullptr);

  auto seq = model_->new_sequence(T + n + 4);
  run(*seq, prompt_, scratch.data(), nullptr);
  // A 4-row block of which only the first row is kept.
  run(*seq, {greedy_[0], 7, 9, 11}, got.data(), nullptr);
  seq->rollback(T + 1);
  run(*seq, {greedy_[1]}, got.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), V_ * sizeof(float)));
}

TEST_P(Qwen4ExpParity, MtpLayersTeacherForcedMatchReference) {
  const int64_t T = prompt_.size();
  ASSERT_GE(model_->num_mtp_layers(), 1);
  auto seq = model_->new_sequence(T);
  std::vector<float> logits(T * V_), hidden(T * CH_);
  run(*seq, prompt_, logits.data(), hidden.data());
  std::vector<float> draft((T - 1) * V_);
  model_->prompt_draft_logits(prompt_.data(), T, hidden.data(), draft.data());
  const auto ref = ref_->f32(exact("draft_logits"));
  const auto d = compare(draft.data(), ref.data(), T - 1, V_);
  EXPECT_LE(d.rel(), 1e-4) << "MTP layer 0 max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0);
  if (model_->num_mtp_layers() < 2) return;
  // Layer 1's chain: row q (q = 1..T-2) gets token q+1 and layer 0's output streams at q-1.
  const auto multi0 = ref_->f32(exact("draft_multi"));
  auto pool = std::make_shared<KVPool>("test", std::vector<int64_t>{2 * model_->config().num_key_value_heads *
                                                                        model_->config().head_dim,
                                                                    2 * model_->config().indexer_head_dim},
                                       64, (T + 63) / 64);
  KVCache dc(pool, {LayerPlanes{0, 1}}, T);
  dc.set_base_position(1);
  std::vector<float> l1((T - 2) * V_);
  model_->draft_forward(1, prompt_.data() + 2, multi0.data(), T - 2, 1, dc, l1.data(), nullptr);
  const auto ref1 = ref_->f32(exact("draft_logits_1"));
  const auto d1 = compare(l1.data(), ref1.data(), T - 2, V_);
  EXPECT_LE(d1.rel(), 1e-4) << "MTP layer 1 max|Δ| " << d1.max_abs << " max|ref| " << d1.max_ref;
  EXPECT_EQ(d1.argmax_mismatches, 0);
}

// One draft round right after prefill through the engine's DraftSession: step 0 (layer 0 at T-1) and step 1
// (layer 1 % L at T, attending to step 0's QSA selection plus the rows after it).
TEST_P(Qwen4ExpParity, LiveDraftRoundMatchesReference) {
  const int64_t T = prompt_.size();
  auto seq = model_->new_sequence(T + 8);
  std::vector<float> logits(T * V_), hidden(T * CH_);
  run(*seq, prompt_, logits.data(), hidden.data());
  const auto chain = ref_->f32(exact("chain_logits"));
  const auto chain_tokens = ref_->ids("chain_tokens");
  DraftOptions opt;
  opt.k_max = 2;
  auto ds = model_->new_draft_session(*seq, opt);
  ASSERT_TRUE(ds);
  std::vector<int32_t> tokens = prompt_;
  tokens.push_back(chain_tokens[0]);
  ds->push_verified(hidden.data(), T);
  ds->catch_up_prompt(tokens, 2);
  // The two draft steps' logits, step 0 drafting the reference's next token.
  struct Record final : DraftPicker {
    int64_t V;
    std::vector<int32_t> chain_tokens;
    std::vector<std::vector<float>> logits;
    int32_t pick(int s, float* l) override {
      logits.emplace_back(l, l + V);
      // (the reference's chain: its tokens after the prompt; the last step's draft is never used)
      return size_t(s + 1) < chain_tokens.size() ? chain_tokens[s + 1] : 0;
    }
  } rec;
  rec.V = V_;
  rec.chain_tokens = chain_tokens;
  run_draft_round(*model_, *ds, tokens, 2, rec);
  ASSERT_EQ(rec.logits.size(), 2u);
  const float* l0 = rec.logits[0].data();
  const auto d0 = compare(l0, chain.data(), 1, V_);
  EXPECT_LE(d0.rel(), 1e-4) << "draft step 0 max|Δ| " << d0.max_abs;
  EXPECT_EQ(static_cast<int32_t>(std::max_element(l0, l0 + V_) - l0), chain_tokens[1]);
  const auto d1 = compare(rec.logits[1].data(), chain.data() + V_, 1, V_);
  EXPECT_LE(d1.rel(), 1e-4) << "draft step 1 max|Δ| " << d1.max_abs;
  EXPECT_EQ(d1.argmax_mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen4ExpParity,
                         ::testing::Values(Fixture{"a_fp32", false}, Fixture{"b_fp32", false},
                                           Fixture{"c_bf16", true}, Fixture{"d_fp8", false}),
                         [](const ::testing::TestParamInfo<Fixture>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace nextn
