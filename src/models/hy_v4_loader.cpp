// Loading HY V4 checkpoints: hub / internal / vLLM tensor names, layouts and quantization, mapped onto
// HYV4Weights without copying any large tensor.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "models/hy_v4.h"

namespace nextn {

// ---------------------------------------------------------------------------------------------------
// Checkpoint names

std::string hy_v4_canonical_name(const std::string& checkpoint_name) {
  // The renames transformers applies when loading hy_v4 (conversion_mapping.py), in its order.
  static const std::pair<const char*, const char*> kRenames[] = {
      {".hc_pre.hc_", ".hc_"},
      {".linear_gate", ".gate_proj"},
      {".hc_attn_layer.hc_fn", ".attn_hc.fn"},
      {".hc_attn_layer.hc_base", ".attn_hc.base"},
      {".hc_attn_layer.hc_scale", ".attn_hc.scale"},
      {".hc_mlp_layer.hc_fn", ".ffn_hc.fn"},
      {".hc_mlp_layer.hc_base", ".ffn_hc.base"},
      {".hc_mlp_layer.hc_scale", ".ffn_hc.scale"},
      {".hc_head_fn", ".hc_fn"},
      {".hc_head_base", ".hc_base"},
      {".hc_head_scale", ".hc_scale"},
  };
  std::string n = checkpoint_name;
  // `\.learnable_sink_param$` -> `.sinks` (anchored at the end)
  static const std::string kSink = ".learnable_sink_param";
  if (n.size() >= kSink.size() && n.compare(n.size() - kSink.size(), kSink.size(), kSink) == 0)
    n = n.substr(0, n.size() - kSink.size()) + ".sinks";
  for (const auto& [from, to] : kRenames) {
    std::string f(from), t(to);
    for (size_t p = n.find(f); p != std::string::npos; p = n.find(f, p + t.size())) n.replace(p, f.size(), t);
  }
  return n;
}

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8_E4M3;
}

// Resolves the tensors the model needs by canonical name, checking shapes and collecting every problem
// so that one load error lists all missing tensors at once.
class Binder {
 public:
  Binder(const WeightStore& store, int num_target_layers) : store_(store) {
    for (const std::string& raw : store.names()) {
      std::string canon = hy_v4_canonical_name(raw);
      auto [it, fresh] = canon_.emplace(canon, raw);
      if (!fresh)
        errors_.push_back("tensors '" + it->second + "' and '" + raw + "' both map to '" + canon + "'");
    }
    (void)num_target_layers;
  }

  const TensorView* find(const std::string& name) {
    auto it = canon_.find(name);
    if (it == canon_.end()) return nullptr;
    used_.insert(it->first);
    return store_.find(it->second);
  }

  const TensorView* require(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* t = find(name);
    if (!t) {
      missing_.push_back(name);
      return nullptr;
    }
    if (t->shape != shape) {
      errors_.push_back("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": expected shape " +
                        shape_string(shape) + ", found " + shape_string(t->shape));
      return nullptr;
    }
    if (!is_float_dtype(t->dtype)) {
      errors_.push_back("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": unsupported dtype " +
                        dtype_name(t->dtype));
      return nullptr;
    }
    return t;
  }

  std::vector<float> vec(const std::string& name, int64_t n) {
    const TensorView* t = require(name, {n});
    std::vector<float> out(n, 0.0f);
    if (t) convert_to_f32(t->dtype, t->data, out.data(), n);
    return out;
  }

  Linear linear_from(const TensorView* t, const std::string& weight_name) {
    Linear l;
    if (!t) return l;
    l.dtype = t->dtype;
    l.out = t->shape[0];
    l.in = t->shape[1];
    l.row_stride = l.in;
    l.data = t->data;
    if (t->dtype == DType::F8_E4M3) attach_fp8_scale(l, weight_name, t);
    return l;
  }

