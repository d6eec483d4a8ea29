// Loading HY V4 checkpoints: hub / internal / vLLM tensor names, split or fused layouts and block-wise FP8
// quantization, mapped onto HYV4Weights without copying any large tensor. docs/checkpoints.md states the
// rules; for the MTP layers they follow vLLM's HYV4MTP loader. What any family's loader does (checks of
// shapes, dtypes and FP8 block scales, the report) is in src/models/common; this file knows HY V4's names.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "models/common/binder.h"
#include "models/common/dequantize.h"
#include "models/common/name_rules.h"
#include "models/hy_v4/checkpoint_info.h"
#include "models/hy_v4/model.h"
#include "models/hy_v4/cuda_blocks.h"  // (the model owns CUDA blocks and collectives: complete types here)
#include "ops/cuda/cuda_collectives.h"
#include "models/hy_v4/sharding.h"
#include "ops/ops.h"

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

using names::contains;
using names::ends_with;
using names::split_indexed;
using names::starts_with;

// The name forms a checkpoint uses, gathered while its tensors are indexed (HYV4LoadReport's naming fields).
struct NameForms {
  bool hub = false, internal = false;                           // hub renames / transformers-internal names
  bool flat = false, nested = false, mtp_block = false;         // MTP layers as model.layers.{L+N} / mtp_layers.N
  bool fused_proj = false, alias_bias = false;                  // vLLM's stacked projections, expert_bias
  bool fused_experts = false, split_experts = false;            // [E, ...] tensors / experts.N.*
  std::set<int> mtp_found;                                      // MTP layer indices seen (either naming)
};

// HY V4's names on top of TensorBinder: tensors are known by canonical name (hub renames applied, MTP layers
// as model.mtp_layers.N), the MTP layers are checked against the draft's QuantScheme, and the report says
// which naming forms and expert layout the checkpoint uses.
class HYV4Binder : public TensorBinder {
 public:
  HYV4Binder(const HYV4Config& c, const WeightStore& store, const QuantPlan& plan, HYV4LoadReport& r)
      : TensorBinder(store, r), plan_(plan), hr_(r), L_(c.num_hidden_layers), n_mtp_(c.num_nextn_predict_layers) {
    // vLLM's HYV4MTP only recognizes flattened MTP names model.layers.{L+i} for i < max(n - 1, 1).
    flat_limit_ = std::max(n_mtp_ - 1, 1);
    // Exclusion-list entries, also with hub names made canonical.
    set_exclusions(plan.backbone, hy_v4_canonical_name);
    set_exclusions(plan.draft, hy_v4_canonical_name);
    NameForms forms;
    for (const std::string& raw : store.names()) index_name(raw, forms);
    describe(forms);
  }

  // Whether any tensor of decoder layer i is in the checkpoint.
  bool has_layer(int i) const { return has_prefix("model.layers." + std::to_string(i) + "."); }

