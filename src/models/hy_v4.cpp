// HY V4 forward on the ops layer. See hy_v4.h for the data flow; shapes are in [rows, cols] comments.
#include "models/hy_v4.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/threadpool.h"

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

HYV4Model::~HYV4Model() = default;

size_t HYV4Model::weight_bytes_total() const {
  size_t total = w_.lm_head.weight_bytes();
  auto ffn_bytes = [&](const FfnWeights& f) {
    size_t s = f.gate_proj.weight_bytes() + f.up_proj.weight_bytes() + f.down_proj.weight_bytes();
    if (f.sparse && !f.expert_gate_up.empty())
      s += f.router.weight_bytes() + size_t(cfg_.num_experts_per_tok) *
                                         (f.expert_gate_up[0].weight_bytes() + f.expert_down[0].weight_bytes());
    return s;
  };
  for (const auto& L : w_.layers) {
    const AttentionWeights& a = L.attn;
    total += a.q_a_proj.weight_bytes() + a.q_b_proj.weight_bytes() + a.kv_a_proj.weight_bytes() +
             a.kv_b_proj.weight_bytes() + a.o_proj.weight_bytes() + a.gate_proj.weight_bytes();
    if (a.has_indexer)
      total += a.indexer.wq_b.weight_bytes() + a.indexer.wk.weight_bytes() + a.indexer.weights_proj.weight_bytes();
    total += ffn_bytes(L.ffn) + L.attn_hc.fn.weight_bytes() + L.ffn_hc.fn.weight_bytes();
  }
  return total;
}

KVCache HYV4Model::new_cache(int64_t capacity) const {
  std::vector<LayerCache> layers(w_.layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerCache& lc = layers[i];
    lc.kv_lora = cfg_.kv_lora_rank;
    lc.rope = cfg_.qk_rope_head_dim;
    lc.latent.assign(capacity * lc.kv_lora, 0.0f);
    lc.k_rot.assign(capacity * lc.rope, 0.0f);
    if (w_.layers[i].attn.has_indexer) {
      lc.index_dim = cfg_.index_head_dim;
      lc.index_k.assign(capacity * lc.index_dim, 0.0f);
    }
  }
  return KVCache(capacity, std::move(layers));
}

KVCache HYV4Model::new_draft_cache(int64_t capacity) const {
  std::vector<LayerCache> layers(1);
  for (LayerCache& lc : layers) {
    lc.kv_lora = cfg_.kv_lora_rank;
    lc.rope = cfg_.qk_rope_head_dim;
    lc.index_dim = cfg_.index_head_dim;
    lc.latent.assign(capacity * lc.kv_lora, 0.0f);
    lc.k_rot.assign(capacity * lc.rope, 0.0f);
    lc.index_k.assign(capacity * lc.index_dim, 0.0f);
  }
  return KVCache(capacity, std::move(layers));
}

// ---------------------------------------------------------------------------------------------------
// Forward

