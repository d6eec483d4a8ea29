#include "models/hy_v4/config.h"
#include "models/common/config_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/hy_v4/synthetic.h"

namespace nextn {
namespace {

using nlohmann::json;

const char* kSrc = "test/config.json";

HYV4Config parse(const json& j) { return parse_hy_v4_config(j, kSrc); }

json base() { return json{{"model_type", "hy_v4"}}; }

// Expects parse to throw nextn::Error whose message names the source file and every `needles` entry.
void expect_error(const json& j, const std::vector<std::string>& needles) {
  try {
    parse(j);
    ADD_FAILURE() << "expected nextn::Error for " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(kSrc), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

json with(json j, const std::string& key, const json& value) {
  j[key] = value;
  return j;
}

// Straightforward double-precision YaRN reference.
struct YarnRef {
  std::vector<double> inv_freq;
  double attention_factor;
};

double ref_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

YarnRef yarn_reference(double theta, int dim, double factor, double orig, double mscale, double mscale_all_dim,
                       double beta_fast = 32, double beta_slow = 1, bool truncate = true) {
  const double pi = 3.14159265358979323846;
  auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * pi)) / (2 * std::log(theta)); };
  double lo = corr(beta_fast), hi = corr(beta_slow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, dim - 1.0);
  if (lo == hi) hi += 0.001;
  YarnRef r;
  for (int i = 0; i < dim / 2; ++i) {
    double pos = std::pow(theta, 2.0 * i / dim);
    double ramp = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
    double extrap_w = 1.0 - ramp;
    r.inv_freq.push_back((1.0 / (factor * pos)) * (1.0 - extrap_w) + (1.0 / pos) * extrap_w);
  }
  if (mscale != 0 && mscale_all_dim != 0)
    r.attention_factor = ref_mscale(factor, mscale) / ref_mscale(factor, mscale_all_dim);
  else
    r.attention_factor = ref_mscale(factor, 1.0);
  return r;
}

void expect_rel_near(double got, double want, double rel = 1e-6) {
  EXPECT_NEAR(got, want, std::abs(want) * rel) << "got " << got << " want " << want;
}

json yarn_config(double mscale, double mscale_all_dim) {
  json j = base();
  j["qk_rope_head_dim"] = 16;
  j["qk_nope_head_dim"] = 48;
  j["max_position_embeddings"] = 256;
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 10000},
                          {"factor", 4},
                          {"original_max_position_embeddings", 64},
                          {"mscale", mscale},
                          {"mscale_all_dim", mscale_all_dim}};
  return j;
}

TEST(HYV4Config, DefaultsMatchTransformers) {
  HYV4Config c = parse(base());
  EXPECT_EQ(c.vocab_size, 120832);
  EXPECT_EQ(c.hidden_size, 2816);
  EXPECT_EQ(c.intermediate_size, 6912);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 34);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.pad_token_id, 120002);
  EXPECT_EQ(c.bos_token_id, 120000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{120025});
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.qk_head_dim, 256);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_n_heads, 16);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_DOUBLE_EQ(c.hc_magnitude, 2.0);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.learnable_sink_init, 0.0);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_TRUE(c.swiglu_clamped());
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.mtp_quant_algo, "");
  EXPECT_FALSE(c.quant.present);
  EXPECT_EQ(c.torch_dtype, "");

  ASSERT_EQ(c.mlp_layer_types.size(), 34u);
  EXPECT_EQ(c.mlp_layer_types[0], "dense");
  for (int i = 1; i < 34; ++i) EXPECT_EQ(c.mlp_layer_types[i], "sparse") << i;
  EXPECT_FALSE(c.is_sparse_mlp(0));
  EXPECT_TRUE(c.is_sparse_mlp(1));
  EXPECT_TRUE(c.is_sparse_mlp(33));
  ASSERT_EQ(c.layer_types.size(), 34u);
  for (const auto& t : c.layer_types) EXPECT_EQ(t, "deepseek_sparse_attention");
  ASSERT_EQ(c.indexer_types.size(), 34u);
  EXPECT_EQ(c.indexer_types[0], "full");
  EXPECT_EQ(c.indexer_types[1], "full");
  EXPECT_EQ(c.indexer_types[2], "shared");
  EXPECT_EQ(c.indexer_types[3], "shared");
  EXPECT_EQ(c.indexer_types[4], "shared");
  EXPECT_EQ(c.indexer_types[5], "full");
  EXPECT_EQ(c.indexer_types[9], "full");
  EXPECT_EQ(c.indexer_types[33], "full");
  EXPECT_EQ(c.indexer_types[32], "shared");
  EXPECT_TRUE(c.has_own_indexer(0));
  EXPECT_TRUE(c.has_own_indexer(5));
  EXPECT_FALSE(c.has_own_indexer(6));
  EXPECT_THROW(c.has_own_indexer(34), Error);

  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.0);
  EXPECT_EQ(c.rope.dim, 64);
  EXPECT_DOUBLE_EQ(c.attn_scale, std::pow(256.0, -0.5));
}

