// Qwen4-Exp (model_type "qwen4_exp_text", or the composite "qwen4_exp" whose `text_config` holds the text
// model): config.json parsed into a typed struct with transformers 5.17's defaults and derived values, and
// every check its Qwen4ExpTextConfig makes, reported with the file and field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/quant_plan.h"
#include "models/common/rope_config.h"

namespace nextn {

enum class Qwen4LayerKind { Linear, SparseAttention };  // Gated DeltaNet, QSA attention

struct Qwen4ExpConfig {
  int64_t vocab_size = 248320;
  int64_t hidden_size = 2048;
  int num_hidden_layers = 40;
  int num_attention_heads = 16;
  int num_key_value_heads = 2;
  int head_dim = 256;
  std::string hidden_act = "silu";
  std::string output_gate_type;  // GDN gated norm activation: "sigmoid" or "silu" (empty: hidden_act)
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  int64_t pad_token_id = -1, bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // Gated DeltaNet
  int linear_conv_kernel_dim = 4;
  int linear_key_head_dim = 128, linear_value_head_dim = 128;
  int linear_num_key_heads = 16, linear_num_value_heads = 32;
  // MoE
  int64_t moe_intermediate_size = 512, shared_expert_intermediate_size = 512;
  int num_experts = 512, num_experts_per_tok = 10;
  bool norm_topk_prob = true;
  // hyper-connections
  int hc_count = 4;
  int64_t hc_lowrank = 320;
  // PLE hashed n-gram embeddings
  std::vector<int> ple_layer_ids;  // 1-indexed, sorted, unique
  int64_t ple_embed_dim = 0;       // 0 in the file: hidden_size
  int ple_conv_kernel_size = 4;
  int ngram_size = 3, heads_per_ngram = 8;
  int64_t ngram_vocab_size_base = 20000000, make_ngram_vocab_size_divisible_by = 128;
  int64_t seed = 1234;
  int64_t split_ngram_parts = 512;
  // QSA indexer (all set or none)
  int indexer_n_heads = 0, indexer_kv_heads = 0, indexer_head_dim = 0;
  int64_t indexer_budget = 0, indexer_compress_ratio = 0;
  std::vector<std::string> layer_types;  // "linear_attention" | "qwen_sparse_attention" (after renaming)
  int mtp_num_hidden_layers = -1;        // -1: config.json does not say (the loader counts mtp.layers.*)

  // Derived.
  std::vector<Qwen4LayerKind> kinds;
  RopeConfig rope;        // rope.dim = int(head_dim * partial_rotary_factor)
  double attn_scale = 0;  // head_dim^-0.5
  QuantConfig quant;
  std::string torch_dtype;
  bool composite = false;           // config.json is the composite qwen4_exp (text under text_config)
  std::vector<std::string> warnings;

  int64_t hc_width() const { return int64_t(hc_count) * hidden_size; }
  int64_t linear_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t linear_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int ngram_heads() const { return (ngram_size - 1) * heads_per_ngram; }
  int64_t ple_head_dim() const { return ple_embed_dim / ngram_heads(); }
  int64_t ple_conv_state_rows() const { return int64_t(ple_conv_kernel_size - 1) * ngram_size; }  // dilation = n
  int64_t block_topk() const { return indexer_budget / indexer_compress_ratio; }
  bool has_qsa() const { return indexer_n_heads > 0; }
  // The PLE index (0-based, among ple_layer_ids) of decoder layer `layer` (0-based), or -1.
  int ple_index(int layer) const;
  int64_t eos_id() const { return eos_token_ids.empty() ? -1 : eos_token_ids[0]; }
};

struct Qwen4ExpLimits {
  static constexpr int64_t kSize = 2147483647;
  static constexpr int64_t kHeadCountOrDim = 65536;
  static constexpr int64_t kLayers = 1024;
  static constexpr int64_t kMtpLayers = 64;
  static constexpr int64_t kCount = 65536;  // experts, hc_count, ngram heads, conv kernels
  static constexpr int64_t kNgram = 64;      // ngram_size (the forward keeps one n-gram window on the stack)
};

// Parses config.json (text or composite); `source` prefixes every error.
Qwen4ExpConfig parse_qwen4_exp_config(const nlohmann::json& j, const std::string& source);
Qwen4ExpConfig load_qwen4_exp_config(const std::string& model_dir);

}  // namespace nextn
