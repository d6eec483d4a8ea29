#include "models/hy_v4/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>

#include "core/error.h"
#include "models/common/config_json.h"

namespace nextn {

using nlohmann::json;
using namespace cfg;

namespace {

void validate_floats(HYV4Config& c, const std::string& src) {
  // An RMSNorm of an all-zero row (the MTP layer's embedding at position 0) divides by sqrt(eps).
  require_range(c.rms_norm_eps, 0.0, true, 1.0, "rms_norm_eps", src, "the epsilon of every RMSNorm and LayerNorm");
  require_range(c.hc_eps, 0.0, false, 1.0, "hc_eps", src, "the epsilon added to the hyper-connection gates");
  require_range(c.hc_magnitude, 0.0, true, 100.0, "hc_magnitude", src, "the scale of the hyper-connection post gates");
  require_range(c.routed_scaling_factor, 0.0, true, 100.0, "routed_scaling_factor", src,
                "the scale of the routed experts' weights");
  require_float_finite(c.swiglu_limit, "swiglu_limit", src);
  require_float_finite(c.learnable_sink_init, "learnable_sink_init", src);
  if (c.swiglu_limit < 0)
    c.warnings.push_back("field 'swiglu_limit' is " + number_text(c.swiglu_limit) +
                         ": the routed experts' SwiGLU clamp is off (as in transformers for any value <= 0)");
}

// Sizes: positive (where transformers needs them to be) and within HYV4Limits.
void validate_sizes(const HYV4Config& c, const std::string& src) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.moe_intermediate_size}, {"max_position_embeddings", c.max_position_embeddings},
      {"kv_lora_rank", c.kv_lora_rank}, {"index_topk", c.index_topk}};
  for (const auto& [name, v] : sizes) {
    require_positive(v, name, src);
    require_at_most(v, HYV4Limits::kSize, name, src);
  }
  if (c.q_lora_rank != -1) {
    require_positive(c.q_lora_rank, "q_lora_rank", src);
    require_at_most(c.q_lora_rank, HYV4Limits::kSize, "q_lora_rank", src);
  }
  const std::pair<const char*, int64_t> heads_and_dims[] = {
      {"num_attention_heads", c.num_attention_heads}, {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},       {"v_head_dim", c.v_head_dim},
      {"index_head_dim", c.index_head_dim},           {"index_n_heads", c.index_n_heads}};
  for (const auto& [name, v] : heads_and_dims) {
    require_positive(v, name, src);
    require_at_most(v, HYV4Limits::kHeadCountOrDim, name, src);
  }
  require_positive(c.num_hidden_layers, "num_hidden_layers", src);
  require_at_most(c.num_hidden_layers, HYV4Limits::kLayers, "num_hidden_layers", src);
  require_at_most(c.num_nextn_predict_layers, HYV4Limits::kMtpLayers, "num_nextn_predict_layers", src);
  require_positive(c.n_routed_experts, "n_routed_experts", src);
  require_at_most(c.n_routed_experts, HYV4Limits::kCount, "n_routed_experts", src);
  if (c.n_shared_experts < 0)
    fail(src, "field 'n_shared_experts' must be non-negative, got " + std::to_string(c.n_shared_experts));
  require_at_most(c.n_shared_experts, HYV4Limits::kCount, "n_shared_experts", src);
  require_positive(c.num_experts_per_tok, "num_experts_per_tok", src);
  require_positive(c.n_group, "n_group", src);
  require_at_most(c.n_group, HYV4Limits::kExpertGroups, "n_group", src);
  require_positive(c.topk_group, "topk_group", src);
  require_positive(c.hc_mult, "hc_mult", src);
  require_at_most(c.hc_mult, HYV4Limits::kCount, "hc_mult", src);
  if (c.qk_rope_head_dim % 2 != 0)
    fail(src, "field 'qk_rope_head_dim' must be even, got " + std::to_string(c.qk_rope_head_dim));
  if (c.n_routed_experts % c.n_group != 0)
    fail(src, "field 'n_routed_experts' (" + std::to_string(c.n_routed_experts) + ") must be divisible by 'n_group' (" +
                  std::to_string(c.n_group) + ")");
  if (c.topk_group > c.n_group)
    fail(src, "field 'topk_group' (" + std::to_string(c.topk_group) + ") must not exceed 'n_group' (" +
                  std::to_string(c.n_group) + ")");
  if (c.num_experts_per_tok > c.n_routed_experts)
    fail(src, "field 'num_experts_per_tok' (" + std::to_string(c.num_experts_per_tok) +
                  ") must not exceed 'n_routed_experts' (" + std::to_string(c.n_routed_experts) + ")");
  require_token_ids(c.pad_token_id, c.bos_token_id, c.eos_token_ids, src);
}