TEST(HYV4Config, DefaultRopeInvFreq) {
  json j = with(base(), "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}});
  HYV4Config c = parse(j);
  EXPECT_EQ(c.rope.type, "default");
  ASSERT_EQ(c.rope.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) expect_rel_near(c.rope.inv_freq[i], 1.0 / std::pow(1e6, 2.0 * i / 64));
  EXPECT_EQ(c.rope.inv_freq[0], 1.0f);

  HYV4Config d = parse(base());
  ASSERT_EQ(d.rope.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) expect_rel_near(d.rope.inv_freq[i], 1.0 / std::pow(10000.0, 2.0 * i / 64));
}

TEST(HYV4Config, ExplicitValuesOverride) {
  json j = base();
  j["vocab_size"] = 1000;
  j["hidden_size"] = 64;
  j["intermediate_size"] = 128;
  j["moe_intermediate_size"] = 32;
  j["num_hidden_layers"] = 3;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 1;  // forced to num_attention_heads
  j["head_dim"] = 999;           // forced to qk_rope_head_dim
  j["hidden_act"] = "gelu";
  j["max_position_embeddings"] = 4096;
  j["rms_norm_eps"] = 1e-6;
  j["pad_token_id"] = nullptr;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = json::array({2, 3});
  j["tie_word_embeddings"] = true;
  j["attention_bias"] = true;
  j["n_routed_experts"] = 16;
  j["n_shared_experts"] = 0;
  j["num_experts_per_tok"] = 4;
  j["routed_scaling_factor"] = 1.5;
  j["norm_topk_prob"] = false;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["q_lora_rank"] = nullptr;
  j["kv_lora_rank"] = 32;
  j["qk_nope_head_dim"] = 24;
  j["qk_rope_head_dim"] = 8;
  j["v_head_dim"] = 16;
  j["mlp_layer_types"] = json::array({"dense", "dense", "sparse"});
  j["indexer_types"] = json::array({"full", "shared", "full"});
  j["index_topk"] = 64;
  j["index_head_dim"] = 32;
  j["index_n_heads"] = 2;
  j["hc_mult"] = 2;
  j["hc_magnitude"] = 1;
  j["hc_eps"] = 1e-5;
  j["learnable_sink_init"] = -1.5;
  j["swiglu_limit"] = 0;
  j["rope_theta"] = 50000;
  j["num_nextn_predict_layers"] = 1;
  j["mtp_quant_algo"] = "fp8";
  j["dtype"] = "bfloat16";
  j["torch_dtype"] = "float16";
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"weight_block_size", {128, 128}},
                              {"activation_scheme", "dynamic"},
                              {"scale_fmt", "ue8m0"},
                              {"ignored_layers", {"lm_head"}},
                              {"modules_to_not_convert", {"lm_head", "model.layers.0.mlp"}},
                              {"exclude_modules", {"gate"}}};
  HYV4Config c = parse(j);
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.q_lora_rank, -1);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_head_dim, 32);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_EQ(c.mlp_layer_types, (std::vector<std::string>{"dense", "dense", "sparse"}));
  EXPECT_EQ(c.layer_types, std::vector<std::string>(3, "deepseek_sparse_attention"));
  EXPECT_EQ(c.indexer_types, (std::vector<std::string>{"full", "shared", "full"}));
  EXPECT_FALSE(c.is_sparse_mlp(1));
  EXPECT_TRUE(c.is_sparse_mlp(2));
  EXPECT_FALSE(c.has_own_indexer(1));
  EXPECT_TRUE(c.has_own_indexer(2));
  EXPECT_EQ(c.index_topk, 64);
  EXPECT_EQ(c.index_head_dim, 32);
  EXPECT_EQ(c.index_n_heads, 2);
  EXPECT_EQ(c.hc_mult, 2);
  EXPECT_DOUBLE_EQ(c.hc_magnitude, 1.0);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.learnable_sink_init, -1.5);
  EXPECT_FALSE(c.swiglu_clamped());
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
  ASSERT_EQ(c.rope.inv_freq.size(), 4u);
  expect_rel_near(c.rope.inv_freq[3], 1.0 / std::pow(50000.0, 6.0 / 8));
  EXPECT_DOUBLE_EQ(c.attn_scale, std::pow(32.0, -0.5));
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.mtp_quant_algo, "fp8");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  ASSERT_TRUE(c.quant.present);
  EXPECT_EQ(c.quant.quant_method, "fp8");
  EXPECT_EQ(c.quant.fmt, "e4m3");
  EXPECT_EQ(c.quant.weight_block_size, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(c.quant.activation_scheme, "dynamic");
  EXPECT_EQ(c.quant.scale_fmt, "ue8m0");
  EXPECT_EQ(c.quant.ignored_layers, (std::vector<std::string>{"lm_head", "model.layers.0.mlp", "gate"}));
  EXPECT_EQ(c.quant.raw["fmt"], "e4m3");
}