void HYV4Model::ensure_workspace(int64_t S, int64_t max_seq) {
  if (S <= ws_.rows && max_seq <= ws_max_seq_) return;
  const HYV4Config& c = cfg_;
  S = std::max(S, ws_.rows);
  max_seq = std::max(max_seq, ws_max_seq_);
  const int64_t H = c.hidden_size, C = c.hc_mult, nh = c.num_attention_heads;
  const int64_t I2 = std::max(2 * c.moe_intermediate_size * std::max(1, c.n_shared_experts), 2 * c.intermediate_size);
  const int threads = pool_ ? pool_->size() : 1;
  HYV4Workspace& w = ws_;
  w.rows = S;
  ws_max_seq_ = max_seq;
  w.streams.assign(S * C * H, 0);
  w.x.assign(S * H, 0);
  w.xn.assign(S * H, 0);
  w.y.assign(S * H, 0);
  w.mixes.assign(S * 2 * C, 0);
  w.q_resid.assign(S * c.q_lora_rank, 0);
  w.q.assign(S * nh * c.qk_head_dim, 0);
  w.kv_a.assign(S * (c.kv_lora_rank + c.qk_rope_head_dim), 0);
  w.gate.assign(S * nh * c.v_head_dim, 0);
  w.attn.assign(S * nh * c.v_head_dim, 0);
  w.iq.assign(S * c.index_n_heads * c.index_head_dim, 0);
  w.ik.assign(S * c.index_head_dim, 0);
  w.iw.assign(S * c.index_n_heads, 0);
  w.topk.assign(S * std::max<int64_t>(c.index_topk, 1), 0);
  w.topk_count.assign(S, 0);
  w.ffn_a.assign(S * I2, 0);
  w.ffn_b.assign(S * I2, 0);
  w.router.assign(S * c.n_routed_experts, 0);
  w.expert_ids.assign(S * c.num_experts_per_tok, 0);
  w.expert_w.assign(S * c.num_experts_per_tok, 0);
  w.gathered.assign(S * H, 0);
  w.expert_out.assign(S * H, 0);
  w.expert_rows.assign(S, 0);
  w.hidden.assign(S * H, 0);
  w.mtp_in.assign(S * 2 * H, 0);
  w.streams_tmp.assign(S * C, 0);  // post gates [S, C]
  // attention scratch per thread: q_lat + o_lat [kv_lora], out [v], scores [max_seq]
  w.att_scratch.assign(threads * (2 * c.kv_lora_rank + c.v_head_dim + max_seq), 0);
  w.idx_scratch.assign(S * max_seq, 0);
  w.idx_tmp.assign(S * max_seq, 0);
}

// streams [S, C, H] -> x [S, H] (weighted by the pre gates); post gates -> streams_tmp [S, C]
void HYV4Model::hyper_pre(const HyperConnectionWeights& hc, int64_t S) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  const float eps = static_cast<float>(cfg_.rms_norm_eps), hc_eps = static_cast<float>(cfg_.hc_eps);
  const float mag = static_cast<float>(cfg_.hc_magnitude);
  ops::matmul(pool_, ws_.streams.data(), S, hc.fn, ws_.mixes.data());  // [S, 2C]
  for (int64_t s = 0; s < S; ++s) {
    const float* X = ws_.streams.data() + s * C * H;
    const float r = ops::inv_rms(X, C * H, eps);
    float* m = ws_.mixes.data() + s * 2 * C;
    float* post = ws_.streams_tmp.data() + s * C;
    float* x = ws_.x.data() + s * H;
    std::fill(x, x + H, 0.0f);
    for (int64_t j = 0; j < C; ++j) {
      const float pre = ops::sigmoid(m[j] * r * hc.scale[0] + hc.base[j]) + hc_eps;
      post[j] = mag * ops::sigmoid(m[C + j] * r * hc.scale[1] + hc.base[C + j]) + hc_eps;
      for (int64_t i = 0; i < H; ++i) x[i] += pre * X[j * H + i];
    }
  }
}

// streams[s, j] += post[s, j] * y[s]
void HYV4Model::hyper_post(int64_t S) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  for (int64_t s = 0; s < S; ++s) {
    float* X = ws_.streams.data() + s * C * H;
    const float* y = ws_.y.data() + s * H;
    const float* post = ws_.streams_tmp.data() + s * C;
    for (int64_t j = 0; j < C; ++j)
      for (int64_t i = 0; i < H; ++i) X[j * H + i] = post[j] * y[i] + X[j * H + i];
  }
}

