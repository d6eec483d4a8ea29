// HY V4 (Tencent HunYuan, model_type "hy_v4") model configuration: parsing config.json into a
// typed struct with the same defaults, derived fields and RoPE tables as the transformers
// reference, plus validation that reports the offending file and field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/quant_plan.h"  // QuantConfig
#include "models/common/rope_config.h"

namespace nextn {

struct HYV4Config {
  int64_t vocab_size = 120832;
  int64_t hidden_size = 2816;
  int64_t intermediate_size = 6912;
  int64_t moe_intermediate_size = 768;
  int num_hidden_layers = 34;
  int num_attention_heads = 32;
  int num_key_value_heads = 32;  // forced = num_attention_heads
  int head_dim = 64;             // forced = qk_rope_head_dim
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 262144;
  double rms_norm_eps = 1e-5;
  int64_t pad_token_id = 120002;  // explicit null -> -1
  int64_t bos_token_id = 120000;  // explicit null -> -1
  std::vector<int64_t> eos_token_ids = {120025};  // int or list; explicit null -> empty
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  int n_routed_experts = 256;  // alias: num_local_experts
  int n_shared_experts = 1;
  int num_experts_per_tok = 8;
  double routed_scaling_factor = 2.827;
  bool norm_topk_prob = true;
  int n_group = 1;
  int topk_group = 1;
  int64_t q_lora_rank = 1536;  // -1: no q LoRA (plain q_proj)
  int64_t kv_lora_rank = 512;
  int qk_nope_head_dim = 192;
  int qk_rope_head_dim = 64;
  int v_head_dim = 256;
  std::vector<std::string> mlp_layer_types;  // "dense" | "sparse"
  std::vector<std::string> layer_types;      // default "deepseek_sparse_attention"
  int64_t index_topk = 2048;
  int index_head_dim = 128;
  int index_n_heads = 16;
  std::vector<std::string> indexer_types;  // "full" | "shared"
  int hc_mult = 4;
  double hc_magnitude = 2.0;
  double hc_eps = 1e-6;
  double learnable_sink_init = 0.0;
  double swiglu_limit = 10.0;

  // Derived / extra.
  int qk_head_dim = 256;  // qk_nope_head_dim + qk_rope_head_dim
  RopeConfig rope;
  double attn_scale = 0.0;  // qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 for yarn
  int num_nextn_predict_layers = 0;
  std::string mtp_quant_algo;  // empty if absent
  QuantConfig quant;
  std::string torch_dtype;  // from "dtype" (preferred) or "torch_dtype"; empty if absent
  // Size fields config.json does not set, so that transformers' defaults apply: a load error over a tensor
  // shape names the defaulted field it contradicts.
  std::vector<std::string> defaulted;
  // Accepted values that change what the model computes in a way worth a line on stderr (e.g. a negative
  // swiglu_limit turns the clamp off); the loader reports them with its own warnings.
  std::vector<std::string> warnings;

  bool is_sparse_mlp(int layer) const;    // mlp_layer_types[layer] == "sparse"
  bool has_own_indexer(int layer) const;  // indexer_types[layer] == "full"
  bool swiglu_clamped() const { return swiglu_limit > 0; }
  bool is_defaulted(const std::string& field) const;
};

// Largest sizes nextn accepts from a config, before any tensor is seen: they keep every product of two sizes
// within int64 and what the config itself allocates (per-layer lists, RoPE tables) small. Each size is then
// checked against the checkpoint's tensors, which bound what loading and the forward allocate.
struct HYV4Limits {
  static constexpr int64_t kSize = 2147483647;       // vocab, hidden, intermediate, LoRA ranks, positions, top-k
  static constexpr int64_t kHeadCountOrDim = 65536;  // heads, head dims
  static constexpr int64_t kLayers = 1024;           // num_hidden_layers
  static constexpr int64_t kMtpLayers = 64;          // num_nextn_predict_layers
  static constexpr int64_t kCount = 1024;            // n_routed_experts (router buffers), n_shared_experts, hc_mult
  static constexpr int64_t kExpertGroups = 256;      // n_group (router buffers)
};

// Parses an already-loaded config.json; `source` (normally the file path) prefixes every error.
HYV4Config parse_hy_v4_config(const nlohmann::json& j, const std::string& source);
// Reads and parses model_dir/config.json.
HYV4Config load_hy_v4_config(const std::string& model_dir);

}  // namespace nextn