TEST(HYV4Config, TokenIdsAndAliases) {
  json j = base();
  j["eos_token_id"] = 7;
  j["bos_token_id"] = nullptr;
  j["num_local_experts"] = 64;
  j["torch_dtype"] = "float16";
  HYV4Config c = parse(j);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{7});
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, 120002);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_TRUE(parse(with(base(), "eos_token_id", nullptr)).eos_token_ids.empty());
}

TEST(HYV4Config, YarnInvFreqAndAttentionFactor) {
  for (double mscale : {1.0, 0.707}) {
    HYV4Config c = parse(yarn_config(mscale, 1.0));
    YarnRef ref = yarn_reference(10000, 16, 4, 64, mscale, 1.0);
    EXPECT_EQ(c.rope.type, "yarn");
    EXPECT_EQ(c.rope.dim, 16);
    EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 64);
    EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32);
    EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1);
    EXPECT_TRUE(c.rope.truncate);
    ASSERT_EQ(c.rope.inv_freq.size(), 8u);
    for (int i = 0; i < 8; ++i) expect_rel_near(c.rope.inv_freq[i], ref.inv_freq[i]);
    expect_rel_near(c.rope.attention_factor, ref.attention_factor, 1e-12);
    // attn_scale = qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2
    double m = 0.1 * std::log(4.0) + 1.0;
    expect_rel_near(c.attn_scale, (1.0 / std::sqrt(64.0)) * m * m, 1e-12);
  }
  EXPECT_DOUBLE_EQ(parse(yarn_config(1.0, 1.0)).rope.attention_factor, 1.0);
  expect_rel_near(parse(yarn_config(0.707, 1.0)).rope.attention_factor,
                  (0.1 * 0.707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1), 1e-12);

  // The ramp actually mixes: first entry pure extrapolation, last pure interpolation.
  HYV4Config c = parse(yarn_config(1.0, 1.0));
  expect_rel_near(c.rope.inv_freq[0], 1.0);
  expect_rel_near(c.rope.inv_freq[7], 1.0 / (4 * std::pow(10000.0, 14.0 / 16)));
}

