// Loading Qwen4-Exp checkpoints as published: the composite qwen4_exp layout (model.language_model.*, with
// the vision tower's model.visual.* skipped) or the text-only one (model.*), per-expert or fused experts,
// sharded PLE n-gram tables, block-wise FP8 with quantization_config, and the MTP head under mtp.* (which
// transformers drops and nextn must not). Large tensors are viewed in place, never copied.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/splitmix.h"
#include "models/common/binder.h"
#include "models/common/name_rules.h"
#include "models/qwen4_exp/model.h"
#include "models/qwen4_exp/sharding.h"

namespace nextn {

std::string qwen4_exp_canonical_name(const std::string& checkpoint_name) {
  static const std::string kComposite = "model.language_model.";
  if (names::starts_with(checkpoint_name, kComposite)) return "model." + checkpoint_name.substr(kComposite.size());
  return checkpoint_name;
}

namespace {

using names::starts_with;

NormScale one_plus(std::vector<float> w) {
  for (float& v : w) v = 1.0f + v;  // transformers: x_normed * (1.0 + weight.float())
  return w;
}

// ---- PLE hash tables (rebuilt from config.json, as transformers does; the checkpoint holds none)

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

// Odd multipliers below max_long / vocab (so token · multiplier never overflows int64).
std::vector<int64_t> layer_multipliers(int64_t vocab, int ngram_size, int ple_index, int64_t seed) {
  const int64_t multiplier_max = std::numeric_limits<int64_t>::max() / std::max<int64_t>(vocab, 1);
  const uint64_t half_bound = static_cast<uint64_t>(std::max<int64_t>(1, multiplier_max / 2));
  const uint64_t base_seed = static_cast<uint64_t>(seed) + 10007ull * static_cast<uint64_t>(ple_index);
  std::vector<int64_t> m;
  for (int i = 0; i < ngram_size; ++i) {
    const uint64_t v = base_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
    m.push_back(static_cast<int64_t>(2 * (splitmix64(v) % half_bound) + 1));
  }
  return m;
}

class Qwen4ExpBinder : public TensorBinder {
 public:
  Qwen4ExpBinder(const Qwen4ExpConfig& c, const WeightStore& store, const QuantPlan& plan, LoadReport& r)
      : TensorBinder(store, r), plan_(plan), L_(c.num_hidden_layers) {
    set_exclusions(plan.backbone, qwen4_exp_canonical_name);
    for (const std::string& raw : store.names()) {
      if (starts_with(raw, "model.visual.") || starts_with(raw, "visual.")) {
        ++vision_;
        continue;
      }
      std::string canon = qwen4_exp_canonical_name(raw);
      if (skip_activation_scale(raw, canon)) continue;
      int idx = 0;
      std::string rest;
      if (names::split_indexed(canon, "mtp.layers.", &idx, &rest)) {
        mtp_indices_.insert(idx);
        // vLLM names the MTP layers after the target's (layers.{L + i}); checkpoints number them from 0.
        if (idx >= L_) canon = "mtp.layers." + std::to_string(idx - L_) + "." + rest;
      }
      add(canon, raw);
    }
  }

  int mtp_layers_found() const {
    int n = 0;
    while (has_prefix("mtp.layers." + std::to_string(n) + ".")) ++n;
    return n;
  }

  Linear lin(const std::string& p, int64_t out, int64_t in, std::vector<float>* bias = nullptr) {
    return linear(p, out, in, Role::Either, bias);
  }

  GatedResidualWeights gated_residual(const std::string& p, const Qwen4ExpConfig& c, bool with_inject) {
    const int64_t CH = c.hc_width();
    GatedResidualWeights g;
    g.hc_norm = one_plus(vec(p + "hc_norm.weight", CH));
    g.mix_down = lin(p + "input_mix_weight_down", c.hc_lowrank, CH);
    g.mix_up = lin(p + "input_mix_weight_up", CH, c.hc_lowrank);
    if (with_inject) {
      g.inject = lin(p + "block_inject_weight", c.hc_count, CH);
    } else {
      // The final mixers have no injection (use_combine=False); vLLM drops the MTP mixer's stored one.
      take_unread(p + "block_inject_weight.weight");
    }
    return g;
  }

