// Fuzzes config.json -> Qwen4ExpConfig (load_qwen4_exp_config): the input is the file (text or composite).
//
// Bad input must be a nextn::Error (any other exception escapes and fails the run; so does an allocation
// beyond libFuzzer's -malloc_limit_mb). An accepted config must be one the model can be built from: one layer
// kind per layer, PLE only on linear layers with an eos id, QSA sizes consistent, finite RoPE tables.
#include <cmath>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "models/qwen4_exp/config.h"

namespace {

void check_config(const nextn::Qwen4ExpConfig& c) {
  NEXTN_FUZZ_CHECK(c.num_hidden_layers > 0);
  NEXTN_FUZZ_CHECK(c.kinds.size() == static_cast<size_t>(c.num_hidden_layers));
  NEXTN_FUZZ_CHECK(c.layer_types.size() == c.kinds.size());
  NEXTN_FUZZ_CHECK(c.hc_count > 1);
  NEXTN_FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  NEXTN_FUZZ_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0);
  NEXTN_FUZZ_CHECK(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts);
  for (int id : c.ple_layer_ids) {
    NEXTN_FUZZ_CHECK(id >= 1 && id <= c.num_hidden_layers);
    NEXTN_FUZZ_CHECK(c.kinds[id - 1] == nextn::Qwen4LayerKind::Linear);
    NEXTN_FUZZ_CHECK(!c.eos_token_ids.empty());
    NEXTN_FUZZ_CHECK(c.ple_embed_dim % c.ngram_heads() == 0);
  }
  if (c.has_qsa()) {
    NEXTN_FUZZ_CHECK(c.indexer_kv_heads == 1);
    NEXTN_FUZZ_CHECK(c.indexer_budget % c.indexer_compress_ratio == 0);
    NEXTN_FUZZ_CHECK(c.rope.dim <= c.indexer_head_dim);
  }
  NEXTN_FUZZ_CHECK(c.rope.dim >= 2 && c.rope.dim % 2 == 0 && c.rope.dim <= c.head_dim);
  NEXTN_FUZZ_CHECK(c.rope.inv_freq.size() == static_cast<size_t>(c.rope.dim / 2));
  for (float f : c.rope.inv_freq) NEXTN_FUZZ_CHECK(std::isfinite(f));
  NEXTN_FUZZ_CHECK(std::isfinite(c.attn_scale) && c.attn_scale > 0);
  NEXTN_FUZZ_CHECK(c.rms_norm_eps > 0 && c.rms_norm_eps <= 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nextn::fuzz::ScratchDir dir;
  dir.write("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    check_config(nextn::load_qwen4_exp_config(dir.path()));
  } catch (const nextn::Error&) {
  }
  return 0;
}