  // The config's sizes against the tensors that show them directly (the embedding shows vocab_size and
  // hidden_size, a norm its width, ...), before any other check: a size config.json leaves out (transformers'
  // default) or gets wrong is one error naming the field, not a shape error per tensor that uses it.
  bool sizes_fit_tensors(const HYV4Config& c, const std::string& cfg_file) {
    const size_t before = r_.errors.size();
    // Axis `axis` of the rank-`rank` tensor `canon` should be scale * c.<field> + offset.
    auto witness = [&](const std::string& canon, size_t rank, size_t axis, const std::string& field, int64_t value,
                       int64_t scale = 1, int64_t offset = 0) {
      witness_size({cfg_file, field, value, c.is_defaulted(field)}, canon, rank, axis, scale, offset);
    };
    const int64_t H = c.hidden_size, nh = c.num_attention_heads;
    witness("model.embed_tokens.weight", 2, 0, "vocab_size", c.vocab_size);
    witness("model.embed_tokens.weight", 2, 1, "hidden_size", H);
    witness("model.norm.weight", 1, 0, "hidden_size", H);
    if (!c.tie_word_embeddings) witness("lm_head.weight", 2, 0, "vocab_size", c.vocab_size);
    const std::string a = "model.layers.0.self_attn.";
    witness(a + "sinks", 1, 0, "num_attention_heads", nh);
    if (c.q_lora_rank > 0) witness(a + "q_a_layernorm.weight", 1, 0, "q_lora_rank", c.q_lora_rank);
    witness(a + "kv_a_layernorm.weight", 1, 0, "kv_lora_rank", c.kv_lora_rank);
    witness(a + "kv_a_proj_with_mqa.weight", 2, 0, "qk_rope_head_dim", c.qk_rope_head_dim, 1, c.kv_lora_rank);
    witness(a + "gate_proj.weight", 2, 0, "v_head_dim", c.v_head_dim, nh);
    witness(a + "kv_b_proj.weight", 2, 0, "qk_nope_head_dim", c.qk_nope_head_dim, nh, nh * c.v_head_dim);
    witness(a + "indexer.k_norm.weight", 1, 0, "index_head_dim", c.index_head_dim);
    witness(a + "indexer.weights_proj.weight", 2, 0, "index_n_heads", c.index_n_heads);
    witness("model.layers.0.attn_hc.base", 1, 0, "hc_mult", c.hc_mult, 2);
    for (int i = 0; i < L_; ++i) {
      const std::string m = "model.layers." + std::to_string(i) + ".mlp.";
      if (!c.is_sparse_mlp(i)) {
        witness(m + "down_proj.weight", 2, 1, "intermediate_size", c.intermediate_size);
        continue;
      }
      witness(m + "gate.weight", 2, 0, "n_routed_experts", c.n_routed_experts);
      witness(m + "experts.down_proj", 3, 2, "moe_intermediate_size", c.moe_intermediate_size);
      witness(m + "experts.0.down_proj.weight", 2, 1, "moe_intermediate_size", c.moe_intermediate_size);
      witness(m + "shared_experts.down_proj.weight", 2, 1, "n_shared_experts", c.n_shared_experts,
              c.moe_intermediate_size);
    }
    layer_count_fits(c, cfg_file);
    return r_.errors.size() == before;
  }

  // Routed experts of the MoE at `p` ("...mlp."): fused [E, 2I, H] / [E, H, I] tensors or split per expert.
  void finish() {
    report_unused([&](const std::string& raw) -> std::string {
      if (!flat_out_of_range_.count(raw)) return "";
      return ": flattened MTP names are only recognized for model.layers." + std::to_string(L_) + ".." +
             std::to_string(L_ + flat_limit_ - 1) + ".* (as vLLM's HYV4MTP); name this layer model.mtp_layers.N.*";
    });
    if (!flat_out_of_range_.empty() && !r_.missing.empty())
      r_.notes.push_back("with num_nextn_predict_layers = " + std::to_string(n_mtp_) +
                         ", flattened MTP names model.layers.{" + std::to_string(L_) + "+i}.* are only recognized for i < " +
                         std::to_string(flat_limit_) + " (vLLM's HYV4MTP rule); store the other MTP layers as "
                         "model.mtp_layers.i.*");
    report_skipped_scales();
    if (mtp_ignored_ > 0)
      r_.infos.push_back("num_nextn_predict_layers is " + std::to_string(n_mtp_) + ": no MTP draft; " +
                         std::to_string(mtp_ignored_) + " MTP tensor(s) ignored");
  }

 protected:
  const QuantScheme& scheme_for(const std::string& canon) const override {
    return starts_with(canon, "model.mtp_layers.") ? plan_.draft : plan_.backbone;
  }

  // As TensorBinder's, and for MTP layers also the flattened model.layers.{L+i} form vLLM's draft uses (so
  // exclusion entries in either form apply).
  std::vector<std::string> modules_of(const std::string& canon_module, const std::string& raw_weight) const override {
    std::vector<std::string> m = TensorBinder::modules_of(canon_module, raw_weight);
    int idx = 0;
    std::string rest;
    if (split_indexed(canon_module, "model.mtp_layers.", &idx, &rest))
      m.push_back("model.layers." + std::to_string(L_ + idx) + "." + rest);
    return m;
  }