TEST(HYV4Config, YarnWithoutMscaleAllDim) {
  json j = yarn_config(0, 0);
  j["rope_parameters"].erase("mscale");
  j["rope_parameters"].erase("mscale_all_dim");
  HYV4Config c = parse(j);
  // attention_factor falls back to mscale(factor, 1); attn_scale is unscaled.
  expect_rel_near(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(c.attn_scale, std::pow(64.0, -0.5));
  YarnRef ref = yarn_reference(10000, 16, 4, 64, 0, 0);
  for (int i = 0; i < 8; ++i) expect_rel_near(c.rope.inv_freq[i], ref.inv_freq[i]);

  // mscale alone (no mscale_all_dim) also uses the plain formula.
  json k = yarn_config(0.707, 0);
  expect_rel_near(parse(k).rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
}

TEST(HYV4Config, YarnOptions) {
  // Explicit attention_factor, betas, truncate=false.
  json j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["attention_factor"] = 1.25;
  j["rope_parameters"]["beta_fast"] = 16;
  j["rope_parameters"]["beta_slow"] = 2;
  j["rope_parameters"]["truncate"] = false;
  j["rope_parameters"]["rope_theta"] = 500000.0;
  HYV4Config c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.25);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 16);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 2);
  EXPECT_FALSE(c.rope.truncate);
  YarnRef ref = yarn_reference(500000, 16, 4, 64, 1, 1, 16, 2, false);
  for (int i = 0; i < 8; ++i) expect_rel_near(c.rope.inv_freq[i], ref.inv_freq[i]);

  // Zero betas mean "default"; null factor -> max_position_embeddings / original.
  json k = yarn_config(1.0, 1.0);
  k["rope_parameters"]["beta_fast"] = 0;
  k["rope_parameters"]["beta_slow"] = nullptr;
  k["rope_parameters"]["factor"] = nullptr;
  k["max_position_embeddings"] = 512;
  HYV4Config d = parse(k);
  EXPECT_DOUBLE_EQ(d.rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(d.rope.beta_slow, 1);
  EXPECT_DOUBLE_EQ(d.rope.factor, 8.0);
  YarnRef ref8 = yarn_reference(10000, 16, 8, 64, 1, 1);
  for (int i = 0; i < 8; ++i) expect_rel_near(d.rope.inv_freq[i], ref8.inv_freq[i]);

  // original_max_position_embeddings defaults to max_position_embeddings.
  json m = yarn_config(1.0, 1.0);
  m["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(parse(m).rope.original_max_position_embeddings, 256);
}

TEST(HYV4Config, LegacyRopeScalingPrecedence) {
  // rope_scaling (legacy, "type" key) wins over rope_parameters; top-level rope_theta fills in.
  json j = base();
  j["qk_rope_head_dim"] = 16;
  j["rope_theta"] = 20000.0;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1.0e6}};
  HYV4Config c = parse(j);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 20000.0);
  YarnRef ref = yarn_reference(20000, 16, 4, 64, 0, 0);
  for (int i = 0; i < 8; ++i) expect_rel_near(c.rope.inv_freq[i], ref.inv_freq[i]);

  // The dict's own rope_theta beats the top-level one; an empty rope_scaling is ignored.
  json k = base();
  k["rope_theta"] = 20000.0;
  k["rope_scaling"] = json::object();
  k["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1.0e6}};
  EXPECT_DOUBLE_EQ(parse(k).rope.theta, 1.0e6);

  // Top-level original_max_position_embeddings has priority over the dict's.
  json m = yarn_config(1.0, 1.0);
  m["original_max_position_embeddings"] = 128;
  EXPECT_EQ(parse(m).rope.original_max_position_embeddings, 128);
}

TEST(HYV4Config, ModelTypeErrors) {
  expect_error(json::object(), {"model_type", "nextn supports: hy_v4"});
  expect_error(json{{"model_type", "llama"}}, {"unsupported model_type 'llama'", "(nextn supports: hy_v4)"});
  expect_error(json{{"model_type", 5}}, {"model_type"});
  expect_error(json::array(), {"object"});
}

