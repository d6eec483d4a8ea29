// The bundled Qwen4-Exp (models/nextn-qwen4exp-tiny: FP8 block-quantized, 2 MTP layers, trained by
// tools/train/train_qwen4_exp.py) against transformers' fp32 run over the same dequantized weights: target
// logits, both MTP layers teacher-forced, and greedy decoding with and without speculation.
// Reference: tests/fixtures/bundled_qwen4_exp/ (every 16th position of a 192-token held-out prompt).
#include <gtest/gtest.h>

#include "core/threadpool.h"
#include "engine/generator.h"
#include "models/qwen4_exp/model.h"
#include "io/tokenizer.h"
#include "draft_head_check.h"
#include "resumed_drafting.h"
#include "test_util.h"

namespace nextn {
namespace {

const std::string kModel = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-qwen4exp-tiny";
const std::string kRef = std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/bundled_qwen4_exp";

class BundledQwen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    model_ = new Qwen4ExpModel(kModel, pool_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete pool_;
  }
  // Rows `rows` (positions, from `first`) of all [n, V] against the reference's [rows.size(), V].
  static void expect_rows(const std::vector<float>& all, int64_t first, const std::vector<int32_t>& rows,
                          const std::vector<float>& ref, const std::string& what) {
    const int64_t V = model_->facts().vocab_size;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto d = testing::compare(all.data() + (rows[i] - first) * V, ref.data() + i * V, 1, V);
      EXPECT_LE(d.rel(), 1e-4) << what << " position " << rows[i] << " max|Δ| " << d.max_abs;
      EXPECT_EQ(d.argmax_mismatches, 0) << what << " position " << rows[i];
    }
  }
  static ThreadPool* pool_;
  static Qwen4ExpModel* model_;
};
ThreadPool* BundledQwen::pool_ = nullptr;
Qwen4ExpModel* BundledQwen::model_ = nullptr;

TEST_F(BundledQwen, CheckpointIsFp8WithTwoMtpLayersAndPle) {
  EXPECT_EQ(model_->num_mtp_layers(), 2);
  EXPECT_EQ(model_->weights().layers[0].gdn.in_q.dtype, DType::F8_E4M3);
  EXPECT_TRUE(model_->weights().layers[0].has_ple);
  EXPECT_TRUE(model_->config().quant.present);
}

TEST_F(BundledQwen, TargetAndBothMtpLayersMatchTransformers) {
  testing::Reference ref(kRef);
  const auto ids = ref.ids("input_ids");
  const int64_t T = ids.size(), V = model_->facts().vocab_size, CH = model_->facts().hidden_width;
  ASSERT_GT(T, model_->config().indexer_budget) << "the prompt must outgrow the QSA budget";
  auto seq = model_->new_sequence(T);
  std::vector<float> logits(T * V), hidden(T * CH);
  const BatchSegment seg{seq.get(), ids.data(), T, true};
  model_->forward(&seg, 1, logits.data(), hidden.data());
  expect_rows(logits, 0, ref.ids("logits_rows"), ref.f32("logits"), "target");

  // MTP layer 0: row p gets token p+1 and the target's streams at p; layer 1: row q gets token q+1 and
  // layer 0's output streams at q-1 (its chain starts at position 1).
  auto planes = std::vector<int64_t>{2 * model_->config().num_key_value_heads * model_->config().head_dim,
                                     2 * int64_t(model_->config().indexer_head_dim)};
  auto pool = std::make_shared<KVPool>("test", planes, 64, (T + 63) / 64 * 2);
  KVCache c0(pool, {LayerPlanes{0, 1}}, T), c1(pool, {LayerPlanes{0, 1}}, T);
  c1.set_base_position(1);
  std::vector<float> l0((T - 1) * V), m0((T - 1) * CH), l1((T - 2) * V);
  model_->draft_forward(0, ids.data() + 1, hidden.data(), T - 1, 0, c0, l0.data(), m0.data());
  model_->draft_forward(1, ids.data() + 2, m0.data(), T - 2, 1, c1, l1.data(), nullptr);
  expect_rows(l0, 0, ref.ids("mtp0_logits_rows"), ref.f32("mtp0_logits"), "MTP layer 0");
  expect_rows(l1, 1, ref.ids("mtp1_logits_rows"), ref.f32("mtp1_logits"), "MTP layer 1");
}

TEST_F(BundledQwen, GreedyWithAndWithoutSpeculationMatchesTransformers) {
  testing::Reference ref(kRef);
  const auto ids = ref.ids("input_ids");
  const auto expect = ref.ids("greedy_ids");
  SamplingParams sp;
  sp.max_tokens = static_cast<int>(expect.size());
  for (int k : {0, 1, 3, 7}) {
    SpecOptions so;
    so.enabled = k > 0;
    so.num_speculative_tokens = std::max(k, 1);
    auto res = Generator(*model_).generate(ids, sp, so);
    EXPECT_EQ(res.ids, expect) << "k " << k;
    if (k > 0) {
      EXPECT_GT(res.stats.mean_acceptance_length(), 1.5) << "k " << k << ": the trained MTP layers draft well";
    }
  }
}

// Drafts through an FP8 copy of the bf16 lm_head: the same tokens, nearly the same acceptance
// (tests/draft_head_check.h).
TEST_F(BundledQwen, Fp8DraftHeadKeepsTheTokensAndTheAcceptance) {
  testing::expect_fp8_draft_head_keeps_tokens_and_acceptance(*model_, Tokenizer::from_dir(kModel));
}

// Drafting resumed after stretches of plain rounds (tests/resumed_drafting.h).
TEST_F(BundledQwen, DraftingResumedAfterPlainStretchesKeepsItsAcceptance) {
  testing::expect_resumed_drafting_keeps_acceptance(*model_, Tokenizer::from_dir(kModel));
}

}  // namespace
}  // namespace nextn