  // `prefix`.weight of shape [out, in] (+ optional FP8 block scale, + bias when asked).
  Linear linear(const std::string& prefix, int64_t out, int64_t in, std::vector<float>* bias = nullptr) {
    const TensorView* t = require(prefix + ".weight", {out, in});
    Linear l = linear_from(t, prefix + ".weight");
    if (bias) {
      *bias = vec(prefix + ".bias", out);
      l.bias = bias->data();
    }
    return l;
  }

  void attach_fp8_scale(Linear& l, const std::string& weight_name, const TensorView* t) {
    const TensorView* s = nullptr;
    for (const char* suffix : {"_scale_inv", "_scale"}) {
      if ((s = find(weight_name + suffix))) break;
    }
    if (!s) {
      errors_.push_back("FP8 tensor '" + t->name + "' has no block scale ('" + weight_name + "_scale_inv')");
      return;
    }
    int64_t rows_blocks = s->shape.size() == 2 ? s->shape[0] : 0, col_blocks = s->shape.size() == 2 ? s->shape[1] : 0;
    if (rows_blocks <= 0 || col_blocks <= 0) {
      errors_.push_back("scale tensor '" + s->name + "' must be 2-D, found " + shape_string(s->shape));
      return;
    }
    l.scale = s->data;
    l.scale_dtype = s->dtype == DType::U8 ? DType::F8_E8M0 : s->dtype;
    l.block_out = (l.out + rows_blocks - 1) / rows_blocks;
    l.block_in = (l.in + col_blocks - 1) / col_blocks;
    l.scale_cols = col_blocks;
  }

  void note_missing(const std::string& name) { missing_.push_back(name); }
  void note_error(const std::string& e) { errors_.push_back(e); }

  // Throws if anything went wrong; warns about checkpoint tensors nothing used.
  void finish(const std::string& dir, const std::function<bool(const std::string&)>& reserved) {
    std::string msg;
    if (!missing_.empty()) {
      msg += "checkpoint " + dir + " lacks " + std::to_string(missing_.size()) + " tensor(s) the model needs:";
      for (size_t i = 0; i < missing_.size() && i < 40; ++i) msg += "\n  " + missing_[i];
      if (missing_.size() > 40) msg += "\n  ... (" + std::to_string(missing_.size() - 40) + " more)";
    }
    for (const auto& e : errors_) msg += (msg.empty() ? "" : "\n") + e;
    if (!msg.empty()) throw Error(msg);
    for (const auto& [canon, raw] : canon_)
      if (!used_.count(canon) && !reserved(canon))
        std::fprintf(stderr, "nextn: warning: unused checkpoint tensor '%s'\n", raw.c_str());
  }

 private:
  const WeightStore& store_;
  std::map<std::string, std::string> canon_;  // canonical -> checkpoint name
  std::set<std::string> used_;
  std::vector<std::string> missing_, errors_;
};

// A [E, rows, cols] expert tensor sliced into E Linear views (no copy).
std::vector<Linear> expert_slices(Binder& b, const TensorView* t, const std::string& name, int64_t rows_begin,
                                  int64_t rows) {
  std::vector<Linear> out;
  if (!t) return out;
  int64_t E = t->shape[0], R = t->shape[1], C = t->shape[2];
  size_t es = dtype_size(t->dtype);
  for (int64_t e = 0; e < E; ++e) {
    Linear l;
    l.dtype = t->dtype;
    l.out = rows;
    l.in = C;
    l.row_stride = C;
    l.data = static_cast<const uint8_t*>(t->data) + (e * R + rows_begin) * C * es;
    out.push_back(l);
  }
  if (t->dtype == DType::F8_E4M3)
    b.note_error("FP8 fused expert tensor '" + name + "' is not supported yet (issue P3)");
  return out;
}