  void gdn(const std::string& p, const Qwen4ExpConfig& c, GdnWeights& g) {
    const int64_t H = c.hidden_size, nv = c.linear_num_value_heads;
    const Linear qkv = lin(p + "in_proj_qkv", c.conv_dim(), H);
    g.in_q = qkv.rows(0, c.linear_key_dim());
    g.in_k = qkv.rows(c.linear_key_dim(), c.linear_key_dim());
    g.in_v = qkv.rows(2 * c.linear_key_dim(), c.linear_value_dim());
    g.in_z = lin(p + "in_proj_z", c.linear_value_dim(), H);
    g.in_b = lin(p + "in_proj_b", nv, H);
    g.in_a = lin(p + "in_proj_a", nv, H);
    g.conv = small(p + "conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim});
    g.neg_A = vec(p + "A_log", nv);
    for (float& a : g.neg_A) a = -std::exp(a);
    g.dt_bias = vec(p + "dt_bias", nv);
    g.norm = vec(p + "norm.weight", c.linear_value_head_dim);
    g.out_proj = lin(p + "out_proj", H, c.linear_value_dim());
  }

  void attention(const std::string& p, const Qwen4ExpConfig& c, QsaWeights& a) {
    const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads, kv = c.num_key_value_heads;
    auto* qb = c.attention_bias ? &a.q_bias : nullptr;
    auto* kb = c.attention_bias ? &a.k_bias : nullptr;
    auto* vb = c.attention_bias ? &a.v_bias : nullptr;
    auto* ob = c.attention_bias ? &a.o_bias : nullptr;
    a.q_proj = lin(p + "q_proj", nh * 2 * hd, H, qb);
    a.k_proj = lin(p + "k_proj", kv * hd, H, kb);
    a.v_proj = lin(p + "v_proj", kv * hd, H, vb);
    a.o_proj = lin(p + "o_proj", H, nh * hd, ob);
    a.q_norm = one_plus(vec(p + "q_norm.weight", hd));
    a.k_norm = one_plus(vec(p + "k_norm.weight", hd));
    const int64_t ihd = c.indexer_head_dim;
    a.index_qk = lin(p + "indexer.index_qk_proj", (c.indexer_n_heads + 1) * ihd, H);
    a.index_q_norm = one_plus(vec(p + "indexer.q_layernorm.weight", ihd));
    a.index_k_norm = one_plus(vec(p + "indexer.k_layernorm.weight", ihd));
  }

  void moe(const std::string& p, const Qwen4ExpConfig& c, MoeWeights& m) {
    const int64_t H = c.hidden_size, Is = c.shared_expert_intermediate_size;
    m.router = lin(p + "gate", c.num_experts, H);
    experts(p, c.num_experts, c.moe_intermediate_size, H, m.gate, m.up, m.down);
    auto gu = stacked(p + "shared_expert.", "gate_up_proj", {{"gate_proj", Is}, {"up_proj", Is}}, H, Role::Either);
    m.shared_gate = gu[0];
    m.shared_up = gu[1];
    m.shared_down = lin(p + "shared_expert.down_proj", H, Is);
    m.shared_expert_gate = lin(p + "shared_expert_gate", 1, H);
  }

  void ple(const std::string& p, const Qwen4ExpConfig& c, int ple_index, PleWeights& w) {
    const int64_t H = c.hidden_size, CH = c.hc_width(), E = c.ple_embed_dim, dph = c.ple_head_dim();
    // The hashed heads: head g of this layer (global g' = ple_index · heads + g) has the (g' + 1)-th prime
    // >= ngram_vocab_size_base as its vocabulary; the heads' tables are stacked in one embedding.
    const int heads = c.ngram_heads();
    int64_t prime = c.ngram_vocab_size_base - 1, total = 0;
    for (int g = 0; g < int64_t(ple_index) * heads; ++g) prime = next_prime(prime);
    for (int g = 0; g < heads; ++g) {
      prime = next_prime(prime);
      w.head_sizes.push_back(prime);
      w.head_offsets.push_back(total);
      total += prime;
    }
    const int64_t div = c.make_ngram_vocab_size_divisible_by;
    const int64_t rows = (total + div - 1) / div * div;
    w.multipliers = layer_multipliers(c.vocab_size, c.ngram_size, ple_index, c.seed);
    table(p + "ple_embedding.ngram_embedding.", rows, dph, w);
    w.key_proj = lin(p + "key_proj", CH, E);
    w.value_proj = lin(p + "value_proj", H, E);
    w.norm_key = one_plus(vec(p + "norm_key.weight", CH));
    w.norm_query = one_plus(vec(p + "norm_query.weight", CH));
    w.norm_conv = one_plus(vec(p + "norm_conv.weight", CH));
    w.conv = small(p + "conv1d.weight", {CH, 1, c.ple_conv_kernel_size});
  }

  void finish() {
    report_unused([](const std::string&) { return std::string(); });
    report_skipped_scales();
    if (vision_ > 0)
      r_.infos.push_back(std::to_string(vision_) + " vision tensor(s) (model.visual.*) skipped: nextn runs the text model");
  }

 protected:
  const QuantScheme& scheme_for(const std::string&) const override { return plan_.backbone; }

 private:
  static int64_t next_prime(int64_t p) {
    do ++p;
    while (!is_prime(p));
    return p;
  }

  // The n-gram embedding [rows, dph]: one tensor, or shards shard_0.. concatenated on dim 0.
  void table(const std::string& p, int64_t rows, int64_t dph, PleWeights& w) {
    if (has(p + "weight")) {
      w.table_shards.push_back(named_linear(p + "weight", p.substr(0, p.size() - 1), rows, dph, Role::Either));
      w.shard_starts = {0, rows};
      return;
    }
    int64_t start = 0;
    w.shard_starts = {0};
    for (int k = 0; has(p + "shard_" + std::to_string(k) + ".weight"); ++k) {
      const std::string name = p + "shard_" + std::to_string(k) + ".weight";
      const TensorView* t = peek(name);
      const int64_t n = t && t->shape.size() == 2 ? t->shape[0] : 0;
      if (n <= 0 || start + n > rows) {
        error("tensor '" + raw_of(name) + "' has shape " + (t ? t->shape_str() : "?") + ": the shards of " + p +
              "* must stack to [" + std::to_string(rows) + ", " + std::to_string(dph) + "]");
        take(name);
        return;
      }
      w.table_shards.push_back(named_linear(name, p.substr(0, p.size() - 1), n, dph, Role::Either));
      start += n;
      w.shard_starts.push_back(start);
    }
    if (w.table_shards.empty()) {
      missing(p + "weight (or " + p + "shard_0.weight ...)");
    } else if (start != rows) {
      error("the " + std::to_string(w.table_shards.size()) + " shards of " + p + "* hold " + std::to_string(start) +
            " rows; the config's n-gram vocabulary needs " + std::to_string(rows));
    }
  }

  const QuantPlan& plan_;
  const int L_;
  int64_t vision_ = 0;
  std::set<int> mtp_indices_;
};

void bind_layer(Qwen4ExpBinder& b, const Qwen4ExpConfig& c, const std::string& p, Qwen4LayerKind kind, int ple_index,
                Qwen4LayerWeights& L) {
  L.kind = kind;
  L.attn_hc = b.gated_residual(p + "attn_hyper_connection.", c, true);
  L.mlp_hc = b.gated_residual(p + "mlp_hyper_connection.", c, true);
  if (kind == Qwen4LayerKind::Linear)
    b.gdn(p + "linear_attn.", c, L.gdn);
  else
    b.attention(p + "self_attn.", c, L.attn);
  b.moe(p + "mlp.", c, L.moe);
  L.has_ple = ple_index >= 0;
  if (L.has_ple) b.ple(p + "ple.", c, ple_index, L.ple);
}

}  // namespace

void bind_qwen4_exp_weights(const Qwen4ExpConfig& c, const WeightStore& store, Qwen4ExpWeights& w, LoadReport& r) {
  const std::string cfg_file = store.dir() + "/config.json";
  for (const std::string& warning : c.warnings) r.warnings.push_back(cfg_file + ": " + warning);
  QuantPlan plan;
  plan.backbone = resolve_fp8_scheme(c.quant, r);
  plan.draft = plan.backbone;
  if (!r.errors.empty()) return;
  const int64_t H = c.hidden_size, V = c.vocab_size, CH = c.hc_width();
  Qwen4ExpBinder b(c, store, plan, r);

  w.embed = b.named_linear("model.embed_tokens.weight", "model.embed_tokens", V, H, Role::Either);
  w.layers.assign(c.num_hidden_layers, Qwen4LayerWeights{});
  for (int i = 0; i < c.num_hidden_layers; ++i)
    bind_layer(b, c, "model.layers." + std::to_string(i) + ".", c.kinds[i], c.ple_index(i), w.layers[i]);
  w.mixer = b.gated_residual("model.hyper_connection_mixer.", c, false);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
    if (const TensorView* t = b.take_unread("lm_head.weight"))
      r.warnings.push_back("tie_word_embeddings is true: tensor '" + t->name + "' in " + store.file_of(t->name) +
                           " is not used (the lm_head is the token embedding, as transformers ties them)");
  } else {
    w.lm_head = b.named_linear("lm_head.weight", "lm_head", V, H, Role::Either);
  }