// xn [S, H] (normed) -> y [S, H]. Writes positions pos0..pos0+S-1 into lc.
void HYV4Model::attention(const DecoderLayerWeights& L, LayerCache& lc, int64_t S, int64_t pos0) {
  const HYV4Config& c = cfg_;
  const AttentionWeights& a = L.attn;
  const int64_t nh = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t qkd = c.qk_head_dim, vd = c.v_head_dim, kvl = c.kv_lora_rank, half = rope / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float af = static_cast<float>(c.rope.attention_factor);
  const float* xn = ws_.xn.data();

  ops::matmul(pool_, xn, S, a.gate_proj, ws_.gate.data());        // [S, nh*v]
  ops::matmul(pool_, xn, S, a.q_a_proj, ws_.q_resid.data());      // [S, q_lora]
  ops::rms_norm(ws_.q_resid.data(), S, c.q_lora_rank, a.q_a_norm.data(), eps, ws_.q_resid.data());
  ops::matmul(pool_, ws_.q_resid.data(), S, a.q_b_proj, ws_.q.data());  // [S, nh*qkd]
  ops::matmul(pool_, xn, S, a.kv_a_proj, ws_.kv_a.data());       // [S, kvl + rope]

  std::vector<float> cs(2 * half);  // small, per call; TODO(P6): move into the workspace
  float* cosv = cs.data();
  float* sinv = cs.data() + half;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pos = pos0 + s;
    ops::rope_tables(c.rope.inv_freq.data(), half, pos, af, cosv, sinv);
    float* q = ws_.q.data() + s * nh * qkd;
    for (int64_t h = 0; h < nh; ++h) ops::rope_rotate_half(q + h * qkd + nope, rope, cosv, sinv);
    const float* kva = ws_.kv_a.data() + s * (kvl + rope);
    ops::rms_norm(kva, 1, kvl, a.kv_a_norm.data(), eps, lc.latent.data() + pos * kvl);
    float* kr = lc.k_rot.data() + pos * rope;
    std::copy(kva + kvl, kva + kvl + rope, kr);
    ops::rope_rotate_half(kr, rope, cosv, sinv);
  }

  // DSA indexer: top-k key positions per query row (ascending), or reuse the previous full layer's.
  const int64_t K = std::max<int64_t>(c.index_topk, 1);
  if (a.has_indexer) {
    const IndexerWeights& ix = a.indexer;
    const int64_t nih = c.index_n_heads, ihd = c.index_head_dim;
    ops::matmul(pool_, ws_.q_resid.data(), S, ix.wq_b, ws_.iq.data());  // [S, nih*ihd]
    ops::matmul(pool_, xn, S, ix.wk, ws_.ik.data());                    // [S, ihd]
    ops::layer_norm(ws_.ik.data(), S, ihd, ix.k_norm_w.data(), ix.k_norm_b.data(), eps, ws_.ik.data());
    ops::matmul(pool_, xn, S, ix.weights_proj, ws_.iw.data());          // [S, nih]
    const float wscale_a = 1.0f / std::sqrt(static_cast<float>(nih));
    const float wscale_b = 1.0f / std::sqrt(static_cast<float>(ihd));
    for (int64_t s = 0; s < S; ++s) {
      const int64_t pos = pos0 + s;
      ops::rope_tables(c.rope.inv_freq.data(), half, pos, af, cosv, sinv);
      float* iq = ws_.iq.data() + s * nih * ihd;
      // The indexer rotates the *last* rope dims of its heads.
      for (int64_t h = 0; h < nih; ++h) ops::rope_rotate_half(iq + h * ihd + (ihd - rope), rope, cosv, sinv);
      float* ik = ws_.ik.data() + s * ihd;
      ops::rope_rotate_half(ik + (ihd - rope), rope, cosv, sinv);
      std::copy(ik, ik + ihd, lc.index_k.data() + pos * ihd);
      float* iw = ws_.iw.data() + s * nih;
      for (int64_t h = 0; h < nih; ++h) iw[h] = iw[h] * wscale_a * wscale_b;
    }
    const int64_t max_seq = ws_max_seq_;
    parallel_for(pool_, S, 1, [&](int64_t s0, int64_t s1, int) {
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t pos = pos0 + s, n = pos + 1;
        float* score = ws_.idx_scratch.data() + s * max_seq;
        const float* iq = ws_.iq.data() + s * nih * ihd;
        const float* iw = ws_.iw.data() + s * nih;
        for (int64_t t = 0; t < n; ++t) {
          const float* k = lc.index_k.data() + t * ihd;
          float acc = 0.0f;
          for (int64_t h = 0; h < nih; ++h) acc += iw[h] * std::max(ops::dot(iq + h * ihd, k, ihd), 0.0f);
          score[t] = acc;
        }
        ws_.topk_count[s] = static_cast<int32_t>(
            ops::topk_ascending(score, n, K, ws_.topk.data() + s * K, ws_.idx_tmp.data() + s * max_seq));
      }
    });
  }

  // Sparse MLA over the cached latents (absorbed: q·(W_kb c) = (W_kbᵀ q)·c, out = W_vb (Σ p c)).
  const float scale = static_cast<float>(c.attn_scale);
  const int64_t stride = 2 * kvl + vd + ws_max_seq_;
  parallel_for(pool_, S * nh, 1, [&](int64_t b0, int64_t b1, int tid) {
    float* q_lat = ws_.att_scratch.data() + tid * stride;
    float* o_lat = q_lat + kvl;
    float* out = o_lat + kvl;
    float* p = out + vd;
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t s = bi / nh, h = bi % nh;
      const float* q = ws_.q.data() + s * nh * qkd + h * qkd;
      std::fill(q_lat, q_lat + kvl, 0.0f);
      ops::matmul_transposed(q, a.kv_b_proj.rows(h * (nope + vd), nope), q_lat);
      const int32_t* sel = ws_.topk.data() + s * K;
      const int64_t nsel = ws_.topk_count[s];
      float mx = a.sinks[h];
      for (int64_t j = 0; j < nsel; ++j) {
        const int64_t t = sel[j];
        const float sc = (ops::dot(q_lat, lc.latent.data() + t * kvl, kvl) +
                          ops::dot(q + nope, lc.k_rot.data() + t * rope, rope)) * scale;
        p[j] = sc;
        mx = std::max(mx, sc);
      }
      float denom = std::exp(a.sinks[h] - mx);
      for (int64_t j = 0; j < nsel; ++j) {
        p[j] = std::exp(p[j] - mx);
        denom += p[j];
      }
      std::fill(o_lat, o_lat + kvl, 0.0f);
      for (int64_t j = 0; j < nsel; ++j) {
        const float pj = p[j] / denom;
        const float* cl = lc.latent.data() + int64_t(sel[j]) * kvl;
        for (int64_t i = 0; i < kvl; ++i) o_lat[i] += pj * cl[i];
      }
      ops::matmul(nullptr, o_lat, 1, a.kv_b_proj.rows(h * (nope + vd) + nope, vd), out);
      const float* g = ws_.gate.data() + s * nh * vd + h * vd;
      float* dst = ws_.attn.data() + s * nh * vd + h * vd;
      for (int64_t i = 0; i < vd; ++i) dst[i] = out[i] * ops::sigmoid(g[i]);
    }
  });
  ops::matmul(pool_, ws_.attn.data(), S, a.o_proj, ws_.y.data());  // [S, H]
}