  // As TensorBinder's, plus the forms of routed experts' scales.
  std::vector<std::string> scale_names(const std::string& w) const override {
    std::vector<std::string> s = TensorBinder::scale_names(w);
    if (!contains(w, ".mlp.experts.")) return s;
    if (ends_with(w, ".weight")) {
      s.push_back(w.substr(0, w.size() - 7) + ".scale");  // the seed renames experts' ".scale" to ".weight_scale_inv"
      return s;
    }
    // fused expert tensors: the suffix follows the projection name
    for (const char* suffix : {".weight_scale_inv", ".weight_scale", ".scale"}) s.push_back(w + suffix);
    return s;
  }

 private:
  // Registers checkpoint tensor `raw` under its canonical name, noting its name form in `f`.
  void index_name(const std::string& raw, NameForms& f) {
    std::string canon = hy_v4_canonical_name(raw);
    if (canon != raw) f.hub = true;
    if (skip_activation_scale(raw, canon)) return;
    if (!map_mtp_name(raw, canon, f)) return;
    note_form(raw, canon, f);
    add(canon, raw);
  }

  // An MTP layer's tensor (model.mtp_layers.N.* or the flattened model.layers.{L+N}.*, either maybe with
  // vLLM's mtp_block.) renamed to model.mtp_layers.N.* in `canon`. False when the tensor is skipped: the
  // config has no MTP layers, or it is the layer's own copy of the shared embedding or head (the seed skips
  // them too).
  bool map_mtp_name(const std::string& raw, std::string& canon, NameForms& f) {
    int idx = 0;
    std::string rest;
    bool mtp = false;
    if (split_indexed(canon, "model.mtp_layers.", &idx, &rest)) {
      f.nested = true;
      f.mtp_found.insert(idx);
      if (n_mtp_ < 1) {
        ++mtp_ignored_;
        return false;
      }
      mtp = idx < n_mtp_;
    } else if (split_indexed(canon, "model.layers.", &idx, &rest) && idx >= L_) {
      f.flat = true;
      f.mtp_found.insert(idx - L_);
      if (n_mtp_ < 1) {
        ++mtp_ignored_;
        return false;
      }
      if (idx - L_ < flat_limit_) {
        mtp = true;
        idx -= L_;
      } else {
        flat_out_of_range_.insert(raw);
      }
    }
    if (!mtp) return true;
    if (starts_with(rest, "mtp_block.")) {
      rest = rest.substr(10);
      f.mtp_block = true;
    }
    if (starts_with(rest, "embed_tokens") || starts_with(rest, "shared_head")) return false;
    canon = "model.mtp_layers." + std::to_string(idx) + "." + rest;
    return true;
  }

  // The name forms tensor `canon` (checkpoint name `raw`) shows.
  static void note_form(const std::string& raw, const std::string& canon, NameForms& f) {
    if (canon == raw && (contains(canon, ".attn_hc.") || contains(canon, ".ffn_hc.") || ends_with(canon, ".sinks") ||
                         contains(canon, ".self_attn.gate_proj.") || contains(canon, "hc_head.hc_fn")))
      f.internal = true;
    if (contains(canon, ".fused_qkv_a_proj.") || contains(canon, ".wk_weights_proj.") ||
        contains(canon, ".mlp.gate_up_proj.") || contains(canon, ".shared_experts.gate_up_proj."))
      f.fused_proj = true;
    if (ends_with(canon, ".mlp.expert_bias") || ends_with(canon, ".gate.expert_bias")) f.alias_bias = true;
    if (contains(canon, ".experts.gate_up_proj") || contains(canon, ".experts.down_proj")) f.fused_experts = true;
    if (names::is_split_expert(canon)) f.split_experts = true;
  }