TEST(HYV4Config, TypeErrors) {
  expect_error(with(base(), "hidden_size", "2816"), {"hidden_size", "integer"});
  expect_error(with(base(), "hidden_size", 2816.5), {"hidden_size"});
  expect_error(with(base(), "hidden_size", nullptr), {"hidden_size"});
  expect_error(with(base(), "num_hidden_layers", true), {"num_hidden_layers"});
  expect_error(with(base(), "rms_norm_eps", "1e-5"), {"rms_norm_eps", "number"});
  expect_error(with(base(), "tie_word_embeddings", 1), {"tie_word_embeddings", "boolean"});
  expect_error(with(base(), "hidden_act", 3), {"hidden_act", "string"});
  expect_error(with(base(), "eos_token_id", json::array({1, "x"})), {"eos_token_id[1]"});
  expect_error(with(base(), "pad_token_id", "0"), {"pad_token_id"});
  expect_error(with(base(), "q_lora_rank", "none"), {"q_lora_rank"});
  expect_error(with(base(), "mlp_layer_types", "dense"), {"mlp_layer_types"});
  expect_error(with(base(), "rope_parameters", 3), {"rope_parameters"});
  expect_error(with(base(), "rope_theta", "1e4"), {"rope_theta"});
  expect_error(with(base(), "quantization_config", "fp8"), {"quantization_config"});
  expect_error(with(base(), "quantization_config", json{{"weight_block_size", {128, "a"}}}),
               {"quantization_config.weight_block_size[1]"});
  expect_error(with(base(), "quantization_config", json{{"ignored_layers", "lm_head"}}),
               {"quantization_config.ignored_layers"});
  expect_error(with(base(), "num_nextn_predict_layers", "1"), {"num_nextn_predict_layers"});
  expect_error(with(base(), "dtype", 16), {"dtype"});
  expect_error(with(base(), "num_hidden_layers", 1LL << 40), {"num_hidden_layers", "out of range"});
}

TEST(HYV4Config, LayerListErrors) {
  json j = with(base(), "num_hidden_layers", 3);
  expect_error(with(j, "mlp_layer_types", json::array({"dense", "sparse"})), {"mlp_layer_types", "num_hidden_layers"});
  expect_error(with(j, "mlp_layer_types", json::array({"dense", "moe", "sparse"})), {"mlp_layer_types[1]", "moe"});
  expect_error(with(j, "mlp_layer_types", json::array({"dense", 1, "sparse"})), {"mlp_layer_types[1]"});
  expect_error(with(j, "indexer_types", json::array({"full", "full"})), {"indexer_types"});
  expect_error(with(j, "indexer_types", json::array({"full", "partial", "full"})), {"indexer_types[1]", "partial"});
  expect_error(with(j, "indexer_types", json::array({"shared", "full", "full"})), {"indexer_types[0]", "full"});
  expect_error(with(j, "layer_types", json::array({"deepseek_sparse_attention"})), {"layer_types"});
}

TEST(HYV4Config, SizeAndMoeErrors) {
  for (const char* f : {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "max_position_embeddings", "kv_lora_rank", "qk_nope_head_dim",
                        "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_group",
                        "topk_group", "index_topk", "index_head_dim", "index_n_heads", "hc_mult", "q_lora_rank"}) {
    expect_error(with(base(), f, 0), {f, "positive"});
    expect_error(with(base(), f, -4), {f});
  }
  expect_error(with(base(), "n_shared_experts", -1), {"n_shared_experts"});
  expect_error(with(base(), "qk_rope_head_dim", 63), {"qk_rope_head_dim", "even"});
  expect_error(with(with(base(), "n_routed_experts", 10), "n_group", 4), {"n_routed_experts", "n_group"});
  expect_error(with(with(base(), "n_group", 2), "topk_group", 3), {"topk_group", "n_group"});
  expect_error(with(with(base(), "n_routed_experts", 4), "num_experts_per_tok", 5),
               {"num_experts_per_tok", "n_routed_experts"});
}

