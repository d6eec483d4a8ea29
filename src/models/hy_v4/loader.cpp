// Loading HY V4 checkpoints: hub / internal / vLLM tensor names, split or fused layouts and block-wise FP8
// quantization, mapped onto HYV4Weights without copying any large tensor. docs/checkpoints.md states the
// rules; for the MTP layers they follow vLLM's HYV4MTP loader.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "core/error.h"
#include "models/hy_v4/checkpoint_info.h"
#include "models/hy_v4/model.h"
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

std::string LoadReport::error_message(const std::string& dir) const {
  std::string msg;
  if (!missing.empty()) {
    msg += "checkpoint " + dir + " lacks " + std::to_string(missing.size()) + " tensor(s) the model needs:";
    for (size_t i = 0; i < missing.size() && i < 40; ++i) msg += "\n  " + missing[i];
    if (missing.size() > 40) msg += "\n  ... (" + std::to_string(missing.size() - 40) + " more)";
  }
  for (size_t i = 0; i < errors.size() && i < 40; ++i) {
    if (!msg.empty()) msg += '\n';
    msg += errors[i];
  }
  if (errors.size() > 40) msg += "\n... (" + std::to_string(errors.size() - 40) + " more errors)";
  for (const auto& n : notes) {
    if (!msg.empty()) msg += '\n';
    msg += "note: ";
    msg += n;
  }
  return msg;
}

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}
std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// "HEAD<digits>.REST" -> index and REST (false for anything else).
bool split_indexed(const std::string& name, std::string_view head, int* index, std::string* rest) {
  if (!starts_with(name, head)) return false;
  size_t i = head.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j - i > 9 || j + 1 >= name.size() || name[j] != '.') return false;
  *index = std::stoi(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

// An exclusion-list entry against a module name: a trailing `*` makes it a plain string prefix;
// otherwise it names the module itself or one of its parents (whole dotted components).
bool module_matches(const std::string& pattern, const std::string& module) {
  size_t n = pattern.size();
  while (n > 0 && pattern[n - 1] == '*') --n;
  const std::string_view p(pattern.data(), n);
  if (n < pattern.size()) return starts_with(module, p);
  return module == p || (module.size() > n && starts_with(module, p) && module[n] == '.');
}

// vLLM's maybe_remap_kv_scale_name: where a KV-cache scale would go ("" if `name` is not one).
std::string remap_kv_scale_name(const std::string& name) {
  if (ends_with(name, ".kv_scale")) return name.substr(0, name.size() - 9) + ".attn.k_scale";
  for (const char* kv : {"k", "v"}) {
    const std::string suffix = std::string(".") + kv + "_scale";
    if (!ends_with(name, suffix)) continue;
    const std::string modelopt = std::string(".self_attn.") + kv + "_proj" + suffix;
    if (ends_with(name, modelopt)) return name.substr(0, name.size() - modelopt.size()) + ".self_attn.attn" + suffix;
    return name.substr(0, name.size() - suffix.size()) + ".attn" + suffix;
  }
  return "";
}

// "...experts.<digits>.*": one expert of the split layout.
bool is_split_expert(const std::string& n) {
  const size_t at = n.find(".experts.");
  if (at == std::string::npos) return false;
  size_t i = at + 9, j = i;
  while (j < n.size() && std::isdigit(static_cast<unsigned char>(n[j]))) ++j;
  return j > i && j < n.size() && n[j] == '.';
}

// Under an FP8 scheme, Quantized modules must arrive FP8 unless excluded; Either modules may be FP8 (with a
// block scale) or not. Excluded modules must never be FP8.
enum class Role { Quantized, Either };

// What the quantization check of one weight tensor found.
struct Quant {
  bool ok = true;
  bool fp8 = false;
  const void* scale = nullptr;
  DType scale_dtype = DType::F32;
  int64_t block_out = 0, block_in = 0;
};

struct Part {
  const char* name;
  int64_t rows;
  std::vector<float>* bias = nullptr;
};

// Resolves the tensors the model needs by canonical name (hub renames applied, MTP layers as
// model.mtp_layers.N), checks shapes, dtypes and quantization, and records every problem in the report.
class Binder {
 public:
  Binder(const HYV4Config& c, const WeightStore& store, const QuantPlan& plan, LoadReport& r)
      : store_(store), plan_(plan), r_(r), L_(c.num_hidden_layers), n_mtp_(c.num_nextn_predict_layers) {
    // vLLM's HYV4MTP only recognizes flattened MTP names model.layers.{L+i} for i < max(n - 1, 1).
    flat_limit_ = std::max(n_mtp_ - 1, 1);
    // Exclusion-list entries, also with hub names made canonical.
    for (const std::string& pat : plan.backbone.ignored) backbone_patterns_.emplace_back(pat, hy_v4_canonical_name(pat));
    for (const std::string& pat : plan.draft.ignored) draft_patterns_.emplace_back(pat, hy_v4_canonical_name(pat));
    bool hub = false, internal = false, flat = false, nested = false, mtp_block = false, fused_proj = false;
    bool alias_bias = false, fused_experts = false, split_experts = false;
    std::set<int> found;
    for (const std::string& raw : store.names()) {
      std::string canon = hy_v4_canonical_name(raw);
      if (canon != raw) hub = true;
      if (const std::string kv = remap_kv_scale_name(canon); !kv.empty()) {
        kv_scales_.emplace_back(raw, kv);
        continue;
      }
      if (ends_with(canon, ".input_scale")) {
        ++input_scales_;
        continue;
      }
      int idx = 0;
      std::string rest;
      bool mtp = false;
      if (split_indexed(canon, "model.mtp_layers.", &idx, &rest)) {
        nested = true;
        found.insert(idx);
        if (n_mtp_ < 1) {
          ++mtp_ignored_;
          continue;
        }
        mtp = idx < n_mtp_;
      } else if (split_indexed(canon, "model.layers.", &idx, &rest) && idx >= L_) {
        flat = true;
        found.insert(idx - L_);
        if (n_mtp_ < 1) {
          ++mtp_ignored_;
          continue;
        }
        if (idx - L_ < flat_limit_) {
          mtp = true;
          idx -= L_;
        } else {
          flat_out_of_range_.insert(raw);
        }
      }
      if (mtp) {
        if (starts_with(rest, "mtp_block.")) {
          rest = rest.substr(10);
          mtp_block = true;
        }
        // The MTP layer's own copies of the shared embedding and head are skipped on purpose (the seed does).
        if (starts_with(rest, "embed_tokens") || starts_with(rest, "shared_head")) continue;
        canon = "model.mtp_layers." + std::to_string(idx) + "." + rest;
      }
      if (canon == raw && (contains(canon, ".attn_hc.") || contains(canon, ".ffn_hc.") || ends_with(canon, ".sinks") ||
                           contains(canon, ".self_attn.gate_proj.") || contains(canon, "hc_head.hc_fn")))
        internal = true;
      if (contains(canon, ".fused_qkv_a_proj.") || contains(canon, ".wk_weights_proj.") ||
          contains(canon, ".mlp.gate_up_proj.") || contains(canon, ".shared_experts.gate_up_proj."))
        fused_proj = true;
      if (ends_with(canon, ".mlp.expert_bias") || ends_with(canon, ".gate.expert_bias")) alias_bias = true;
      if (contains(canon, ".experts.gate_up_proj") || contains(canon, ".experts.down_proj")) fused_experts = true;
      if (is_split_expert(canon)) split_experts = true;
      auto [it, fresh] = canon_.emplace(canon, raw);
      if (!fresh)
        r_.errors.push_back("tensors '" + it->second + "' and '" + raw + "' both map to '" + canon + "'");
    }
    if (hub) {
      r_.name_forms.push_back("hub");
      r_.name_features.push_back("hub names (linear_gate, learnable_sink_param, hc_pre.hc_*_layer, hc_head_*)");
    }
    if (internal) {
      r_.name_forms.push_back("internal");
      r_.name_features.push_back("transformers-internal names (self_attn.gate_proj, sinks, attn_hc / ffn_hc, hc_fn)");
    }
    if (flat || mtp_block || fused_proj || alias_bias) r_.name_forms.push_back("vllm");
    if (flat) r_.name_features.push_back("flattened MTP names model.layers.{L+N}.*");
    if (mtp_block) r_.name_features.push_back("vLLM draft-module names model.layers.{L+N}.mtp_block.*");
    if (fused_proj) r_.name_features.push_back("fused projections (gate_up_proj / fused_qkv_a_proj / wk_weights_proj)");
    if (alias_bias) r_.name_features.push_back("router bias named expert_bias");
    r_.mtp_naming = flat && nested ? "both" : flat ? "model.layers.{L+N}" : nested ? "model.mtp_layers.N" : "none";
    r_.mtp_layers_found.assign(found.begin(), found.end());
    r_.expert_layout = fused_experts && split_experts ? "both" : fused_experts ? "fused" : split_experts ? "split" : "none";
  }

  bool has(const std::string& canon) const { return canon_.count(canon) != 0; }

  // The tensor with this canonical name, not marked as used, or nullptr.
  const TensorView* peek(const std::string& canon) const {
    auto it = canon_.find(canon);
    return it == canon_.end() ? nullptr : store_.find(it->second);
  }

  // Whether any tensor of decoder layer i is in the checkpoint.
  bool has_layer(int i) const {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    auto it = canon_.lower_bound(prefix);
    return it != canon_.end() && starts_with(it->first, prefix);
  }

  // The tensor with this canonical name (marked as used), or nullptr.
  const TensorView* take(const std::string& canon) {
    auto it = canon_.find(canon);
    if (it == canon_.end()) return nullptr;
    used_.insert(it->first);
    return store_.find(it->second);
  }

  void missing(const std::string& name) { r_.missing.push_back(name); }
  void error(const std::string& e) { r_.errors.push_back(e); }

  // Shape and dtype of a tensor the model reads.
  bool check(const TensorView* t, const std::vector<int64_t>& shape, bool allow_fp8) {
    if (t->shape != shape) {
      error("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": expected shape " + list_string(shape) +
            ", found " + list_string(t->shape));
      return false;
    }
    const bool ok = t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16 ||
                    (allow_fp8 && t->dtype == DType::F8_E4M3);
    if (!ok) {
      error("tensor '" + t->name + "' in " + store_.file_of(t->name) + ": expected dtype F32, BF16, F16" +
            (allow_fp8 ? " or F8_E4M3" : "") + ", found " + dtype_name(t->dtype));
      return false;
    }
    return true;
  }

  std::vector<float> vec(const std::string& name, int64_t n) { return vec_any({name}, n); }

  // A 1-D tensor known under several names (aliases); exactly one may be present. Copied to f32 only once its
  // shape is the checkpoint's (a size from config.json allocates nothing the file does not hold), and checked
  // for NaN / inf (norms, sinks, gates and biases are small: the copy reads them anyway). Empty on any problem.
  std::vector<float> vec_any(const std::vector<std::string>& names, int64_t n) {
    std::vector<float> out;
    std::vector<const TensorView*> found;
    for (const auto& nm : names)
      if (const TensorView* t = take(nm)) found.push_back(t);
    if (found.empty()) {
      std::string m = names[0];
      for (size_t i = 1; i < names.size(); ++i) {
        m += i == 1 ? " (or " : ", ";
        m += names[i];
      }
      if (names.size() > 1) m += ")";
      missing(m);
      return out;
    }
    if (found.size() > 1) {
      error("tensors '" + found[0]->name + "' and '" + found[1]->name + "' name the same parameter");
      return out;
    }
    if (!check(found[0], {n}, false)) return out;
    out.resize(static_cast<size_t>(n));
    convert_to_f32(found[0]->dtype, found[0]->data, out.data(), n);
    if (!finite_values(found[0], out.data(), n)) out.clear();
    return out;
  }

  // False (with an error naming the tensor) when a value copied out of tensor t is NaN or infinite.
  bool finite_values(const TensorView* t, const float* v, int64_t n) {
    const NonFiniteCount bad = count_non_finite(v, n);
    if (bad.count == 0) return true;
    error("tensor '" + t->name + "' in " + store_.file_of(t->name) + " has " + std::to_string(bad.count) +
          " non-finite value(s) (NaN or inf), the first at index " + std::to_string(bad.first));
    return false;
  }

  // A stored tensor the model does not read (a tied head's copy): marked as used with its block scale, so
  // that it is not reported as unknown. Returns it, or nullptr when absent.
  const TensorView* take_unread(const std::string& wname) {
    const TensorView* t = take(wname);
    if (t)
      for (const std::string& sn : scale_names(wname)) take(sn);
    return t;
  }

  // The config's sizes against the tensors that show them directly (the embedding shows vocab_size and
  // hidden_size, a norm its width, ...), before any other check: a size config.json leaves out (transformers'
  // default) or gets wrong is one error naming the field, not a shape error per tensor that uses it.
  bool sizes_fit_tensors(const HYV4Config& c, const std::string& cfg_file) {
    const size_t before = r_.errors.size();
    std::set<std::string> reported;
    // Axis `axis` of the rank-`rank` tensor `canon` should be scale * c.<field> + offset.
    auto witness = [&](const std::string& canon, size_t rank, size_t axis, const std::string& field, int64_t value,
                       int64_t scale = 1, int64_t offset = 0) {
      const TensorView* t = peek(canon);
      if (!t || t->shape.size() != rank || reported.count(field)) return;
      const int64_t found = t->shape[axis];
      if (found == scale * value + offset) return;
      reported.insert(field);
      const bool implied = found > offset && (found - offset) % scale == 0;
      const std::string shown = "tensor '" + t->name + "' " + list_string(t->shape) + " in " + store_.file_of(t->name);
      const std::string fits = implied ? " (" + field + " = " + std::to_string((found - offset) / scale) + ")" : "";
      if (c.is_defaulted(field))
        error(cfg_file + ": field '" + field + "' is missing, and transformers' default " + std::to_string(value) +
              " does not fit " + shown + fits);
      else
        error(cfg_file + ": field '" + field + "' is " + std::to_string(value) + ", which does not fit " + shown + fits);
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
    // Layers that end before the last one (a default of 34 layers for a smaller checkpoint would list every
    // tensor of the layers it lacks); a checkpoint without any layer is a list of missing tensors instead.
    int top = -1;
    for (int i = 0; i < L_; ++i)
      if (has_layer(i)) top = i;
    if (top >= 0 && top < L_ - 1) {
      const std::string found = "its layers end at model.layers." + std::to_string(top) + ".*";
      if (c.is_defaulted("num_hidden_layers"))
        error(cfg_file + ": field 'num_hidden_layers' is missing, and transformers' default " + std::to_string(L_) +
              " does not fit the checkpoint: " + found);
      else
        error(cfg_file + ": field 'num_hidden_layers' is " + std::to_string(L_) + ", but the checkpoint has no "
              "model.layers." + std::to_string(L_ - 1) + ".* tensors: " + found);
    }
    return r_.errors.size() == before;
  }

  // `prefix`.weight of shape [out, in] (+ FP8 block scale, + `prefix`.bias when asked).
  Linear linear(const std::string& prefix, int64_t out, int64_t in, Role role, std::vector<float>* bias = nullptr) {
    Linear l = named_linear(prefix + ".weight", prefix, out, in, role);
    if (bias) {
      *bias = vec(prefix + ".bias", out);
      l.bias = bias->data();
    }
    return l;
  }

  // A weight stored under its full name (bare HC tensors "<prefix>.fn", embeddings).
  Linear named_linear(const std::string& wname, const std::string& module, int64_t out, int64_t in, Role role) {
    const TensorView* t = take(wname);
    if (!t) {
      missing(wname);
      return {};
    }
    if (!check(t, {out, in}, true)) return {};
    const QuantScheme& q = scheme_for(wname);
    Quant qt = quant(t, q, ignored_by(modules_of(module, t->name), q), role, scale_names(wname), {}, out, in);
    return qt.ok ? make_linear(t, qt, out, in, 0, 0) : Linear{};
  }

  // Linears stored either separately (`p`<part>.weight) or as one tensor `p``fused`.weight whose rows are the
  // parts in order (vLLM's stacked parameters); the fused form is viewed with Linear::rows().
  std::vector<Linear> stacked(const std::string& p, const std::string& fused, const std::vector<Part>& parts,
                              int64_t in, Role role) {
    std::vector<Linear> out(parts.size());
    const std::string fw = p + fused + ".weight";
    if (!has(fw)) {
      for (size_t i = 0; i < parts.size(); ++i) out[i] = linear(p + parts[i].name, parts[i].rows, in, role, parts[i].bias);
      return out;
    }
    const TensorView* t = take(fw);
    std::vector<std::string> separate;
    for (const Part& part : parts)
      if (const TensorView* s = take(p + part.name + ".weight")) separate.push_back(s->name);
    if (!separate.empty()) {
      error("checkpoint has both the fused tensor '" + t->name + "' and its part '" + separate[0] + "'");
      return out;
    }
    int64_t total = 0;
    for (const Part& part : parts) total += part.rows;
    if (!check(t, {total, in}, true)) return out;
    // Exclusion lists may name the fused module or its parts (all of them: a tensor is quantized as a whole).
    const QuantScheme& q = scheme_for(fw);
    std::string by = ignored_by(modules_of(p + fused, t->name), q);
    if (by.empty()) {
      const std::string tail = fused + ".weight";
      const std::string raw_prefix =
          ends_with(t->name, tail) ? t->name.substr(0, t->name.size() - tail.size()) : p;
      std::vector<std::string> hits;
      for (const Part& part : parts)
        if (std::string h = ignored_by(modules_of(p + part.name, raw_prefix + part.name + ".weight"), q); !h.empty())
          hits.push_back(h);
      if (hits.size() == parts.size()) {
        by = hits[0];
      } else if (!hits.empty()) {
        error("tensor '" + t->name + "' fuses " + std::to_string(parts.size()) + " modules but the exclusion list ('" +
              hits[0] + "') names only some of them; a fused tensor is quantized as a whole");
        return out;
      }
    }
    Quant qt = quant(t, q, by, role, scale_names(fw), {}, total, in);
    if (!qt.ok) return out;
    const Linear whole = make_linear(t, qt, total, in, 0, 0);
    int64_t r0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      // Linear::rows handles a part that starts inside a scale block (the scale row is shared).
      out[i] = whole.rows(r0, parts[i].rows);
      r0 += parts[i].rows;
    }
    bool want_bias = false;
    for (const Part& part : parts) want_bias |= part.bias != nullptr;
    if (want_bias) {
      const std::vector<float> fb = vec(p + fused + ".bias", total);
      if (fb.size() != static_cast<size_t>(total)) return out;  // (the problem is in the report)
      int64_t off = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].bias) {
          parts[i].bias->assign(fb.begin() + off, fb.begin() + off + parts[i].rows);
          out[i].bias = parts[i].bias->data();
        }
        off += parts[i].rows;
      }
    }
    return out;
  }

  // Routed experts of the MoE at `p` ("...mlp."): fused [E, 2I, H] / [E, H, I] tensors or split per expert.
  void experts(const std::string& p, int64_t E, int64_t I, int64_t H, FfnWeights& f) {
    f.expert_gate.assign(E, Linear{});
    f.expert_up.assign(E, Linear{});
    f.expert_down.assign(E, Linear{});
    auto ep = [&](int64_t e) { return p + "experts." + std::to_string(e) + "."; };
    const std::string fgu = p + "experts.gate_up_proj", fdn = p + "experts.down_proj";
    bool split_gu = false, split_dn = false;
    for (int64_t e = 0; e < E; ++e) {
      split_gu |= has(ep(e) + "gate_proj.weight") || has(ep(e) + "up_proj.weight") || has(ep(e) + "gate_up_proj.weight");
      split_dn |= has(ep(e) + "down_proj.weight");
    }
    const std::string split_hint = p + "experts.{0.." + std::to_string(E - 1) + "}.";
    // gate / up
    if (has(fgu) && split_gu) {
      error("checkpoint has both fused '" + raw_of(fgu) + "' and split " + split_hint + "gate_proj/up_proj tensors");
      take(fgu);
    } else if (has(fgu)) {
      const TensorView* t = take(fgu);
      if (check(t, {E, 2 * I, H}, true)) {
        const QuantScheme& q = scheme_for(fgu);
        const Quant qt = quant(t, q, ignored_by(modules_of(fgu, t->name), q), Role::Quantized, scale_names(fgu), {E},
                               2 * I, H);
        if (qt.ok) {  // `up` may start inside a scale block when I % block != 0: Linear::rows handles it
          const int64_t srows = qt.fp8 ? ceil_div(2 * I, qt.block_out) * ceil_div(H, qt.block_in) : 0;
          for (int64_t e = 0; e < E; ++e) {
            const Linear gu = make_linear(t, qt, 2 * I, H, e * 2 * I * H, e * srows);
            f.expert_gate[e] = gu.rows(0, I);
            f.expert_up[e] = gu.rows(I, I);
          }
        }
      }
    } else if (split_gu) {
      for (int64_t e = 0; e < E; ++e) {
        auto v = stacked(ep(e), "gate_up_proj", {{"gate_proj", I}, {"up_proj", I}}, H, Role::Quantized);
        f.expert_gate[e] = v[0];
        f.expert_up[e] = v[1];
      }
    } else {
      missing(fgu + " (or split " + split_hint + "gate_proj.weight / up_proj.weight)");
    }
    // down
    if (has(fdn) && split_dn) {
      error("checkpoint has both fused '" + raw_of(fdn) + "' and split " + split_hint + "down_proj tensors");
      take(fdn);
    } else if (has(fdn)) {
      const TensorView* t = take(fdn);
      if (check(t, {E, H, I}, true)) {
        const QuantScheme& q = scheme_for(fdn);
        const Quant qt = quant(t, q, ignored_by(modules_of(fdn, t->name), q), Role::Quantized, scale_names(fdn), {E}, H, I);
        if (qt.ok) {
          const int64_t srows = qt.fp8 ? ceil_div(H, qt.block_out) * ceil_div(I, qt.block_in) : 0;
          for (int64_t e = 0; e < E; ++e) f.expert_down[e] = make_linear(t, qt, H, I, e * H * I, e * srows);
        }
      }
    } else if (split_dn) {
      for (int64_t e = 0; e < E; ++e) f.expert_down[e] = linear(ep(e) + "down_proj", H, I, Role::Quantized);
    } else {
      missing(fdn + " (or split " + split_hint + "down_proj.weight)");
    }
  }

  // Warnings for checkpoint tensors nothing used, infos for the tensors skipped on purpose.
  void finish() {
    for (const auto& [canon, raw] : canon_) {
      if (used_.count(canon)) continue;
      std::string w = "unknown checkpoint tensor '" + raw + "' (skipped)";
      if (flat_out_of_range_.count(raw))
        w += ": flattened MTP names are only recognized for model.layers." + std::to_string(L_) + ".." +
             std::to_string(L_ + flat_limit_ - 1) + ".* (as vLLM's HYV4MTP); name this layer model.mtp_layers.N.*";
      r_.warnings.push_back(w);
    }
    if (!flat_out_of_range_.empty() && !r_.missing.empty())
      r_.notes.push_back("with num_nextn_predict_layers = " + std::to_string(n_mtp_) +
                         ", flattened MTP names model.layers.{" + std::to_string(L_) + "+i}.* are only recognized for i < " +
                         std::to_string(flat_limit_) + " (vLLM's HYV4MTP rule); store the other MTP layers as "
                         "model.mtp_layers.i.*");
    if (!kv_scales_.empty())
      r_.infos.push_back("ignoring " + std::to_string(kv_scales_.size()) + " KV-cache scale tensor(s) (e.g. '" +
                         kv_scales_[0].first + "' -> '" + kv_scales_[0].second +
                         "'): nextn does not quantize the KV cache");
    if (input_scales_ > 0)
      r_.infos.push_back("ignoring " + std::to_string(input_scales_) +
                         " activation scale tensor(s) (input_scale): FP8 compute is weight-only");
    if (mtp_ignored_ > 0)
      r_.infos.push_back("num_nextn_predict_layers is " + std::to_string(n_mtp_) + ": no MTP draft; " +
                         std::to_string(mtp_ignored_) + " MTP tensor(s) ignored");
  }

 private:
  const QuantScheme& scheme_for(const std::string& canon) const {
    return starts_with(canon, "model.mtp_layers.") ? plan_.draft : plan_.backbone;
  }

  std::string raw_of(const std::string& canon) const {
    auto it = canon_.find(canon);
    return it == canon_.end() ? canon : it->second;
  }

  // Names a module is known by in exclusion lists: canonical, as in the checkpoint, and for MTP layers the
  // flattened model.layers.{L+i} form vLLM's draft uses (so entries in either form apply).
  std::vector<std::string> modules_of(const std::string& canon_module, const std::string& raw_weight) const {
    std::vector<std::string> m = {canon_module};
    std::string raw = raw_weight;
    if (ends_with(raw, ".weight")) raw.resize(raw.size() - 7);
    if (raw != canon_module) m.push_back(raw);
    int idx = 0;
    std::string rest;
    if (split_indexed(canon_module, "model.mtp_layers.", &idx, &rest)) {
      m.push_back("model.layers." + std::to_string(L_ + idx) + "." + rest);
    }
    return m;
  }

  // The exclusion-list entry that names one of `modules`, or "".
  std::string ignored_by(const std::vector<std::string>& modules, const QuantScheme& q) const {
    const auto& patterns = &q == &plan_.draft ? draft_patterns_ : backbone_patterns_;
    for (const auto& [pat, canon_pat] : patterns)
      for (const std::string& m : modules)
        if (module_matches(pat, m) || module_matches(canon_pat, m)) return pat;
    return "";
  }

  // Candidate names of the block scale of weight `w` (canonical).
  static std::vector<std::string> scale_names(const std::string& w) {
    const bool expert = contains(w, ".mlp.experts.");
    if (ends_with(w, ".weight")) {
      const std::string base = w.substr(0, w.size() - 7);
      std::vector<std::string> s = {base + ".weight_scale_inv", base + ".weight_scale"};
      if (expert) s.push_back(base + ".scale");  // the seed renames experts' ".scale" to ".weight_scale_inv"
      return s;
    }
    if (expert)  // fused expert tensors: the suffix follows the projection name
      return {w + "_scale_inv", w + "_scale", w + ".weight_scale_inv", w + ".weight_scale", w + ".scale"};
    return {w + "_scale_inv", w + "_scale"};
  }

  // The FP8 rules for weight tensor t of `rows` x `cols` (per leading index when `lead` is {E}).
  Quant quant(const TensorView* t, const QuantScheme& q, const std::string& ignored, Role role,
              const std::vector<std::string>& scales, const std::vector<int64_t>& lead, int64_t rows, int64_t cols) {
    Quant r;
    if (t->dtype != DType::F8_E4M3) {
      if (q.fp8 && role == Role::Quantized && ignored.empty()) {
        error("tensor '" + t->name + "' is " + dtype_name(t->dtype) + " and has no block scale ('" + t->name +
              "_scale_inv'), but " + q.source + " quantizes it: store it as FP8 with its scale, or list the module in "
              "quantization_config.ignored_layers");
        r.ok = false;
      }
      return r;
    }
    r.fp8 = true;
    if (!q.fp8) {
      error("tensor '" + t->name + "' is F8_E4M3 but " + q.source);
      r.ok = false;
      return r;
    }
    if (!ignored.empty()) {
      error("tensor '" + t->name + "' is F8_E4M3 but its module is excluded from quantization by '" + ignored + "' (" +
            q.source + "): excluded modules must be stored unquantized (BF16, F16 or F32)");
      r.ok = false;
      return r;
    }
    std::vector<const TensorView*> found;
    for (const auto& n : scales)
      if (const TensorView* s = take(n)) found.push_back(s);
    if (found.empty()) {
      error("FP8 tensor '" + t->name + "' has no block scale (expected '" + t->name + "_scale_inv')");
      r.ok = false;
      return r;
    }
    if (found.size() > 1) {
      error("FP8 tensor '" + t->name + "' has several block scales: '" + found[0]->name + "' and '" + found[1]->name + "'");
      r.ok = false;
      return r;
    }
    const TensorView* s = found[0];
    std::vector<int64_t> want = lead;
    want.push_back(ceil_div(rows, q.block_out));
    want.push_back(ceil_div(cols, q.block_in));
    if (s->shape != want) {
      error("scale tensor '" + s->name + "' of '" + t->name + "': expected shape " + list_string(want) + " (block [" +
            std::to_string(q.block_out) + ", " + std::to_string(q.block_in) +
            "] from quantization_config.weight_block_size), found " + list_string(s->shape));
      r.ok = false;
      return r;
    }
    switch (s->dtype) {
      case DType::F32:
      case DType::BF16:
      case DType::F8_E8M0:
        r.scale_dtype = s->dtype;
        break;
      case DType::U8:
        if (!q.ue8m0) {
          error("scale tensor '" + s->name + "' is U8 but quantization_config.scale_fmt is not \"ue8m0\"");
          r.ok = false;
          return r;
        }
        r.scale_dtype = DType::F8_E8M0;  // raw exponent bytes: reinterpreted, not converted
        break;
      default:
        error("scale tensor '" + s->name + "': expected dtype F32, BF16, F8_E8M0 or U8 (ue8m0), found " +
              dtype_name(s->dtype));
        r.ok = false;
        return r;
    }
    r.scale = s->data;
    r.block_out = q.block_out;
    r.block_in = q.block_in;
    return r;
  }

  static Linear make_linear(const TensorView* t, const Quant& q, int64_t out, int64_t in, int64_t elem_offset,
                            int64_t scale_offset) {
    Linear l;
    l.dtype = t->dtype;
    l.out = out;
    l.in = in;
    l.row_stride = in;
    l.data = static_cast<const uint8_t*>(t->data) + static_cast<size_t>(elem_offset) * dtype_size(t->dtype);
    if (q.fp8) {
      l.scale = static_cast<const uint8_t*>(q.scale) + static_cast<size_t>(scale_offset) * dtype_size(q.scale_dtype);
      l.scale_dtype = q.scale_dtype;
      l.block_out = q.block_out;
      l.block_in = q.block_in;
      l.scale_cols = ceil_div(in, q.block_in);
    }
    return l;
  }

  const WeightStore& store_;
  const QuantPlan& plan_;
  LoadReport& r_;
  const int L_, n_mtp_;
  int flat_limit_ = 1;
  std::map<std::string, std::string> canon_;  // canonical -> checkpoint name
  std::set<std::string> used_;
  std::vector<std::pair<std::string, std::string>> kv_scales_;  // checkpoint name, vLLM's remapped name
  int64_t input_scales_ = 0, mtp_ignored_ = 0;
  std::set<std::string> flat_out_of_range_;
  std::vector<std::pair<std::string, std::string>> backbone_patterns_, draft_patterns_;  // entry, canonical entry
};