// x [S, H] -> out [S, H]
void HYV4Model::ffn(const FfnWeights& F, const float* x, int64_t S, float* out) {
  const HYV4Config& c = cfg_;
  const int64_t H = c.hidden_size;
  auto mlp = [&](const Linear& g, const Linear& u, const Linear& d, float limit, const float* in, int64_t rows,
                 float* dst) {
    const int64_t I = g.out;
    ops::matmul(pool_, in, rows, g, ws_.ffn_a.data());
    ops::matmul(pool_, in, rows, u, ws_.ffn_b.data());
    for (int64_t r = 0; r < rows; ++r)
      ops::swiglu(ws_.ffn_a.data() + r * I, ws_.ffn_b.data() + r * I, I, limit, ws_.ffn_a.data() + r * I);
    ops::matmul(pool_, ws_.ffn_a.data(), rows, d, dst);
  };
  if (!F.sparse) {
    mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, out);
    return;
  }
  // Router: sigmoid scores; the correction bias steers selection only; group-limited top-k.
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, G = c.n_group, per = E / G;
  ops::matmul(pool_, x, S, F.router, ws_.router.data());  // [S, E]
  for (int64_t s = 0; s < S; ++s) {
    float* logit = ws_.router.data() + s * E;
    float scores[1024], choice[1024];
    if (E > 1024) throw Error("n_routed_experts > 1024 is not supported");
    for (int64_t e = 0; e < E; ++e) {
      scores[e] = ops::sigmoid(logit[e]);
      choice[e] = scores[e] + F.e_bias[e];
    }
    if (G > 1) {
      float gscore[256];
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          if (choice[e] > b1) { b2 = b1; b1 = choice[e]; } else if (choice[e] > b2) b2 = choice[e];
        }
        gscore[g] = b1 + (per > 1 ? b2 : 0.0f);
      }
      int32_t keep[256], tmp[256];
      const int64_t nk = ops::topk_ascending(gscore, G, c.topk_group, keep, tmp);
      bool kept[256] = {};
      for (int64_t i = 0; i < nk; ++i) kept[keep[i]] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!kept[e / per]) choice[e] = -INFINITY;
    }
    int32_t idx[1024], tmp[1024];
    ops::topk_ascending(choice, E, k, idx, tmp);
    float* w = ws_.expert_w.data() + s * k;
    int32_t* ids = ws_.expert_ids.data() + s * k;
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      ids[i] = idx[i];
      w[i] = scores[idx[i]];
      sum += w[i];
    }
    for (int64_t i = 0; i < k; ++i) {
      if (c.norm_topk_prob) w[i] = w[i] / (sum + 1e-20f);
      w[i] = w[i] * static_cast<float>(c.routed_scaling_factor);
    }
  }
  // Experts in ascending id: gather their tokens, run them as one batch, scatter-add (per token the
  // sum runs in ascending expert order whatever the batch: batch invariant).
  std::fill(out, out + S * H, 0.0f);
  const float limit = static_cast<float>(c.swiglu_limit);
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < k; ++i)
        if (ws_.expert_ids[s * k + i] == e) {
          ws_.expert_rows[n] = static_cast<int32_t>(s * k + i);
          std::copy(x + s * H, x + (s + 1) * H, ws_.gathered.data() + n * H);
          ++n;
        }
    if (n == 0) continue;
    const Linear& gu = F.expert_gate_up[e];
    const int64_t I = gu.out / 2;
    mlp(gu.rows(0, I), gu.rows(I, I), F.expert_down[e], limit, ws_.gathered.data(), n, ws_.expert_out.data());
    for (int64_t r = 0; r < n; ++r) {
      const int64_t slot = ws_.expert_rows[r], s = slot / k;
      const float wt = ws_.expert_w[slot];
      const float* src = ws_.expert_out.data() + r * H;
      float* dst = out + s * H;
      for (int64_t i = 0; i < H; ++i) dst[i] += src[i] * wt;
    }
  }
  if (F.has_shared) {
    mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, ws_.expert_out.data());
    for (int64_t i = 0; i < S * H; ++i) out[i] += ws_.expert_out[i];
  }
}