void load_ffn(Binder& b, const HYV4Config& c, const std::string& p, bool sparse, FfnWeights& f) {
  const int64_t H = c.hidden_size;
  f.sparse = sparse;
  if (!sparse) {
    f.gate_proj = b.linear(p + "gate_proj", c.intermediate_size, H);
    f.up_proj = b.linear(p + "up_proj", c.intermediate_size, H);
    f.down_proj = b.linear(p + "down_proj", H, c.intermediate_size);
    return;
  }
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
  f.router = b.linear(p + "gate", E, H);
  f.e_bias = b.vec(p + "gate.e_score_correction_bias", E);
  if (c.n_shared_experts > 0) {
    const int64_t Is = I * c.n_shared_experts;
    f.has_shared = true;
    f.gate_proj = b.linear(p + "shared_experts.gate_proj", Is, H);
    f.up_proj = b.linear(p + "shared_experts.up_proj", Is, H);
    f.down_proj = b.linear(p + "shared_experts.down_proj", H, Is);
  }
  // Fused layout (transformers): experts.gate_up_proj [E, 2I, H] (gate rows first), experts.down_proj [E, H, I].
  const TensorView* gu = b.require(p + "experts.gate_up_proj", {E, 2 * I, H});
  const TensorView* dn = b.require(p + "experts.down_proj", {E, H, I});
  f.expert_gate_up = expert_slices(b, gu, p + "experts.gate_up_proj", 0, 2 * I);
  f.expert_down = expert_slices(b, dn, p + "experts.down_proj", 0, H);
}

void load_attention(Binder& b, const HYV4Config& c, const std::string& p, bool own_indexer,
                    AttentionWeights& a) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  std::vector<float>* qa_bias = c.attention_bias ? &a.q_a_bias : nullptr;
  std::vector<float>* kva_bias = c.attention_bias ? &a.kv_a_bias : nullptr;
  std::vector<float>* o_bias = c.attention_bias ? &a.o_bias : nullptr;
  a.q_a_proj = b.linear(p + "q_a_proj", c.q_lora_rank, H, qa_bias);
  a.q_a_norm = b.vec(p + "q_a_layernorm.weight", c.q_lora_rank);
  a.q_b_proj = b.linear(p + "q_b_proj", nh * c.qk_head_dim, c.q_lora_rank);
  a.kv_a_proj = b.linear(p + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, H, kva_bias);
  a.kv_a_norm = b.vec(p + "kv_a_layernorm.weight", c.kv_lora_rank);
  a.kv_b_proj = b.linear(p + "kv_b_proj", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  a.o_proj = b.linear(p + "o_proj", H, nh * c.v_head_dim, o_bias);
  a.gate_proj = b.linear(p + "gate_proj", nh * c.v_head_dim, H);
  a.sinks = b.vec(p + "sinks", nh);
  a.has_indexer = own_indexer;
  if (own_indexer) {
    const std::string ip = p + "indexer.";
    a.indexer.wq_b = b.linear(ip + "wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank);
    a.indexer.wk = b.linear(ip + "wk", c.index_head_dim, H);
    a.indexer.k_norm_w = b.vec(ip + "k_norm.weight", c.index_head_dim);
    a.indexer.k_norm_b = b.vec(ip + "k_norm.bias", c.index_head_dim);
    a.indexer.weights_proj = b.linear(ip + "weights_proj", c.index_n_heads, H);
  }
}


}  // namespace

// ---------------------------------------------------------------------------------------------------
// Loading