void load_ffn(Binder& b, const HYV4Config& c, const std::string& p, bool sparse, FfnWeights& f) {
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
  b.experts(p, E, I, H, f);
}

// An FP8 Linear dequantized into `buf` (the values the kernels would use): BF16 when every value is exactly
// representable in it, else F32. `bad` counts the NaN / inf among them.
Linear dequantized(const Linear& q, std::vector<uint8_t>& buf, NonFiniteCount& bad) {
  std::vector<float> f(static_cast<size_t>(q.out * q.in));
  for (int64_t r = 0; r < q.out; ++r) ops::dequant_row(q, r, f.data() + r * q.in);
  bad = count_non_finite(f.data(), q.out * q.in);
  const bool bf16 = std::all_of(f.begin(), f.end(), [](float v) { return round_to_bf16(v) == v; });
  Linear d;
  d.dtype = bf16 ? DType::BF16 : DType::F32;
  d.out = q.out;
  d.in = q.in;
  d.row_stride = q.in;
  d.bias = q.bias;
  if (bf16) {
    buf.resize(f.size() * 2);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t h = f32_to_bf16(f[i]);
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  } else {
    buf.resize(f.size() * 4);
    std::memcpy(buf.data(), f.data(), buf.size());
  }
  d.data = buf.data();
  return d;
}

