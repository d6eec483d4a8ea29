#include "models/qwen4_exp/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "models/common/config_json.h"

namespace nextn {

using nlohmann::json;
using namespace cfg;

namespace {

void read_sizes(const json& t, Qwen4ExpConfig& c, const std::string& src) {
  read(t, "vocab_size", c.vocab_size, src);
  read(t, "hidden_size", c.hidden_size, src);
  read(t, "num_hidden_layers", c.num_hidden_layers, src);
  read(t, "num_attention_heads", c.num_attention_heads, src);
  read(t, "num_key_value_heads", c.num_key_value_heads, src);
  if (const json* v = find(t, "head_dim"); v && !v->is_null()) c.head_dim = as_int(*v, "head_dim", src);
  read(t, "hidden_act", c.hidden_act, src);
  if (const json* v = find(t, "output_gate_type"); v && !v->is_null())
    c.output_gate_type = as_string(*v, "output_gate_type", src);
  read(t, "max_position_embeddings", c.max_position_embeddings, src);
  read(t, "rms_norm_eps", c.rms_norm_eps, src);
  read(t, "tie_word_embeddings", c.tie_word_embeddings, src);
  read(t, "attention_bias", c.attention_bias, src);
  read_token_id(t, "pad_token_id", c.pad_token_id, src);
  read_token_id(t, "bos_token_id", c.bos_token_id, src);
  read_eos_ids(t, "eos_token_id", c.eos_token_ids, src);
  read(t, "linear_conv_kernel_dim", c.linear_conv_kernel_dim, src);
  read(t, "linear_key_head_dim", c.linear_key_head_dim, src);
  read(t, "linear_value_head_dim", c.linear_value_head_dim, src);
  read(t, "linear_num_key_heads", c.linear_num_key_heads, src);
  read(t, "linear_num_value_heads", c.linear_num_value_heads, src);
  read(t, "moe_intermediate_size", c.moe_intermediate_size, src);
  read(t, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, src);
  read(t, "num_experts", c.num_experts, src);
  read(t, "num_experts_per_tok", c.num_experts_per_tok, src);
  read(t, "norm_topk_prob", c.norm_topk_prob, src);
  read(t, "hc_count", c.hc_count, src);
  read(t, "hc_lowrank", c.hc_lowrank, src);
  read(t, "ple_conv_kernel_size", c.ple_conv_kernel_size, src);
  read(t, "ngram_size", c.ngram_size, src);
  read(t, "heads_per_ngram", c.heads_per_ngram, src);
  read(t, "ngram_vocab_size_base", c.ngram_vocab_size_base, src);
  read(t, "make_ngram_vocab_size_divisible_by", c.make_ngram_vocab_size_divisible_by, src);
  read(t, "seed", c.seed, src);
  read(t, "split_ngram_parts", c.split_ngram_parts, src);
  if (const json* v = find(t, "ple_embed_dim"); v && !v->is_null()) c.ple_embed_dim = as_int64(*v, "ple_embed_dim", src);
  if (const json* v = find(t, "ple_layer_ids"); v && !v->is_null())
    for (int64_t id : as_int_list(*v, "ple_layer_ids", src)) {
      if (id < 1 || id > Qwen4ExpLimits::kLayers)
        fail(src, "field 'ple_layer_ids' holds " + std::to_string(id) + ": ids are one-indexed decoder layers");
      c.ple_layer_ids.push_back(static_cast<int>(id));
    }
  std::sort(c.ple_layer_ids.begin(), c.ple_layer_ids.end());
  c.ple_layer_ids.erase(std::unique(c.ple_layer_ids.begin(), c.ple_layer_ids.end()), c.ple_layer_ids.end());
  auto optional_int = [&](const char* k, auto& out) {
    if (const json* v = find(t, k); v && !v->is_null()) out = static_cast<std::decay_t<decltype(out)>>(as_int64(*v, k, src));
  };
  optional_int("indexer_n_heads", c.indexer_n_heads);
  optional_int("indexer_kv_heads", c.indexer_kv_heads);
  optional_int("indexer_head_dim", c.indexer_head_dim);
  optional_int("indexer_budget", c.indexer_budget);
  optional_int("indexer_compress_ratio", c.indexer_compress_ratio);
  // vLLM's name (getattr(config, "mtp_num_hidden_layers", 1)); DeepSeek-style checkpoints say num_nextn_predict_layers.
  if (const json* v = find(t, "mtp_num_hidden_layers"); v && !v->is_null())
    c.mtp_num_hidden_layers = as_int(*v, "mtp_num_hidden_layers", src);
  else if (const json* n = find(t, "num_nextn_predict_layers"); n && !n->is_null())
    c.mtp_num_hidden_layers = as_int(*n, "num_nextn_predict_layers", src);
}

void validate_sizes(const Qwen4ExpConfig& c, const std::string& src) {
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                {"hidden_size", c.hidden_size},
                                {"max_position_embeddings", c.max_position_embeddings},
                                {"moe_intermediate_size", c.moe_intermediate_size},
                                {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
                                {"hc_lowrank", c.hc_lowrank}}) {
    require_positive(v, name, src);
    require_at_most(v, Qwen4ExpLimits::kSize, name, src);
  }
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"num_attention_heads", c.num_attention_heads},
                                {"num_key_value_heads", c.num_key_value_heads},
                                {"head_dim", c.head_dim},
                                {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
                                {"linear_key_head_dim", c.linear_key_head_dim},
                                {"linear_value_head_dim", c.linear_value_head_dim},
                                {"linear_num_key_heads", c.linear_num_key_heads},
                                {"linear_num_value_heads", c.linear_num_value_heads},
                                {"num_experts", c.num_experts},
                                {"num_experts_per_tok", c.num_experts_per_tok}}) {
    require_positive(v, name, src);
    require_at_most(v, Qwen4ExpLimits::kHeadCountOrDim, name, src);
  }
  require_positive(c.num_hidden_layers, "num_hidden_layers", src);
  require_at_most(c.num_hidden_layers, Qwen4ExpLimits::kLayers, "num_hidden_layers", src);
  require_at_most(c.mtp_num_hidden_layers, Qwen4ExpLimits::kMtpLayers, "mtp_num_hidden_layers", src);
  if (c.mtp_num_hidden_layers < -1)
    fail(src, "field 'mtp_num_hidden_layers' must be non-negative, got " + std::to_string(c.mtp_num_hidden_layers));
  if (c.hc_count <= 1) fail(src, "field 'hc_count' must be > 1 (Qwen4-Exp), got " + std::to_string(c.hc_count));
  require_at_most(c.hc_count, Qwen4ExpLimits::kCount, "hc_count", src);
  if (c.num_experts_per_tok > c.num_experts)
    fail(src, "field 'num_experts_per_tok' (" + std::to_string(c.num_experts_per_tok) +
                  ") must be in [1, num_experts = " + std::to_string(c.num_experts) + "]");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(src, "field 'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
                  ") must be divisible by 'num_key_value_heads' (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    fail(src, "field 'linear_num_value_heads' (" + std::to_string(c.linear_num_value_heads) +
                  ") must be divisible by 'linear_num_key_heads' (" + std::to_string(c.linear_num_key_heads) + ")");
  if (c.hidden_act != "silu")
    fail(src, "field 'hidden_act' is '" + c.hidden_act + "' (nextn supports: silu)");
  const std::string gate = c.output_gate_type.empty() ? c.hidden_act : c.output_gate_type;
  if (gate != "silu" && gate != "sigmoid")
    fail(src, "field 'output_gate_type' is '" + gate + "' (Qwen4-Exp supports: sigmoid, silu)");
  require_token_ids(c.pad_token_id, c.bos_token_id, c.eos_token_ids, src);
}