TEST(HYV4Config, RopeErrors) {
  expect_error(with(base(), "rope_parameters", json{{"rope_type", "linear"}, {"factor", 2.0}}),
               {"rope_parameters.rope_type", "linear"});
  expect_error(with(base(), "rope_scaling", json{{"type", "dynamic"}, {"factor", 2.0}}), {"rope_scaling", "dynamic"});
  expect_error(with(base(), "rope_parameters", json{{"rope_type", "yarn"}}), {"rope_parameters.factor"});
  json j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["factor"] = "4";
  expect_error(j, {"rope_parameters.factor"});
  j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["beta_fast"] = "32";
  expect_error(j, {"rope_parameters.beta_fast"});
  j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["truncate"] = 1;
  expect_error(j, {"rope_parameters.truncate"});
  j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["original_max_position_embeddings"] = 0;
  expect_error(j, {"original_max_position_embeddings"});
  j = yarn_config(1.0, 1.0);
  j["rope_parameters"]["rope_theta"] = nullptr;
  expect_error(j, {"rope_parameters.rope_theta"});
  expect_error(with(base(), "rope_parameters", json{{"rope_theta", -1.0}}), {"rope_theta"});
  expect_error(with(base(), "rope_parameters", json{{"deepseek_sparse_attention", {{"rope_type", "default"}}}}),
               {"rope_parameters", "deepseek_sparse_attention"});
}

TEST(HYV4Config, FloatFieldsOutsideTheirMeaningAreErrorsNamingFieldAndValue) {
  struct Case {
    json config;
    std::vector<std::string> needles;
  };
  auto rope = [](json params) {
    json y = yarn_config(1.0, 1.0);
    for (auto& [k, v] : params.items()) y["rope_parameters"][k] = v;
    return y;
  };
  const Case cases[] = {
      {with(base(), "rms_norm_eps", 1e300), {"'rms_norm_eps' is 1e+300", "(0, 1]"}},  // float32 infinity
      {with(base(), "rms_norm_eps", 0.0), {"'rms_norm_eps' is 0"}},                    // 0 / 0 on a zero row
      {with(base(), "rms_norm_eps", -1e-5), {"'rms_norm_eps'"}},
      {with(base(), "hc_eps", -1.0), {"'hc_eps' is -1"}},
      {with(base(), "hc_eps", 2.0), {"'hc_eps' is 2"}},
      {with(base(), "hc_magnitude", 0), {"'hc_magnitude' is 0"}},
      {with(base(), "hc_magnitude", 1e30), {"'hc_magnitude' is 1e+30"}},
      {with(base(), "routed_scaling_factor", 1e38), {"'routed_scaling_factor' is 1e+38", "(0, 100]"}},
      {with(base(), "routed_scaling_factor", -2.5), {"'routed_scaling_factor' is -2.5"}},
      {with(base(), "swiglu_limit", 1e300), {"'swiglu_limit' is 1e+300", "not a finite float32"}},
      {with(base(), "learnable_sink_init", -1e39), {"'learnable_sink_init' is -1e+39"}},
      {with(base(), "rope_parameters", json{{"rope_theta", 1e-300}}), {"'rope_parameters.rope_theta' is 1e-300"}},
      {with(base(), "rope_theta", 0.5), {"'rope_theta' is 0.5"}},
      {with(base(), "rope_parameters", json{{"rope_theta", 1e39}}), {"'rope_parameters.rope_theta' is 1e+39"}},
      {with(base(), "partial_rotary_factor", 0.5), {"partial_rotary_factor", "0.5"}},
      {rope({{"attention_factor", -1e308}}), {"'rope_parameters.attention_factor' is -1e+308"}},
      {rope({{"attention_factor", 0.0}}), {"'rope_parameters.attention_factor' is 0"}},
      {rope({{"beta_fast", 1.0}, {"beta_slow", 32.0}}),
       {"'rope_parameters.beta_fast' (1) is below 'rope_parameters.beta_slow' (32)"}},
      {rope({{"beta_slow", -1.0}}), {"'rope_parameters.beta_slow' is -1"}},
      {rope({{"mscale", -1.0}}), {"'rope_parameters.mscale' is -1"}},
      {rope({{"mscale_all_dim", 1e9}}), {"'rope_parameters.mscale_all_dim' is 1e+09"}},
      {rope({{"factor", 1e39}}), {"'rope_parameters.factor' is 1e+39"}},
      // derived from mscale / mscale_all_dim: (0.1 * 100 * ln(1e6) + 1) / (0.1 * 1e-9 * ln(1e6) + 1)
      {rope({{"factor", 1e6}, {"mscale", 100.0}, {"mscale_all_dim", 1e-9}}),
       {"'rope_parameters.attention_factor' is 139.1", "from mscale / mscale_all_dim"}},
  };
  for (const Case& c : cases) expect_error(c.config, c.needles);
}