  // The report's naming fields from the forms seen.
  void describe(const NameForms& f) {
    if (f.hub) {
      hr_.name_forms.push_back("hub");
      hr_.name_features.push_back("hub names (linear_gate, learnable_sink_param, hc_pre.hc_*_layer, hc_head_*)");
    }
    if (f.internal) {
      hr_.name_forms.push_back("internal");
      hr_.name_features.push_back("transformers-internal names (self_attn.gate_proj, sinks, attn_hc / ffn_hc, hc_fn)");
    }
    if (f.flat || f.mtp_block || f.fused_proj || f.alias_bias) hr_.name_forms.push_back("vllm");
    if (f.flat) hr_.name_features.push_back("flattened MTP names model.layers.{L+N}.*");
    if (f.mtp_block) hr_.name_features.push_back("vLLM draft-module names model.layers.{L+N}.mtp_block.*");
    if (f.fused_proj) hr_.name_features.push_back("fused projections (gate_up_proj / fused_qkv_a_proj / wk_weights_proj)");
    if (f.alias_bias) hr_.name_features.push_back("router bias named expert_bias");
    hr_.mtp_naming = f.flat && f.nested ? "both" : f.flat ? "model.layers.{L+N}" : f.nested ? "model.mtp_layers.N" : "none";
    hr_.mtp_layers_found.assign(f.mtp_found.begin(), f.mtp_found.end());
    hr_.expert_layout = f.fused_experts && f.split_experts ? "both"
                        : f.fused_experts                  ? "fused"
                        : f.split_experts                  ? "split"
                                                           : "none";
  }

  // Layers that end before the last one (a default of 34 layers for a smaller checkpoint would list every
  // tensor of the layers it lacks); a checkpoint without any layer is a list of missing tensors instead.
  void layer_count_fits(const HYV4Config& c, const std::string& cfg_file) {
    int top = -1;
    for (int i = 0; i < L_; ++i)
      if (has_layer(i)) top = i;
    if (top < 0 || top >= L_ - 1) return;
    const std::string found = "its layers end at model.layers." + std::to_string(top) + ".*";
    if (c.is_defaulted("num_hidden_layers"))
      error(cfg_file + ": field 'num_hidden_layers' is missing, and transformers' default " + std::to_string(L_) +
            " does not fit the checkpoint: " + found);
    else
      error(cfg_file + ": field 'num_hidden_layers' is " + std::to_string(L_) + ", but the checkpoint has no "
            "model.layers." + std::to_string(L_ - 1) + ".* tensors: " + found);
  }

  const QuantPlan& plan_;
  HYV4LoadReport& hr_;
  const int L_, n_mtp_;
  int flat_limit_ = 1;
  int64_t mtp_ignored_ = 0;
  std::set<std::string> flat_out_of_range_;
};

void load_ffn(HYV4Binder& b, const HYV4Config& c, const std::string& p, bool sparse, FfnWeights& f) {
  const int64_t H = c.hidden_size;
  f.sparse = sparse;
  if (!sparse) {
    const int64_t I = c.intermediate_size;
    auto gu = b.stacked(p, "gate_up_proj", {{"gate_proj", I}, {"up_proj", I}}, H, Role::Quantized);
    f.gate_proj = gu[0];
    f.up_proj = gu[1];
    f.down_proj = b.linear(p + "down_proj", H, I, Role::Quantized);
    return;
  }
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
  f.router = b.linear(p + "gate", E, H, Role::Either);
  f.e_bias = b.vec_any({p + "gate.e_score_correction_bias", p + "gate.expert_bias", p + "expert_bias"}, E);
  if (c.n_shared_experts > 0) {
    const int64_t Is = I * c.n_shared_experts;
    f.has_shared = true;
    auto gu = b.stacked(p + "shared_experts.", "gate_up_proj", {{"gate_proj", Is}, {"up_proj", Is}}, H, Role::Quantized);
    f.gate_proj = gu[0];
    f.up_proj = gu[1];
    f.down_proj = b.linear(p + "shared_experts.down_proj", H, Is, Role::Quantized);
  }
  b.experts(p, E, I, H, f.expert_gate, f.expert_up, f.expert_down);
}