void validate_qsa(Qwen4ExpConfig& c, const std::string& src) {
  const std::pair<const char*, int64_t> fields[] = {{"indexer_n_heads", c.indexer_n_heads},
                                                    {"indexer_kv_heads", c.indexer_kv_heads},
                                                    {"indexer_head_dim", c.indexer_head_dim},
                                                    {"indexer_budget", c.indexer_budget},
                                                    {"indexer_compress_ratio", c.indexer_compress_ratio}};
  std::string missing;
  bool any = false;
  for (const auto& [name, v] : fields) {
    if (v == 0) missing += std::string(missing.empty() ? "" : ", ") + name;
    else any = true;
  }
  const bool attention = std::count(c.kinds.begin(), c.kinds.end(), Qwen4LayerKind::SparseAttention) > 0;
  if (!any && !attention && c.mtp_num_hidden_layers <= 0) return;  // all-linear model: no QSA needed
  // transformers builds a QSA indexer on every attention layer (and the MTP layers are attention layers).
  if (!missing.empty()) fail(src, "QSA config is missing required fields: " + missing);
  for (const auto& [name, v] : fields) {
    require_positive(v, name, src);
    require_at_most(v, Qwen4ExpLimits::kSize, name, src);
  }
  require_at_most(c.indexer_n_heads, Qwen4ExpLimits::kHeadCountOrDim, "indexer_n_heads", src);
  require_at_most(c.indexer_head_dim, Qwen4ExpLimits::kHeadCountOrDim, "indexer_head_dim", src);
  if (c.indexer_kv_heads != 1) fail(src, "field 'indexer_kv_heads' must be 1 (Qwen4-Exp QSA has one key head)");
  if (c.indexer_budget % c.indexer_compress_ratio != 0)
    fail(src, "field 'indexer_budget' (" + std::to_string(c.indexer_budget) +
                  ") must be divisible by 'indexer_compress_ratio' (" + std::to_string(c.indexer_compress_ratio) + ")");
  if (c.rope.dim > c.indexer_head_dim)
    fail(src, "RoPE rotates " + std::to_string(c.rope.dim) + " dims, more than 'indexer_head_dim' (" +
                  std::to_string(c.indexer_head_dim) + ")");
}