TEST(HYV4Config, OddButMeaningfulFloatValuesAreAcceptedWithAWarning) {
  HYV4Config c = parse(with(base(), "swiglu_limit", -1.0));
  EXPECT_FALSE(c.swiglu_clamped());
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("'swiglu_limit' is -1: the routed experts' SwiGLU clamp is off"), std::string::npos)
      << c.warnings[0];
  EXPECT_TRUE(parse(with(base(), "swiglu_limit", 0.0)).warnings.empty());  // 0: off, the documented way

  json y = yarn_config(1.0, 1.0);
  y["rope_parameters"]["factor"] = 0.5;
  const HYV4Config d = parse(y);
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_NE(d.warnings[0].find("'rope_parameters.factor' is 0.5 < 1"), std::string::npos) << d.warnings[0];
  EXPECT_TRUE(parse(yarn_config(1.0, 1.0)).warnings.empty());
  EXPECT_TRUE(parse(base()).warnings.empty());
}

TEST(HYV4Config, SizesBeyondWhatNextnSupportsAreErrors) {
  expect_error(with(base(), "hidden_size", int64_t(1) << 40), {"'hidden_size' is 1099511627776", "more than nextn"});
  expect_error(with(base(), "vocab_size", int64_t(1) << 31), {"'vocab_size' is 2147483648"});
  expect_error(with(base(), "num_hidden_layers", 100000), {"'num_hidden_layers' is 100000"});
  expect_error(with(base(), "num_nextn_predict_layers", 1000), {"'num_nextn_predict_layers' is 1000"});
  expect_error(with(base(), "qk_rope_head_dim", 1 << 20), {"'qk_rope_head_dim' is 1048576"});
  expect_error(with(base(), "num_attention_heads", 1 << 20), {"'num_attention_heads' is 1048576"});
  expect_error(with(with(base(), "n_routed_experts", 2048), "num_experts_per_tok", 8), {"'n_routed_experts' is 2048"});
  expect_error(with(with(base(), "n_routed_experts", 1024), "n_group", 512), {"'n_group' is 512"});
  expect_error(with(base(), "hc_mult", 1 << 20), {"'hc_mult' is 1048576"});
  expect_error(with(base(), "index_topk", int64_t(1) << 40), {"'index_topk' is 1099511627776"});
  expect_error(with(base(), "quantization_config", json{{"weight_block_size", {int64_t(1) << 40, 128}}}),
               {"weight_block_size[0]"});
  expect_error(with(base(), "eos_token_id", int64_t(1) << 33), {"'eos_token_id' is 8589934592", "not a token id"});
  expect_error(with(base(), "eos_token_id", json::array({2, -1})), {"'eos_token_id' holds -1"});
  expect_error(with(base(), "bos_token_id", -7), {"'bos_token_id' is -7"});
  // The largest accepted values parse (nothing is allocated by their size).
  HYV4Config c = parse(with(with(base(), "index_topk", 2147483647), "max_position_embeddings", 2147483647));
  EXPECT_EQ(c.index_topk, 2147483647);
}

TEST(HYV4Config, RecordsTheSizeFieldsThatTookTransformersDefaults) {
  const HYV4Config d = parse(base());
  for (const char* f : {"vocab_size", "hidden_size", "num_hidden_layers", "n_routed_experts", "kv_lora_rank"})
    EXPECT_TRUE(d.is_defaulted(f)) << f;
  json j = with(with(base(), "hidden_size", 64), "num_local_experts", 16);
  const HYV4Config c = parse(j);
  EXPECT_FALSE(c.is_defaulted("hidden_size"));
  EXPECT_FALSE(c.is_defaulted("n_routed_experts"));  // set through its alias
  EXPECT_TRUE(c.is_defaulted("vocab_size"));
}

class HYV4ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("nextn_hy_v4_cfg_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }
  std::filesystem::path dir_;
};