void HYV4Model::lm_head(const float* hidden, int64_t rows, float* logits) {
  ops::matmul(pool_, hidden, rows, w_.lm_head, logits);
}

void HYV4Model::forward(const int32_t* tokens, int64_t S, KVCache& cache, float* logits_out, float* hidden_out,
                        bool all_logits) {
  const HYV4Config& c = cfg_;
  if (S <= 0) return;
  if (cache.num_layers() != w_.layers.size()) throw Error("forward: cache does not belong to this model");
  cache.check_room(S);
  const int64_t H = c.hidden_size, C = c.hc_mult, V = c.vocab_size;
  for (int64_t s = 0; s < S; ++s)
    if (tokens[s] < 0 || tokens[s] >= V)
      throw Error("token id " + std::to_string(tokens[s]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
  ensure_workspace(S, cache.capacity());
  const int64_t pos0 = cache.length();
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Embedding, copied into every HC stream.
  for (int64_t s = 0; s < S; ++s) {
    float* X = ws_.streams.data() + s * C * H;
    ops::dequant_row(w_.embed, tokens[s], X);
    for (int64_t j = 1; j < C; ++j) std::copy(X, X + H, X + j * H);
  }
  for (size_t li = 0; li < w_.layers.size(); ++li) {
    const DecoderLayerWeights& L = w_.layers[li];
    hyper_pre(L.attn_hc, S);
    ops::rms_norm(ws_.x.data(), S, H, L.input_norm.data(), eps, ws_.xn.data());
    attention(L, cache.layer(li), S, pos0);
    hyper_post(S);
    hyper_pre(L.ffn_hc, S);
    ops::rms_norm(ws_.x.data(), S, H, L.post_attn_norm.data(), eps, ws_.xn.data());
    ffn(L.ffn, ws_.xn.data(), S, ws_.y.data());
    hyper_post(S);
  }
  // HC head: collapse the streams with sigmoid gates, then the final norm.
  ops::matmul(pool_, ws_.streams.data(), S, w_.hc_head_fn, ws_.mixes.data());  // [S, C]
  const float hc_eps = static_cast<float>(c.hc_eps);
  for (int64_t s = 0; s < S; ++s) {
    const float* X = ws_.streams.data() + s * C * H;
    const float r = ops::inv_rms(X, C * H, eps);
    float* x = ws_.x.data() + s * H;
    std::fill(x, x + H, 0.0f);
    for (int64_t j = 0; j < C; ++j) {
      const float pre = ops::sigmoid(ws_.mixes[s * C + j] * r * w_.hc_head_scale[0] + w_.hc_head_base[j]) + hc_eps;
      for (int64_t i = 0; i < H; ++i) x[i] += pre * X[j * H + i];
    }
  }
  ops::rms_norm(ws_.x.data(), S, H, w_.final_norm.data(), eps, ws_.hidden.data());
  cache.advance(S);
  if (hidden_out) std::copy(ws_.hidden.begin(), ws_.hidden.begin() + S * H, hidden_out);
  if (logits_out) {
    if (all_logits)
      lm_head(ws_.hidden.data(), S, logits_out);
    else
      lm_head(ws_.hidden.data() + (S - 1) * H, 1, logits_out);
  }
}

void HYV4Model::draft_forward(int layer, const int32_t* tokens, const float* h_prev, int64_t S, KVCache& dcache,
                              float* logits_out, float* hidden_out) {
  const HYV4Config& c = cfg_;
  if (layer < 0 || layer >= num_mtp_layers())
    throw Error("draft_forward: MTP layer " + std::to_string(layer) + " does not exist (checkpoint has " +
                std::to_string(num_mtp_layers()) + ")");
  if (S <= 0) return;
  dcache.check_room(S);
  ensure_workspace(S, dcache.capacity());
  const MtpLayerWeights& m = w_.mtp[layer];
  const int64_t H = c.hidden_size, pos0 = dcache.length();
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t s = 0; s < S; ++s) {
    float* in = ws_.mtp_in.data() + s * 2 * H;
    if (pos0 + s == 0) {
      std::fill(in, in + H, 0.0f);  // the seed zeroes the token embedding at position 0
    } else {
      if (tokens[s] < 0 || tokens[s] >= c.vocab_size) throw Error("draft token id outside the vocabulary");
      ops::dequant_row(w_.embed, tokens[s], in);
    }
    ops::rms_norm(in, 1, H, m.enorm.data(), eps, in);
    ops::rms_norm(h_prev + s * H, 1, H, m.hnorm.data(), eps, in + H);
  }
  ops::matmul(pool_, ws_.mtp_in.data(), S, m.eh_proj, ws_.x.data());  // [S, H]
  ops::rms_norm(ws_.x.data(), S, H, m.block.input_norm.data(), eps, ws_.xn.data());
  attention(m.block, dcache.layer(0), S, pos0);
  for (int64_t i = 0; i < S * H; ++i) ws_.x[i] += ws_.y[i];
  ops::rms_norm(ws_.x.data(), S, H, m.block.post_attn_norm.data(), eps, ws_.xn.data());
  ffn(m.block.ffn, ws_.xn.data(), S, ws_.y.data());
  for (int64_t i = 0; i < S * H; ++i) ws_.x[i] += ws_.y[i];
  ops::rms_norm(ws_.x.data(), S, H, m.final_norm.data(), eps, ws_.hidden.data());
  dcache.advance(S);
  if (hidden_out) std::copy(ws_.hidden.begin(), ws_.hidden.begin() + S * H, hidden_out);
  if (logits_out) lm_head(ws_.hidden.data(), S, logits_out);
}

}  // namespace nextn