void validate_ple(Qwen4ExpConfig& c, const std::string& src) {
  if (c.ple_embed_dim == 0) c.ple_embed_dim = c.hidden_size;
  if (c.ple_layer_ids.empty()) return;
  if (c.ngram_size < 2) fail(src, "field 'ngram_size' must be at least 2, got " + std::to_string(c.ngram_size));
  require_at_most(c.ngram_size, Qwen4ExpLimits::kNgram, "ngram_size", src);
  require_positive(c.heads_per_ngram, "heads_per_ngram", src);
  require_at_most(c.heads_per_ngram, Qwen4ExpLimits::kCount, "heads_per_ngram", src);
  require_positive(c.ple_embed_dim, "ple_embed_dim", src);
  require_at_most(c.ple_embed_dim, Qwen4ExpLimits::kSize, "ple_embed_dim", src);
  require_positive(c.ple_conv_kernel_size, "ple_conv_kernel_size", src);
  require_at_most(c.ple_conv_kernel_size, Qwen4ExpLimits::kCount, "ple_conv_kernel_size", src);
  require_positive(c.ngram_vocab_size_base, "ngram_vocab_size_base", src);
  require_at_most(c.ngram_vocab_size_base, int64_t(1) << 40, "ngram_vocab_size_base", src);
  require_positive(c.make_ngram_vocab_size_divisible_by, "make_ngram_vocab_size_divisible_by", src);
  require_at_most(c.make_ngram_vocab_size_divisible_by, Qwen4ExpLimits::kSize, "make_ngram_vocab_size_divisible_by",
                  src);
  require_positive(c.split_ngram_parts, "split_ngram_parts", src);
  require_at_most(c.split_ngram_parts, Qwen4ExpLimits::kCount, "split_ngram_parts", src);
  if (c.ple_embed_dim % c.ngram_heads() != 0)
    fail(src, "field 'ple_embed_dim' (" + std::to_string(c.ple_embed_dim) +
                  ") must be divisible by the number of n-gram heads (ngram_size - 1) * heads_per_ngram = " +
                  std::to_string(c.ngram_heads()));
  for (int id : c.ple_layer_ids) {
    if (id > c.num_hidden_layers)
      fail(src, "field 'ple_layer_ids' holds " + std::to_string(id) + ", past num_hidden_layers = " +
                    std::to_string(c.num_hidden_layers) + " (ids are one-indexed)");
    if (c.kinds[id - 1] != Qwen4LayerKind::Linear)
      fail(src, "field 'ple_layer_ids' holds " + std::to_string(id) +
                    ": Qwen4-Exp PLE is only supported on linear_attention layers");
  }
  if (c.eos_token_ids.empty()) fail(src, "field 'eos_token_id' must be set when PLE layers are enabled");
  // The n-gram hash multiplies token ids (eos included) by multipliers below int64 max / vocab_size.
  if (c.eos_token_ids[0] >= c.vocab_size)
    fail(src, "field 'eos_token_id' (" + std::to_string(c.eos_token_ids[0]) + ") is not below vocab_size (" +
                  std::to_string(c.vocab_size) + "): PLE hashes it as a token");
}

