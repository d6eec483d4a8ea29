// FP8 checkpoints against transformers over the same dequantized weights (tests/fixtures/hy_v4_fp8, written
// by tools/fixtures/make_hy_v4_fp8_layouts.py from fixture a_fp32): fp32 block scales, UE8M0 scales, and an
// FP8 backbone whose MTP layer stays BF16 through mtp_quant_algo + a "model.mtp_layers.0.*" exclusion.
// Weights stay FP8 in memory; the kernels dequantize them, so fp32 tolerances apply.
#include <gtest/gtest.h>

#include "models/hy_v4/model.h"
#include "engine/generator.h"
#include "test_util.h"

namespace nextn {
namespace {

class Fp8Layouts : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8Layouts, TargetAndDraftMatchTransformersOnDequantizedWeights) {
  const std::string dir = std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4_fp8/" + GetParam();
  HYV4Model m(dir, nullptr);
  const bool bf16_mtp = std::string(GetParam()) == "fp8_bf16_mtp";
  EXPECT_EQ(m.weights().layers[1].attn.q_b_proj.dtype, DType::F8_E4M3);
  EXPECT_EQ(m.weights().layers[1].ffn.expert_gate[0].dtype, DType::F8_E4M3);
  ASSERT_EQ(m.num_mtp_layers(), 1);
  EXPECT_EQ(m.weights().mtp[0].block.attn.q_b_proj.dtype, bf16_mtp ? DType::BF16 : DType::F8_E4M3);

  testing::Reference ref(dir);
  auto ids = ref.ids("input_ids");
  const int64_t T = ids.size(), V = m.config().vocab_size, H = m.config().hidden_size;
  ASSERT_GT(T, m.config().index_topk);
  KVCache cache = m.new_cache(T);
  std::vector<float> logits(T * V), hidden(T * H);
  m.forward(ids.data(), T, cache, logits.data(), hidden.data());
  auto r = ref.f32("logits");
  auto d = testing::compare(logits.data(), r.data(), T, V);
  EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0);

  KVCache dc = m.new_draft_cache(T);
  std::vector<float> dl((T - 1) * V);
  m.draft_forward(0, ids.data() + 1, hidden.data(), T - 1, 0, dc, dl.data(), nullptr);
  auto rd = ref.f32("draft_logits");
  auto dd = testing::compare(dl.data(), rd.data(), T - 1, V);
  EXPECT_LE(dd.rel(), 1e-4) << "draft max|Δ| " << dd.max_abs;
  EXPECT_EQ(dd.argmax_mismatches, 0);

  auto greedy = ref.ids("greedy_ids");
  SamplingParams sp;
  sp.max_tokens = static_cast<int>(greedy.size());
  for (bool spec : {false, true}) {
    SpecOptions so;
    so.enabled = spec;
    EXPECT_EQ(Generator(m).generate(ids, sp, so).ids, greedy) << (spec ? "speculative" : "plain");
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Fp8Layouts, ::testing::Values("fp8_f32scale", "fp8_ue8m0", "fp8_bf16_mtp"));

}  // namespace
}  // namespace nextn