void load_attention(HYV4Binder& b, const HYV4Config& c, const std::string& p, bool own_indexer, AttentionWeights& a) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  std::vector<float>* qa_bias = c.attention_bias ? &a.q_a_bias : nullptr;
  std::vector<float>* kva_bias = c.attention_bias ? &a.kv_a_bias : nullptr;
  std::vector<float>* o_bias = c.attention_bias ? &a.o_bias : nullptr;
  auto qkv = b.stacked(p, "fused_qkv_a_proj",
                       {{"q_a_proj", c.q_lora_rank, qa_bias}, {"kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, kva_bias}},
                       H, Role::Quantized);
  a.q_a_proj = qkv[0];
  a.kv_a_proj = qkv[1];
  a.q_a_norm = b.vec(p + "q_a_layernorm.weight", c.q_lora_rank);
  a.q_b_proj = b.linear(p + "q_b_proj", nh * c.qk_head_dim, c.q_lora_rank, Role::Quantized);
  a.kv_a_norm = b.vec(p + "kv_a_layernorm.weight", c.kv_lora_rank);
  a.kv_b_proj = b.linear(p + "kv_b_proj", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, Role::Quantized);
  a.o_proj = b.linear(p + "o_proj", H, nh * c.v_head_dim, Role::Quantized, o_bias);
  a.gate_proj = b.linear(p + "gate_proj", nh * c.v_head_dim, H, Role::Quantized);
  a.sinks = b.vec(p + "sinks", nh);
  a.has_indexer = own_indexer;
  if (!own_indexer) return;
  const std::string ip = p + "indexer.";
  IndexerWeights& ix = a.indexer;
  ix.wq_b = b.linear(ip + "wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank, Role::Quantized);
  auto kw = b.stacked(ip, "wk_weights_proj", {{"wk", c.index_head_dim}, {"weights_proj", c.index_n_heads}}, H,
                      Role::Either);
  ix.wk = kw[0];
  ix.weights_proj = kw[1];
  ix.k_norm_w = b.vec(ip + "k_norm.weight", c.index_head_dim);
  ix.k_norm_b = b.vec(ip + "k_norm.bias", c.index_head_dim);
  // An FP8 wk is dequantized once (vLLM keeps the indexer's key projection unquantized).
  if (ix.wk.dtype == DType::F8_E4M3 && ix.wk.data && ix.wk.scale) {
    NonFiniteCount bad;
    ix.wk_dequant = std::make_shared<std::vector<uint8_t>>();
    ix.wk = dequantized(ix.wk, *ix.wk_dequant, bad);
    if (bad.count > 0) {  // the copy is made anyway: its NaN / inf (from a weight or a scale) cost nothing to find
      const TensorView* t = b.peek(ip + "wk.weight");
      b.error("FP8 tensor '" + (t ? t->name : ip + "wk.weight") + "' dequantizes to " + std::to_string(bad.count) +
              " non-finite value(s) (NaN or inf in its weights or block scales), the first at index " +
              std::to_string(bad.first));
    }
  }
}


}  // namespace

// ---------------------------------------------------------------------------------------------------
// Quantization plan

namespace {

// mtp_quant_algo FP8: the draft's block-wise FP8 scheme built from quantization_config, as vLLM's
// _create_mtp_quant_config builds its Fp8Config.
QuantScheme draft_fp8_scheme(const QuantConfig& qc, LoadReport& r) {
  QuantScheme d;
  const nlohmann::json& raw = qc.raw;
  if (!qc.present || qc.weight_block_size.size() != 2) {
    r.errors.push_back("config.json: mtp_quant_algo FP8 needs quantization_config.weight_block_size [block_out, "
                       "block_in] (per-tensor FP8 is not supported)");
    return d;
  }
  d.fp8 = true;
  d.block_out = qc.weight_block_size[0];
  d.block_in = qc.weight_block_size[1];
  d.ue8m0 = raw.contains("scale_fmt") && raw["scale_fmt"].is_string() && raw["scale_fmt"] == "ue8m0";
  // vLLM builds the draft's Fp8Config from ignored_layers, else modules_to_not_convert (not exclude_modules).
  for (const char* key : {"ignored_layers", "modules_to_not_convert"}) {
    if (!raw.contains(key) || !raw[key].is_array() || raw[key].empty()) continue;
    for (const auto& v : raw[key])
      if (v.is_string()) d.ignored.push_back(v.get<std::string>());
    break;
  }
  d.source = "mtp_quant_algo FP8 (block " + list_string(qc.weight_block_size) + ")";
  return d;
}

// The draft's scheme: mtp_quant_algo, as vLLM's _create_mtp_quant_config resolves it.
void resolve_draft_scheme(const HYV4Config& c, QuantPlan& plan, LoadReport& r) {
  const QuantScheme& bb = plan.backbone;
  const std::string algo = names::to_upper(c.mtp_quant_algo);
  if (c.num_nextn_predict_layers < 1) {
    plan.draft = bb;
    plan.draft_resolution = "no MTP layers (num_nextn_predict_layers = " + std::to_string(c.num_nextn_predict_layers) + ")";
  } else if (algo.empty() || algo == "NONE") {
    plan.draft = bb;
    plan.draft_resolution = std::string("mtp_quant_algo ") + (algo.empty() ? "absent" : "NONE") +
                            ": the draft uses the backbone's quantization (" + (bb.fp8 ? "fp8" : "none") + ")";
  } else if (algo == "BF16" || algo == "FP16") {
    plan.draft.source = "mtp_quant_algo is " + c.mtp_quant_algo + " (the MTP layers are unquantized)";
    plan.draft_resolution = "mtp_quant_algo " + c.mtp_quant_algo + ": the draft is unquantized";
  } else if (algo == "FP8") {
    plan.draft = draft_fp8_scheme(c.quant, r);
    plan.draft_resolution = "mtp_quant_algo FP8: the draft is block-wise FP8 built from quantization_config";
  } else {
    r.warnings.push_back("unknown mtp_quant_algo '" + c.mtp_quant_algo + "': the draft uses the backbone's quantization");
    plan.draft = bb;
    plan.draft_resolution = "mtp_quant_algo " + c.mtp_quant_algo + " (unknown): the draft uses the backbone's quantization";
  }
}

}  // namespace

QuantPlan resolve_quant_plan(const HYV4Config& c, LoadReport& r) {
  QuantPlan plan;
  plan.backbone = resolve_fp8_scheme(c.quant, r);
  resolve_draft_scheme(c, plan, r);
  return plan;
}

// ---------------------------------------------------------------------------------------------------
// Binding

void bind_hy_v4_weights(const HYV4Config& c, const WeightStore& store, HYV4Weights& w, HYV4LoadReport& r) {
  const std::string cfg_file = store.dir() + "/config.json";
  for (const std::string& warning : c.warnings) r.warnings.push_back(cfg_file + ": " + warning);
  if (c.q_lora_rank <= 0)
    r.errors.push_back(cfg_file + ": q_lora_rank must be set (HY V4 attention always uses the q LoRA path)");
  if (c.hidden_act != "silu")
    r.errors.push_back(cfg_file + ": hidden_act '" + c.hidden_act + "' is not supported (only silu)");
  if (c.qk_rope_head_dim > c.index_head_dim)
    r.errors.push_back(cfg_file + ": qk_rope_head_dim exceeds index_head_dim");
  if (!r.errors.empty()) return;
  const QuantPlan plan = resolve_quant_plan(c, r);
  if (!r.errors.empty()) return;

  const int64_t H = c.hidden_size, V = c.vocab_size, C = c.hc_mult;
  HYV4Binder b(c, store, plan, r);
  if (!b.sizes_fit_tensors(c, cfg_file)) return;

  w.embed = b.named_linear("model.embed_tokens.weight", "model.embed_tokens", V, H, Role::Either);
  w.layers.assign(c.num_hidden_layers, DecoderLayerWeights{});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    DecoderLayerWeights& L = w.layers[i];
    L.attn_hc.fn = b.named_linear(p + "attn_hc.fn", p + "attn_hc.fn", 2 * C, C * H, Role::Either);
    L.attn_hc.base = b.vec(p + "attn_hc.base", 2 * C);
    L.attn_hc.scale = b.vec(p + "attn_hc.scale", 2);
    L.ffn_hc.fn = b.named_linear(p + "ffn_hc.fn", p + "ffn_hc.fn", 2 * C, C * H, Role::Either);
    L.ffn_hc.base = b.vec(p + "ffn_hc.base", 2 * C);
    L.ffn_hc.scale = b.vec(p + "ffn_hc.scale", 2);
    L.input_norm = b.vec(p + "input_layernorm.weight", H);
    L.post_attn_norm = b.vec(p + "post_attention_layernorm.weight", H);
    load_attention(b, c, p + "self_attn.", c.has_own_indexer(i), L.attn);
    load_ffn(b, c, p + "mlp.", c.is_sparse_mlp(i), L.ffn);
  }
  w.hc_head_fn = b.named_linear("model.hc_head.hc_fn", "model.hc_head.hc_fn", C, C * H, Role::Either);
  w.hc_head_base = b.vec("model.hc_head.hc_base", C);
  w.hc_head_scale = b.vec("model.hc_head.hc_scale", 1);
  w.final_norm = b.vec("model.norm.weight", H);
  if (c.tie_word_embeddings) {
    // transformers ties the head to the embedding and never reads a stored lm_head.weight (docs/checkpoints.md).
    w.lm_head = w.embed;
    if (const TensorView* t = b.take_unread("lm_head.weight"))
      r.warnings.push_back("tie_word_embeddings is true: tensor '" + t->name + "' in " + store.file_of(t->name) +
                           " is not used (the lm_head is model.embed_tokens.weight, as transformers ties them)");
  } else {
    w.lm_head = b.named_linear("lm_head.weight", "lm_head", V, H, Role::Either);
  }

  // MTP draft layers, canonically model.mtp_layers.N.* (the flattened model.layers.{L+N}.* form is mapped there).
  const int n_mtp = std::max(c.num_nextn_predict_layers, 0);
  w.mtp.assign(n_mtp, MtpLayerWeights{});
  for (int i = 0; i < n_mtp; ++i) {
    const std::string p = "model.mtp_layers." + std::to_string(i) + ".";
    MtpLayerWeights& m = w.mtp[i];
    m.enorm = b.vec(p + "enorm.weight", H);
    m.hnorm = b.vec(p + "hnorm.weight", H);
    m.final_norm = b.vec(p + "final_layernorm.weight", H);
    m.eh_proj = b.linear(p + "eh_proj", H, 2 * H, Role::Either);
    m.block.input_norm = b.vec(p + "input_layernorm.weight", H);
    m.block.post_attn_norm = b.vec(p + "post_attention_layernorm.weight", H);
    // The draft block always has its own indexer; its MLP type extends mlp_layer_types with the last entry.
    load_attention(b, c, p + "self_attn.", true, m.block.attn);
    const bool sparse = c.mlp_layer_types.empty() ? true : c.mlp_layer_types.back() == "sparse";
    load_ffn(b, c, p + "mlp.", sparse, m.block.ffn);
  }
  b.finish();
}

// ---------------------------------------------------------------------------------------------------
// Loading

HYV4Model::HYV4Model(const std::string& model_dir, ThreadPool* pool)
    : dir_(model_dir), cfg_(load_hy_v4_config(model_dir)), store_(WeightStore::open_dir(model_dir)),
      cpu_blocks_(std::make_unique<HYV4CpuBlocks>(cfg_, pool)), blocks_(cpu_blocks_.get()) {
  HYV4LoadReport r;
  bind_hy_v4_weights(cfg_, store_, w_, r);
  r.print_or_throw(model_dir);
  init_facts();
}

}  // namespace nextn