TEST_F(HYV4ConfigFiles, LoadsFromDirectory) {
  write(R"({"model_type": "hy_v4", "num_hidden_layers": 6, "hidden_size": 128})");
  HYV4Config c = load_hy_v4_config(dir_.string());
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.indexer_types.size(), 6u);
  EXPECT_EQ(cfg::read_model_type(dir_.string()), "hy_v4");
}

TEST_F(HYV4ConfigFiles, ErrorsNameTheFile) {
  const std::string path = (dir_ / "config.json").string();
  write(R"({"model_type": "hy_v4", "hidden_size": )");
  try {
    load_hy_v4_config(dir_.string());
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("parse error"), std::string::npos) << msg;
  }
  EXPECT_THROW(cfg::read_model_type(dir_.string()), Error);

  write(R"({"model_type": "hy_v4", "hidden_size": "big"})");
  try {
    load_hy_v4_config(dir_.string());
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  }

  // A number beyond a double is nlohmann's out_of_range, not a parse_error (found by fuzz_hy_v4_config:
  // it escaped as std::terminate).
  write(R"({"model_type": "hy_v4", "hidden_size": 1111111111111E1111})");
  try {
    load_hy_v4_config(dir_.string());
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path + ": malformed JSON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("number overflow"), std::string::npos) << msg;
  }

  write(R"({"model_type": "qwen3"})");
  EXPECT_EQ(cfg::read_model_type(dir_.string()), "qwen3");
  write(R"({"vocab_size": 3})");
  EXPECT_THROW(cfg::read_model_type(dir_.string()), Error);

  std::filesystem::remove(dir_ / "config.json");
  EXPECT_THROW(load_hy_v4_config(dir_.string()), Error);
  EXPECT_THROW(cfg::read_model_type(dir_.string()), Error);
}

}  // namespace
}  // namespace nextn

// bench --synthetic --layers: the default checkpoints keep their cache names (a cached one is reused),
// another depth gets its own, and its config parses with that many layers.
TEST(HYV4Synthetic, DepthIsPartOfTheCheckpointAndItsName) {
  EXPECT_EQ(nextn::hy_v4_synthetic_name(true, false, nextn::kHYV4SyntheticLayers), "synthetic-hy4-v2-fp8");
  EXPECT_EQ(nextn::hy_v4_synthetic_name(false, true, nextn::kHYV4SyntheticLayers), "synthetic-hy4-v2-bf16-dense");
  EXPECT_EQ(nextn::hy_v4_synthetic_name(true, true, 48), "synthetic-hy4-v2-fp8-dense-48l");
  const nextn::HYV4Config c = nextn::parse_hy_v4_config(nextn::hy_v4_synthetic_config(true, true, 48), "synthetic");
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(nextn::hy_v4_synthetic_facts(true, true, 48).num_mtp_layers, 1);
  EXPECT_THROW(nextn::hy_v4_synthetic_config(true, true, 0), nextn::Error);
  // Other widths: every FP8-tiled dimension still a multiple of 128, the name apart from the default's.
  EXPECT_EQ(nextn::hy_v4_synthetic_name(true, true, 8, 7168), "synthetic-hy4-v2-fp8-dense-h7168");
  const nextn::HYV4Config w = nextn::parse_hy_v4_config(nextn::hy_v4_synthetic_config(true, true, 8, 7168), "wide");
  EXPECT_EQ(w.hidden_size, 7168);
  for (int64_t d : {w.intermediate_size, w.moe_intermediate_size, w.q_lora_rank, w.kv_lora_rank})
    EXPECT_EQ(d % 128, 0) << d;
  EXPECT_EQ(nextn::parse_hy_v4_config(nextn::hy_v4_synthetic_config(true, true, 8), "default").intermediate_size, 5632);
  for (int bad : {0, 1000, 9216}) EXPECT_THROW(nextn::hy_v4_synthetic_config(true, true, 8, bad), nextn::Error) << bad;
  EXPECT_THROW(nextn::hy_v4_synthetic_config(true, true, nextn::kHYV4SyntheticMaxLayers + 1), nextn::Error);
}