void load_attention(Binder& b, const HYV4Config& c, const std::string& p, bool own_indexer, AttentionWeights& a) {
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
    ix.wk = dequantized(ix.wk, ix.wk_dequant, bad);
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

QuantPlan resolve_quant_plan(const HYV4Config& c, LoadReport& r) {
  QuantPlan plan;
  QuantScheme& bb = plan.backbone;
  const QuantConfig& qc = c.quant;
  if (!qc.present) {
    bb.source = "config.json has no quantization_config (FP8 tensors need one)";
  } else {
    const std::string method = lower(qc.quant_method);
    bool ok = true;
    if (method != "fp8") {
      r.errors.push_back("config.json: quantization_config.quant_method '" + qc.quant_method +
                         "' is not supported (nextn loads block-wise FP8: quant_method \"fp8\")");
      ok = false;
    }
    if (!qc.fmt.empty() && lower(qc.fmt) != "e4m3" && lower(qc.fmt) != "float8_e4m3fn") {
      r.errors.push_back("config.json: quantization_config.fmt '" + qc.fmt + "' is not supported (only e4m3)");
      ok = false;
    }
    if (qc.weight_block_size.size() != 2) {
      r.errors.push_back("config.json: quantization_config.weight_block_size must be [block_out, block_in], found " +
                         list_string(qc.weight_block_size) + " (per-tensor FP8 is not supported)");
      ok = false;
    }
    const std::string act = lower(qc.activation_scheme);
    if (!act.empty() && act != "dynamic" && act != "static") {
      r.errors.push_back("config.json: quantization_config.activation_scheme '" + qc.activation_scheme +
                         "' is not supported (dynamic or static; nextn computes weight-only FP8 either way)");
      ok = false;
    }
    if (!qc.scale_fmt.empty() && lower(qc.scale_fmt) != "ue8m0")
      r.warnings.push_back("quantization_config.scale_fmt '" + qc.scale_fmt +
                           "' is not known; scales are read by their tensor dtype");
    if (ok) {
      bb.fp8 = true;
      bb.block_out = qc.weight_block_size[0];
      bb.block_in = qc.weight_block_size[1];
      bb.ue8m0 = lower(qc.scale_fmt) == "ue8m0";
      bb.ignored = qc.ignored_layers;
      bb.source = "quantization_config (fp8, block " + list_string(qc.weight_block_size) + ")";
    }
  }

  // The draft: mtp_quant_algo, as vLLM's _create_mtp_quant_config resolves it.
  const std::string algo = upper(c.mtp_quant_algo);
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
    QuantScheme& d = plan.draft;
    const nlohmann::json& raw = qc.raw;
    if (!qc.present || qc.weight_block_size.size() != 2) {
      r.errors.push_back("config.json: mtp_quant_algo FP8 needs quantization_config.weight_block_size [block_out, "
                         "block_in] (per-tensor FP8 is not supported)");
    } else {
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
    }
    plan.draft_resolution = "mtp_quant_algo FP8: the draft is block-wise FP8 built from quantization_config";
  } else {
    r.warnings.push_back("unknown mtp_quant_algo '" + c.mtp_quant_algo + "': the draft uses the backbone's quantization");
    plan.draft = bb;
    plan.draft_resolution = "mtp_quant_algo " + c.mtp_quant_algo + " (unknown): the draft uses the backbone's quantization";
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------------
// Binding

void bind_hy_v4_weights(const HYV4Config& c, const WeightStore& store, HYV4Weights& w, LoadReport& r) {
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
  Binder b(c, store, plan, r);
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
    : dir_(model_dir), cfg_(load_hy_v4_config(model_dir)), store_(WeightStore::open_dir(model_dir)), pool_(pool) {
  LoadReport r;
  bind_hy_v4_weights(cfg_, store_, w_, r);
  for (const auto& s : r.infos) std::fprintf(stderr, "nextn: info: %s\n", s.c_str());
  for (const auto& s : r.warnings) std::fprintf(stderr, "nextn: warning: %s\n", s.c_str());
  if (!r.ok()) throw Error(r.error_message(model_dir));
}

}  // namespace nextn