// The size fields transformers defaults that config.json leaves out (HYV4Config::defaulted).
std::vector<std::string> defaulted_sizes(const json& j) {
  std::vector<std::string> out;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                        "v_head_dim", "index_head_dim", "index_n_heads", "hc_mult", "n_shared_experts"})
    if (!find(j, k)) out.emplace_back(k);
  if (!find(j, "n_routed_experts") && !find(j, "num_local_experts")) out.emplace_back("n_routed_experts");
  return out;
}

}  // namespace

bool HYV4Config::is_sparse_mlp(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(mlp_layer_types.size()))
    throw Error("HYV4Config::is_sparse_mlp: layer " + std::to_string(layer) + " out of range");
  return mlp_layer_types[layer] == "sparse";
}

bool HYV4Config::is_defaulted(const std::string& field) const {
  return std::find(defaulted.begin(), defaulted.end(), field) != defaulted.end();
}

bool HYV4Config::has_own_indexer(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(indexer_types.size()))
    throw Error("HYV4Config::has_own_indexer: layer " + std::to_string(layer) + " out of range");
  return indexer_types[layer] == "full";
}

HYV4Config parse_hy_v4_config(const json& j, const std::string& src) {
  if (!j.is_object()) fail(src, "config must be a JSON object, got " + std::string(j.type_name()));
  {
    const json* mt = find(j, "model_type");
    std::string name = "(missing)";
    if (mt) name = mt->is_string() ? "'" + mt->get<std::string>() + "'" : mt->dump();
    if (!mt || !mt->is_string() || mt->get<std::string>() != "hy_v4")
      fail(src, "unsupported model_type " + name + " (nextn supports: hy_v4)");
  }

  HYV4Config c;
  read(j, "vocab_size", c.vocab_size, src);
  read(j, "hidden_size", c.hidden_size, src);
  read(j, "intermediate_size", c.intermediate_size, src);
  read(j, "moe_intermediate_size", c.moe_intermediate_size, src);
  read(j, "num_hidden_layers", c.num_hidden_layers, src);
  read(j, "num_attention_heads", c.num_attention_heads, src);
  read(j, "num_key_value_heads", c.num_key_value_heads, src);  // type-checked, then overridden
  read(j, "head_dim", c.head_dim, src);                        // type-checked, then overridden
  read(j, "hidden_act", c.hidden_act, src);
  read(j, "max_position_embeddings", c.max_position_embeddings, src);
  read(j, "rms_norm_eps", c.rms_norm_eps, src);
  read_token_id(j, "pad_token_id", c.pad_token_id, src);
  read_token_id(j, "bos_token_id", c.bos_token_id, src);
  read_eos_ids(j, "eos_token_id", c.eos_token_ids, src);
  read(j, "tie_word_embeddings", c.tie_word_embeddings, src);
  read(j, "attention_bias", c.attention_bias, src);
  if (find(j, "n_routed_experts"))
    read(j, "n_routed_experts", c.n_routed_experts, src);
  else
    read(j, "num_local_experts", c.n_routed_experts, src);
  read(j, "n_shared_experts", c.n_shared_experts, src);
  read(j, "num_experts_per_tok", c.num_experts_per_tok, src);
  read(j, "routed_scaling_factor", c.routed_scaling_factor, src);
  read(j, "norm_topk_prob", c.norm_topk_prob, src);
  read(j, "n_group", c.n_group, src);
  read(j, "topk_group", c.topk_group, src);
  if (const json* v = find(j, "q_lora_rank")) c.q_lora_rank = v->is_null() ? -1 : as_int64(*v, "q_lora_rank", src);
  read(j, "kv_lora_rank", c.kv_lora_rank, src);
  read(j, "qk_nope_head_dim", c.qk_nope_head_dim, src);
  read(j, "qk_rope_head_dim", c.qk_rope_head_dim, src);
  read(j, "v_head_dim", c.v_head_dim, src);
  read(j, "index_topk", c.index_topk, src);
  read(j, "index_head_dim", c.index_head_dim, src);
  read(j, "index_n_heads", c.index_n_heads, src);
  read(j, "hc_mult", c.hc_mult, src);
  read(j, "hc_magnitude", c.hc_magnitude, src);
  read(j, "hc_eps", c.hc_eps, src);
  read(j, "learnable_sink_init", c.learnable_sink_init, src);
  read(j, "swiglu_limit", c.swiglu_limit, src);

  if (const json* v = find(j, "num_nextn_predict_layers"); v && !v->is_null())
    c.num_nextn_predict_layers = as_int(*v, "num_nextn_predict_layers", src);
  else if (const json* m = find(j, "num_mtp_layers"); m && !m->is_null())
    c.num_nextn_predict_layers = as_int(*m, "num_mtp_layers", src);
  if (c.num_nextn_predict_layers < 0)
    fail(src, "field 'num_nextn_predict_layers' must be non-negative, got " + std::to_string(c.num_nextn_predict_layers));
  if (const json* v = find(j, "dtype"); v && !v->is_null())
    c.torch_dtype = as_string(*v, "dtype", src);
  else if (const json* t = find(j, "torch_dtype"); t && !t->is_null())
    c.torch_dtype = as_string(*t, "torch_dtype", src);

  validate_sizes(c, src);
  validate_floats(c, src);
  c.defaulted = defaulted_sizes(j);

  // Derived values.
  c.num_key_value_heads = c.num_attention_heads;
  c.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.head_dim = c.qk_rope_head_dim;

  const int L = c.num_hidden_layers;
  c.mlp_layer_types.assign(L, "sparse");
  c.mlp_layer_types[0] = "dense";
  c.layer_types.assign(L, "deepseek_sparse_attention");
  c.indexer_types.resize(L);
  for (int i = 0; i < L; ++i) c.indexer_types[i] = (i == 0 || (i - 1) % 4 == 0) ? "full" : "shared";
  read_layer_list(j, "mlp_layer_types", L, {"dense", "sparse"}, c.mlp_layer_types, src);
  read_layer_list(j, "layer_types", L, {}, c.layer_types, src);
  read_layer_list(j, "indexer_types", L, {"full", "shared"}, c.indexer_types, src);
  if (c.indexer_types[0] != "full")
    fail(src, "field 'indexer_types[0]' is 'shared' but there is no earlier 'full' indexer layer to share from");

  RopeRequest rope;
  rope.fixed_dim = c.qk_rope_head_dim;
  rope.max_position_embeddings = c.max_position_embeddings;
  rope.size_limit = HYV4Limits::kSize;
  rope.layer_types = &c.layer_types;
  c.rope = parse_rope(j, rope, c.warnings, src);
  c.attn_scale = std::pow(static_cast<double>(c.qk_head_dim), -0.5) * c.rope.softmax_scale_factor;

  if (const json* v = find(j, "mtp_quant_algo"); v && !v->is_null()) c.mtp_quant_algo = as_string(*v, "mtp_quant_algo", src);
  parse_quant(j, c.quant, HYV4Limits::kSize, src);
  if (c.mtp_quant_algo.empty() && c.quant.present) {
    if (const json* v = find(c.quant.raw, "mtp_quant_algo"); v && !v->is_null())
      c.mtp_quant_algo = as_string(*v, "quantization_config.mtp_quant_algo", src);
  }
  return c;
}

HYV4Config load_hy_v4_config(const std::string& model_dir) {
  const std::string path = config_path(model_dir);
  return parse_hy_v4_config(read_json_file(path), path);
}


}  // namespace nextn
