// `nextn inspect`: a checkpoint directory summarised from its config, its tensor headers and a dry run of
// the loader's binding (nothing is computed, no weight byte is read).
#include "models/hy_v4/checkpoint_info.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "core/error.h"
#include "models/common/name_rules.h"

namespace nextn {

namespace {

bool is_mtp_tensor(const std::string& n, int num_hidden_layers) {
  if (n.rfind("model.mtp_layers.", 0) == 0) return true;
  static const std::string kLayers = "model.layers.";
  if (n.rfind(kLayers, 0) != 0) return false;
  size_t i = kLayers.size(), j = i;
  while (j < n.size() && n[j] >= '0' && n[j] <= '9') ++j;
  if (j == i || j - i > 9) return false;
  return std::stoi(n.substr(i, j - i)) >= num_hidden_layers;
}

std::string human_bytes(double b) {
  char buf[64];
  if (b >= double(int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (b >= double(1 << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) r += sep;
    r += v[i];
  }
  return r;
}

// A whole-context KV cache's size, and a warning when this machine could not hold it (generate refuses a
// prompt + max_tokens whose caches do not fit in memory).
void note_context_cache(CheckpointInfo& info, LoadReport& r) {
  const HYV4Config& c = info.config;
  const double key = double(c.kv_lora_rank + c.qk_rope_head_dim), index_key = double(c.index_head_dim);
  double floats_per_position = double(c.num_nextn_predict_layers) * (key + index_key);
  for (int i = 0; i < c.num_hidden_layers; ++i) floats_per_position += key + (c.has_own_indexer(i) ? index_key : 0);
  const double bytes_per_position = floats_per_position * sizeof(float);
  info.context_cache_bytes = bytes_per_position * double(c.max_position_embeddings);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double ram = pages > 0 && page > 0 ? double(pages) * double(page) : 0;
  if (ram > 0 && info.context_cache_bytes > ram)
    r.warnings.push_back("KV caches for the whole context (max_position_embeddings " +
                         std::to_string(c.max_position_embeddings) + ") take " + human_bytes(info.context_cache_bytes) +
                         ", more than this machine's memory (" + human_bytes(ram) + "): generate refuses a prompt + "
                         "max_tokens beyond about " + std::to_string(int64_t(ram / bytes_per_position)) + " tokens");
}

}  // namespace

CheckpointInfo inspect_checkpoint(const std::string& dir, bool scan) {
  CheckpointInfo info;
  info.dir = dir;
  HYV4LoadReport& r = info.report;
  // architectures / model_type straight from the JSON (HYV4Config does not keep them)
  {
    std::ifstream in(dir + "/config.json", std::ios::binary);
    if (!in) {
      r.errors.push_back(dir + "/config.json: cannot open file");
      return info;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    try {
      const nlohmann::json j = nlohmann::json::parse(ss.str());
      if (j.is_object()) {
        if (auto it = j.find("model_type"); it != j.end() && it->is_string()) info.model_type = it->get<std::string>();
        if (auto it = j.find("architectures"); it != j.end() && it->is_array())
          for (const auto& a : *it)
            if (a.is_string()) info.architectures.push_back(a.get<std::string>());
      }
    } catch (const nlohmann::json::exception& e) {
      r.errors.push_back(dir + "/config.json: malformed JSON: " + e.what());
      return info;
    }
  }
  try {
    info.config = load_hy_v4_config(dir);
    info.config_ok = true;
  } catch (const Error& e) {
    r.errors.push_back(e.what());
    return info;
  }
  std::optional<WeightStore> store;
  try {
    store.emplace(WeightStore::open_dir(dir));
  } catch (const Error& e) {
    r.errors.push_back(e.what());
    return info;
  }
  for (const std::string& name : store->names()) {
    const TensorView* t = store->find(name);
    ++info.num_tensors;
    info.total_bytes += static_cast<int64_t>(t->nbytes);
    info.bytes_by_dtype[dtype_name(t->dtype)] += static_cast<int64_t>(t->nbytes);
    info.tensors_by_dtype[dtype_name(t->dtype)] += 1;
    if (names::is_scale_tensor(name)) continue;
    info.params += t->numel();
    if (is_mtp_tensor(name, info.config.num_hidden_layers)) info.mtp_params += t->numel();
  }
  LoadReport scratch;  // resolve_quant_plan's findings are reported again by the binding below
  info.quant = resolve_quant_plan(info.config, scratch);
  HYV4Weights w;
  bind_hy_v4_weights(info.config, *store, w, r);
  if (r.ok()) note_context_cache(info, r);
  if (scan) {
    info.scanned = true;
    info.scanned_tensors = static_cast<int64_t>(store->size());
    info.non_finite = scan_non_finite(*store);
    for (const NonFiniteTensor& t : info.non_finite)
      r.errors.push_back("tensor '" + t.name + "' in " + t.file + " (" + t.dtype + ") has " + std::to_string(t.count) +
                         " non-finite value(s) (NaN or inf), the first at index " + std::to_string(t.first));
  }
  info.loadable = r.ok();
  return info;
}

nlohmann::json checkpoint_info_json(const CheckpointInfo& info) {
  using nlohmann::json;
  const HYV4Config& c = info.config;
  const HYV4LoadReport& r = info.report;
  json j;
  j["dir"] = info.dir;
  j["architectures"] = info.architectures;
  j["model_type"] = info.model_type;
  j["config_ok"] = info.config_ok;
  if (info.config_ok) {
    j["sizes"] = {
        {"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads},
        {"q_lora_rank", c.q_lora_rank},
        {"kv_lora_rank", c.kv_lora_rank},
        {"qk_nope_head_dim", c.qk_nope_head_dim},
        {"qk_rope_head_dim", c.qk_rope_head_dim},
        {"v_head_dim", c.v_head_dim},
        {"intermediate_size", c.intermediate_size},
        {"moe_intermediate_size", c.moe_intermediate_size},
        {"n_routed_experts", c.n_routed_experts},
        {"n_shared_experts", c.n_shared_experts},
        {"num_experts_per_tok", c.num_experts_per_tok},
        {"index_n_heads", c.index_n_heads},
        {"index_head_dim", c.index_head_dim},
        {"index_topk", c.index_topk},
        {"hc_mult", c.hc_mult},
        {"max_position_embeddings", c.max_position_embeddings},
        {"context_cache_bytes", info.context_cache_bytes},
        {"tensors", info.num_tensors},
        {"params", info.params},
        {"mtp_params", info.mtp_params},
        {"bytes", info.total_bytes},
        {"bytes_by_dtype", info.bytes_by_dtype},
        {"tensors_by_dtype", info.tensors_by_dtype},
    };
    json layers = json::array();
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      json l = {{"index", i},
                {"mlp", c.is_sparse_mlp(i) ? "sparse" : "dense"},
                {"indexer", c.has_own_indexer(i) ? "full" : "shared"}};
      if (i < static_cast<int>(c.layer_types.size())) l["attention"] = c.layer_types[i];
      layers.push_back(l);
    }
    j["layers"] = layers;
    json q = {{"present", c.quant.present}};
    if (c.quant.present) {
      q["method"] = c.quant.quant_method;
      q["fmt"] = c.quant.fmt;
      q["weight_block_size"] = c.quant.weight_block_size;
      q["activation_scheme"] = c.quant.activation_scheme;
      q["scale_fmt"] = c.quant.scale_fmt;
      q["ignored_modules"] = c.quant.ignored_layers;
    }
    q["compute"] = info.quant.backbone.fp8 ? "weight-only FP8 (activations fp32)" : "unquantized";
    j["quantization"] = q;
    j["mtp"] = {
        {"num_nextn_predict_layers", c.num_nextn_predict_layers},
        {"layers_found", r.mtp_layers_found},
        {"naming", r.mtp_naming},
        {"mtp_quant_algo", c.mtp_quant_algo.empty() ? json(nullptr) : json(c.mtp_quant_algo)},
        {"quant_resolution", info.quant.draft_resolution},
        {"draft_fp8", info.quant.draft.fp8},
        {"draft_ignored_modules", info.quant.draft.ignored},
    };
    j["tensor_names"] = {{"forms", r.name_forms}, {"features", r.name_features}, {"expert_layout", r.expert_layout}};
  }
  if (info.scanned) {
    json bad = json::array();
    for (const NonFiniteTensor& t : info.non_finite)
      bad.push_back({{"tensor", t.name}, {"file", t.file}, {"dtype", t.dtype}, {"count", t.count}, {"first_index", t.first}});
    j["scan"] = {{"tensors", info.scanned_tensors}, {"non_finite", bad}};
  }
  j["infos"] = r.infos;
  j["warnings"] = r.warnings;
  j["missing"] = r.missing;
  j["errors"] = r.errors;
  j["notes"] = r.notes;
  j["loadable"] = info.loadable;
  return j;
}

std::string checkpoint_info_text(const CheckpointInfo& info) {
  const HYV4Config& c = info.config;
  const HYV4LoadReport& r = info.report;
  std::ostringstream o;
  o << "checkpoint:    " << info.dir << "\n";
  o << "architecture:  " << (info.architectures.empty() ? "(none)" : join(info.architectures, ", "))
    << " (model_type " << (info.model_type.empty() ? "?" : info.model_type) << ")\n";
  if (info.config_ok) {
    o << "sizes:         vocab " << c.vocab_size << ", hidden " << c.hidden_size << ", " << c.num_hidden_layers
      << " layers, " << c.num_attention_heads << " heads (q_lora " << c.q_lora_rank << ", kv_lora " << c.kv_lora_rank
      << ", qk " << c.qk_nope_head_dim << "+" << c.qk_rope_head_dim << ", v " << c.v_head_dim << "), experts "
      << c.n_routed_experts << " routed (top-" << c.num_experts_per_tok << ", I " << c.moe_intermediate_size << ") + "
      << c.n_shared_experts << " shared, dense I " << c.intermediate_size << ", indexer " << c.index_n_heads << "x"
      << c.index_head_dim << " top-" << c.index_topk << ", hc_mult " << c.hc_mult << "\n";
    if (info.context_cache_bytes > 0)
      o << "context:       " << c.max_position_embeddings << " positions; KV caches of a whole-context sequence "
        << human_bytes(info.context_cache_bytes) << "\n";
    o << "tensors:       " << info.num_tensors << ", " << info.params << " params (MTP " << info.mtp_params << "), "
      << human_bytes(info.total_bytes) << "\n";
    for (const auto& [dt, b] : info.bytes_by_dtype)
      o << "  " << dt << ": " << info.tensors_by_dtype.at(dt) << " tensors, " << human_bytes(b) << "\n";
    std::vector<int> dense, sparse, full, shared;
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      (c.is_sparse_mlp(i) ? sparse : dense).push_back(i);
      (c.has_own_indexer(i) ? full : shared).push_back(i);
    }
    o << "layers:        dense MLP " << list_string(dense) << ", sparse MLP " << list_string(sparse) << "; full indexer "
      << list_string(full) << ", shared indexer " << list_string(shared) << "\n";
    if (c.quant.present) {
      std::string block;
      for (size_t i = 0; i < c.quant.weight_block_size.size(); ++i) {
        if (i) block += "x";
        block += std::to_string(c.quant.weight_block_size[i]);
      }
      o << "quantization:  " << c.quant.quant_method << " " << (c.quant.fmt.empty() ? "" : c.quant.fmt + " ")
        << "block " << (block.empty() ? "(none)" : block) << ", activation_scheme "
        << (c.quant.activation_scheme.empty() ? "(unset)" : c.quant.activation_scheme) << ", scale_fmt "
        << (c.quant.scale_fmt.empty() ? "(unset)" : c.quant.scale_fmt) << "; weight-only FP8 compute\n";
      o << "  ignored modules: " << (c.quant.ignored_layers.empty() ? "(none)" : join(c.quant.ignored_layers, ", "))
        << "\n";
    } else {
      o << "quantization:  none\n";
    }
    o << "MTP:           num_nextn_predict_layers " << c.num_nextn_predict_layers << "; layers found "
      << list_string(r.mtp_layers_found) << " named " << r.mtp_naming << "\n";
    o << "  " << info.quant.draft_resolution << "\n";
    o << "tensor names:  " << (r.name_forms.empty() ? "(plain)" : join(r.name_forms, " + ")) << "; experts "
      << r.expert_layout << "\n";
    for (const auto& f : r.name_features) o << "  " << f << "\n";
  }
  if (info.scanned)
    o << "scan:          " << info.scanned_tensors << " tensors read, "
      << (info.non_finite.empty() ? std::string("no NaN or inf")
                                  : std::to_string(info.non_finite.size()) + " with NaN or inf (errors below)")
      << "\n";
  else if (info.config_ok)
    o << "scan:          weights not read (--scan reads every value for NaN and inf)\n";
  for (const auto& s : r.infos) o << "info: " << s << "\n";
  for (const auto& s : r.warnings) o << "warning: " << s << "\n";
  if (!r.ok()) o << "error: " << r.error_message(info.dir) << "\n";
  o << "loadable:      " << (info.loadable ? "yes" : "no") << "\n";
  return o.str();
}

}  // namespace nextn