  // The MTP head. config.json's mtp_num_hidden_layers decides; without it, the layers the checkpoint holds.
  const int found = b.mtp_layers_found();
  const int n_mtp = c.mtp_num_hidden_layers >= 0 ? c.mtp_num_hidden_layers : found;
  if (c.mtp_num_hidden_layers < 0 && found > 0)
    r.infos.push_back("config.json does not say mtp_num_hidden_layers: using the " + std::to_string(found) +
                      " MTP layer(s) the checkpoint holds");
  if (n_mtp > 0) {
    Qwen4MtpWeights& m = w.mtp;
    m.pre_fc_norm_embedding = one_plus(b.vec("mtp.pre_fc_norm_embedding.weight", H));
    m.pre_fc_norm_hidden = one_plus(b.vec("mtp.pre_fc_norm_hidden.weight", CH));
    m.fc_embedding = b.lin("mtp.fc_embedding", H, H);
    m.fc_hidden = b.lin("mtp.fc_hidden", H, H);
    m.layers.assign(n_mtp, Qwen4LayerWeights{});
    for (int j = 0; j < n_mtp; ++j)
      bind_layer(b, c, "mtp.layers." + std::to_string(j) + ".", Qwen4LayerKind::SparseAttention, -1, m.layers[j]);
    m.mixer = b.gated_residual("mtp.hyper_connection_mixer.", c, false);
  }
  b.finish();
}

}  // namespace nextn
