// Fuzzes config.json -> HYV4Config (load_hy_v4_config, read_model_type): the input is the file.
//
// Bad input must be a nextn::Error (any other exception escapes and fails the run; so does an allocation
// beyond libFuzzer's -malloc_limit_mb). An accepted config must be one the model can be built from: the
// derived fields follow their definitions, the per-layer lists have one valid entry per layer, and every
// floating-point field, the RoPE table and the attention scale are finite.
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "models/common/config_json.h"
#include "models/hy_v4/config.h"

namespace {

bool one_of(const std::string& s, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (s == a) return true;
  return false;
}

void check_layers(const nextn::HYV4Config& c) {
  const auto layers = static_cast<size_t>(c.num_hidden_layers);
  NEXTN_FUZZ_CHECK(c.mlp_layer_types.size() == layers);
  NEXTN_FUZZ_CHECK(c.layer_types.size() == layers);
  NEXTN_FUZZ_CHECK(c.indexer_types.size() == layers);
  NEXTN_FUZZ_CHECK(c.indexer_types.at(0) == "full");
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    NEXTN_FUZZ_CHECK(one_of(c.mlp_layer_types[layer], {"dense", "sparse"}));
    NEXTN_FUZZ_CHECK(one_of(c.indexer_types[layer], {"full", "shared"}));
    NEXTN_FUZZ_CHECK(c.is_sparse_mlp(layer) == (c.mlp_layer_types[layer] == "sparse"));
    NEXTN_FUZZ_CHECK(c.has_own_indexer(layer) == (c.indexer_types[layer] == "full"));
  }
  for (int outside : {-1, c.num_hidden_layers}) {
    bool threw = false;
    try {
      c.is_sparse_mlp(outside);
    } catch (const nextn::Error&) {
      threw = true;
    }
    NEXTN_FUZZ_CHECK(threw);
  }
}

void check_config(const nextn::HYV4Config& c) {
  NEXTN_FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0);
  NEXTN_FUZZ_CHECK(c.num_key_value_heads == c.num_attention_heads);
  NEXTN_FUZZ_CHECK(c.head_dim == c.qk_rope_head_dim);
  NEXTN_FUZZ_CHECK(c.qk_head_dim == int64_t{c.qk_nope_head_dim} + c.qk_rope_head_dim);
  NEXTN_FUZZ_CHECK(c.num_experts_per_tok <= c.n_routed_experts && c.topk_group <= c.n_group);
  NEXTN_FUZZ_CHECK(c.n_routed_experts % c.n_group == 0);
  NEXTN_FUZZ_CHECK(c.num_nextn_predict_layers >= 0);
  check_layers(c);

  const nextn::RopeConfig& r = c.rope;
  NEXTN_FUZZ_CHECK(r.type == "default" || r.type == "yarn");
  NEXTN_FUZZ_CHECK(r.dim == c.qk_rope_head_dim && r.dim % 2 == 0);
  NEXTN_FUZZ_CHECK(r.inv_freq.size() == static_cast<size_t>(r.dim / 2));
  for (float f : r.inv_freq) NEXTN_FUZZ_CHECK(std::isfinite(f));
  for (double v : {r.theta, r.factor, r.attention_factor, r.beta_fast, r.beta_slow, r.mscale, r.mscale_all_dim})
    NEXTN_FUZZ_CHECK(std::isfinite(v));
  NEXTN_FUZZ_CHECK(std::isfinite(c.attn_scale) && c.attn_scale > 0);
  for (double v : {c.rms_norm_eps, c.routed_scaling_factor, c.hc_magnitude, c.hc_eps, c.learnable_sink_init,
                   c.swiglu_limit})
    NEXTN_FUZZ_CHECK(std::isfinite(v));
  NEXTN_FUZZ_CHECK(c.rms_norm_eps >= 0 && c.hc_eps >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nextn::fuzz::ScratchDir dir;
  dir.write("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    check_config(nextn::load_hy_v4_config(dir.path()));
  } catch (const nextn::Error&) {
  }
  try {
    (void)nextn::cfg::read_model_type(dir.path());  // any string is a valid answer; only Error may escape
  } catch (const nextn::Error&) {
  }
  return 0;
}