HYV4Model::HYV4Model(const std::string& model_dir, ThreadPool* pool)
    : dir_(model_dir), cfg_(load_hy_v4_config(model_dir)), store_(WeightStore::open_dir(model_dir)), pool_(pool) {
  const HYV4Config& c = cfg_;
  if (c.q_lora_rank <= 0)
    throw Error(model_dir + "/config.json: q_lora_rank must be set (HY V4 attention always uses the q LoRA path)");
  if (c.hidden_act != "silu")
    throw Error(model_dir + "/config.json: hidden_act '" + c.hidden_act + "' is not supported (only silu)");
  if (c.qk_rope_head_dim > c.index_head_dim)
    throw Error(model_dir + "/config.json: qk_rope_head_dim exceeds index_head_dim");
  const int64_t H = c.hidden_size, V = c.vocab_size, C = c.hc_mult;
  Binder b(store_, c.num_hidden_layers);

  // Bare HC tensors are named "<prefix>.fn", not "<prefix>.fn.weight": bind them by full name.
  auto bare_linear = [&](const std::string& name, int64_t out, int64_t in) {
    return b.linear_from(b.require(name, {out, in}), name);
  };

  w_.embed = bare_linear("model.embed_tokens.weight", V, H);
  w_.layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    DecoderLayerWeights& L = w_.layers[i];
    L.attn_hc.fn = bare_linear(p + "attn_hc.fn", 2 * C, C * H);
    L.attn_hc.base = b.vec(p + "attn_hc.base", 2 * C);
    L.attn_hc.scale = b.vec(p + "attn_hc.scale", 2);
    L.ffn_hc.fn = bare_linear(p + "ffn_hc.fn", 2 * C, C * H);
    L.ffn_hc.base = b.vec(p + "ffn_hc.base", 2 * C);
    L.ffn_hc.scale = b.vec(p + "ffn_hc.scale", 2);
    L.input_norm = b.vec(p + "input_layernorm.weight", H);
    L.post_attn_norm = b.vec(p + "post_attention_layernorm.weight", H);
    load_attention(b, c, p + "self_attn.", c.has_own_indexer(i), L.attn);
    load_ffn(b, c, p + "mlp.", c.is_sparse_mlp(i), L.ffn);
  }
  w_.hc_head_fn = bare_linear("model.hc_head.hc_fn", C, C * H);
  w_.hc_head_base = b.vec("model.hc_head.hc_base", C);
  w_.hc_head_scale = b.vec("model.hc_head.hc_scale", 1);
  w_.final_norm = b.vec("model.norm.weight", H);
  if (c.tie_word_embeddings) {
    w_.lm_head = w_.embed;
  } else {
    w_.lm_head = bare_linear("lm_head.weight", V, H);
  }

  // MTP draft layers: model.mtp_layers.N.* (hub) or model.layers.{L+N}.* (vLLM's flattened form).
  const int L = c.num_hidden_layers;
  const int n_mtp = std::max(c.num_nextn_predict_layers, 0);
  auto mtp_prefix = [&](int i) {
    std::string a = "model.mtp_layers." + std::to_string(i) + ".";
    std::string f = "model.layers." + std::to_string(L + i) + ".";
    return b.find(a + "eh_proj.weight") || !b.find(f + "eh_proj.weight") ? a : f;
  };
  w_.mtp.resize(n_mtp);
  for (int i = 0; i < n_mtp; ++i) {
    const std::string p = mtp_prefix(i);
    MtpLayerWeights& m = w_.mtp[i];
    m.enorm = b.vec(p + "enorm.weight", H);
    m.hnorm = b.vec(p + "hnorm.weight", H);
    m.final_norm = b.vec(p + "final_layernorm.weight", H);
    m.eh_proj = b.linear(p + "eh_proj", H, 2 * H);
    m.block.input_norm = b.vec(p + "input_layernorm.weight", H);
    m.block.post_attn_norm = b.vec(p + "post_attention_layernorm.weight", H);
    // The draft block always has its own indexer; its MLP type extends mlp_layer_types with the last entry.
    load_attention(b, c, p + "self_attn.", true, m.block.attn);
    const bool sparse = c.mlp_layer_types.empty() ? true : c.mlp_layer_types.back() == "sparse";
    load_ffn(b, c, p + "mlp.", sparse, m.block.ffn);
  }

  b.finish(model_dir, [&](const std::string& canon) {
    // Copies of the shared embedding / head inside MTP layers are skipped on purpose, as the seed does.
    return canon.find(".embed_tokens.") != std::string::npos || canon.find(".shared_head.") != std::string::npos ||
           (n_mtp == 0 && canon.rfind("model.mtp_layers.", 0) == 0);
  });
}

}  // namespace nextn