void read_layer_types(const json& t, Qwen4ExpConfig& c, const std::string& src) {
  const int L = c.num_hidden_layers;
  int interval = 4;
  if (const json* v = find(t, "full_attention_interval"); v && !v->is_null()) {
    interval = as_int(*v, "full_attention_interval", src);
    require_positive(interval, "full_attention_interval", src);
  }
  c.layer_types.resize(L);
  for (int i = 0; i < L; ++i) c.layer_types[i] = (i + 1) % interval ? "linear_attention" : "qwen_sparse_attention";
  read_layer_list(t, "layer_types", L, {"linear_attention", "qwen_sparse_attention", "full_attention"}, c.layer_types,
                  src);
  c.kinds.resize(L);
  for (int i = 0; i < L; ++i) {
    // Published checkpoints say "full_attention" for the layers that run a QSA indexer.
    if (c.layer_types[i] == "full_attention") c.layer_types[i] = "qwen_sparse_attention";
    c.kinds[i] = c.layer_types[i] == "linear_attention" ? Qwen4LayerKind::Linear : Qwen4LayerKind::SparseAttention;
  }
}

}  // namespace

int Qwen4ExpConfig::ple_index(int layer) const {
  auto it = std::find(ple_layer_ids.begin(), ple_layer_ids.end(), layer + 1);
  return it == ple_layer_ids.end() ? -1 : static_cast<int>(it - ple_layer_ids.begin());
}

Qwen4ExpConfig parse_qwen4_exp_config(const json& j, const std::string& src_in) {
  if (!j.is_object()) fail(src_in, "config must be a JSON object, got " + std::string(j.type_name()));
  const json* mt = find(j, "model_type");
  const std::string type = mt && mt->is_string() ? mt->get<std::string>() : "";
  if (type != "qwen4_exp" && type != "qwen4_exp_text")
    fail(src_in, "unsupported model_type " + (mt ? mt->dump() : std::string("(missing)")) +
                     " (this family reads qwen4_exp, qwen4_exp_text)");
  Qwen4ExpConfig c;
  c.composite = type == "qwen4_exp";
  const json* text = &j;
  std::string src = src_in;
  if (c.composite) {
    text = find(j, "text_config");
    if (!text || !text->is_object())
      fail(src_in, "field 'text_config' must be an object (the composite qwen4_exp config holds the text model there)");
    src = src_in + " (text_config)";
    // The composite model's own flag ties its lm_head (Qwen4ExpForConditionalGeneration); the text config's
    // applies when the composite does not say.
  }
  read_sizes(*text, c, src);
  if (c.composite) read(j, "tie_word_embeddings", c.tie_word_embeddings, src_in);
  validate_sizes(c, src);
  read_layer_types(*text, c, src);

  RopeRequest rope;
  rope.head_dim = c.head_dim;
  rope.max_position_embeddings = c.max_position_embeddings;
  rope.size_limit = Qwen4ExpLimits::kSize;
  c.rope = parse_rope(*text, rope, c.warnings, src);
  c.attn_scale = std::pow(static_cast<double>(c.head_dim), -0.5);
  require_range(c.rms_norm_eps, 0.0, true, 1.0, "rms_norm_eps", src, "the epsilon of every RMSNorm");

  validate_qsa(c, src);
  validate_ple(c, src);

  // quantization_config and dtype: the composite's own, else the text config's.
  for (const json* o : {&j, text}) {
    if (!c.quant.present) parse_quant(*o, c.quant, Qwen4ExpLimits::kSize, o == &j ? src_in : src);
    if (c.torch_dtype.empty()) {
      if (const json* v = find(*o, "dtype"); v && !v->is_null()) c.torch_dtype = as_string(*v, "dtype", src);
      else if (const json* d = find(*o, "torch_dtype"); d && !d->is_null())
        c.torch_dtype = as_string(*d, "torch_dtype", src);
    }
  }
  return c;
}

Qwen4ExpConfig load_qwen4_exp_config(const std::string& model_dir) {
  const std::string path = config_path(model_dir);
  return parse_qwen4_exp_config(read_json_file(path), path);
}

}  // namespace nextn
