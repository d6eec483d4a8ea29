#include "models/qwen4_exp/family.h"

#include <sstream>

#include "core/error.h"
#include "models/common/scan.h"
#include "models/qwen4_exp/model.h"

namespace nextn::qwen4_exp {

std::unique_ptr<Model> load(const std::string& dir, ThreadPool* pool) {
  return std::make_unique<Qwen4ExpModel>(dir, pool);
}

namespace {

nlohmann::json describe_config(const Qwen4ExpConfig& c, int mtp_layers) {
  int linear = 0, qsa = 0;
  std::string pattern;
  for (Qwen4LayerKind k : c.kinds) {
    (k == Qwen4LayerKind::Linear ? linear : qsa)++;
    pattern += k == Qwen4LayerKind::Linear ? 'L' : 'A';
  }
  nlohmann::json j;
  j["layers"] = {{"total", c.num_hidden_layers},
                 {"gated_deltanet", linear},
                 {"qsa_attention", qsa},
                 {"pattern", pattern}};
  j["hidden_size"] = c.hidden_size;
  j["vocab_size"] = c.vocab_size;
  j["context"] = c.max_position_embeddings;
  j["hc_count"] = c.hc_count;
  j["hc_lowrank"] = c.hc_lowrank;
  j["gated_deltanet"] = {{"key_heads", c.linear_num_key_heads},
                         {"value_heads", c.linear_num_value_heads},
                         {"key_head_dim", c.linear_key_head_dim},
                         {"value_head_dim", c.linear_value_head_dim},
                         {"conv_kernel", c.linear_conv_kernel_dim}};
  j["attention"] = {{"heads", c.num_attention_heads}, {"kv_heads", c.num_key_value_heads}, {"head_dim", c.head_dim},
                    {"rotary_dim", c.rope.dim}};
  j["qsa"] = {{"indexer_heads", c.indexer_n_heads},
              {"indexer_head_dim", c.indexer_head_dim},
              {"budget", c.indexer_budget},
              {"compress_ratio", c.indexer_compress_ratio}};
  j["moe"] = {{"experts", c.num_experts},
              {"experts_per_token", c.num_experts_per_tok},
              {"expert_intermediate", c.moe_intermediate_size},
              {"shared_expert_intermediate", c.shared_expert_intermediate_size}};
  j["ple"] = c.ple_layer_ids.empty()
                 ? nlohmann::json(nullptr)
                 : nlohmann::json{{"layers", c.ple_layer_ids},
                                  {"ngram_size", c.ngram_size},
                                  {"heads_per_ngram", c.heads_per_ngram},
                                  {"embed_dim", c.ple_embed_dim}};
  j["mtp_layers"] = mtp_layers;
  j["quantization"] = c.quant.present ? c.quant.raw : nlohmann::json("none");
  j["dtype"] = c.torch_dtype;
  return j;
}

std::string text_of(const nlohmann::json& j, const std::string& dir) {
  std::ostringstream o;
  o << "checkpoint:    " << dir << "\n";
  o << "model_type:    " << j.value("model_type", "?") << "\n";
  if (j.contains("config")) {
    const auto& c = j["config"];
    const auto& L = c["layers"];
    o << "layers:        " << L["total"].get<int>() << " (" << L["gated_deltanet"].get<int>() << " Gated DeltaNet, "
      << L["qsa_attention"].get<int>() << " QSA attention: " << L["pattern"].get<std::string>() << ")\n";
    o << "hidden:        " << c["hidden_size"].get<int64_t>() << " x " << c["hc_count"].get<int>()
      << " hyper-connection streams (GatedResidual, rank " << c["hc_lowrank"].get<int64_t>() << ")\n";
    o << "qsa:           budget " << c["qsa"]["budget"].get<int64_t>() << " keys in blocks of "
      << c["qsa"]["compress_ratio"].get<int64_t>() << ", " << c["qsa"]["indexer_heads"].get<int>() << " indexer heads\n";
    o << "moe:           " << c["moe"]["experts"].get<int>() << " experts, " << c["moe"]["experts_per_token"].get<int>()
      << " per token, + gated shared expert\n";
    if (c["ple"].is_null())
      o << "ple:           off\n";
    else
      o << "ple:           layers " << c["ple"]["layers"].dump() << ", " << c["ple"]["ngram_size"].get<int>()
        << "-grams, " << c["ple"]["heads_per_ngram"].get<int>() << " hashed heads per order\n";
    o << "mtp layers:    " << c["mtp_layers"].get<int>() << "\n";
    const auto& q = c["quantization"];
    o << "quantization:  ";
    if (q.is_string()) {
      o << q.get<std::string>() << "\n";
    } else {
      o << q.value("quant_method", std::string("?")) << " " << q.value("fmt", std::string(""));
      if (q.contains("weight_block_size")) o << ", blocks " << q["weight_block_size"].dump();
      size_t excluded = 0;
      for (const char* k : {"modules_to_not_convert", "ignored_layers", "exclude_modules"})
        if (q.contains(k) && q[k].is_array()) excluded += q[k].size();
      o << ", " << excluded << " module(s) left unquantized\n";
    }
  }
  if (j.contains("state_bytes_per_sequence"))
    o << "memory:        " << j["kv_bytes_per_position"].get<int64_t>() << " KV bytes per position (with MTP), "
      << j["state_bytes_per_sequence"].get<int64_t>() << " bytes of recurrent state per sequence ("
      << j["state_slots"].get<int64_t>() << " slots)\n";
  if (j.contains("scan")) o << "scan:          " << j["scan"].dump() << "\n";
  o << "loadable:      " << (j["loadable"].get<bool>() ? "yes" : "no") << "\n";
  if (j.contains("error")) o << "error:         " << j["error"].get<std::string>() << "\n";
  return o.str();
}

}  // namespace

CheckpointReport inspect(const std::string& dir, bool scan) {
  nlohmann::json j;
  j["dir"] = dir;
  bool loadable = false;
  try {
    const Qwen4ExpConfig c = load_qwen4_exp_config(dir);
    j["model_type"] = c.composite ? "qwen4_exp" : "qwen4_exp_text";
    try {
      Qwen4ExpModel m(dir, nullptr);
      j["config"] = describe_config(c, m.num_mtp_layers());
      j["kv_bytes_per_position"] = m.kv_bytes_per_position(true);
      j["state_bytes_per_sequence"] = m.state_bytes();
      j["state_slots"] = MemoryOptions{}.max_verify_rows;
      loadable = true;
      if (scan) {
        const auto bad = scan_non_finite(WeightStore::open_dir(dir));
        nlohmann::json list = nlohmann::json::array();
        for (const auto& t : bad) list.push_back({{"tensor", t.name}, {"file", t.file}, {"non_finite", t.count}});
        j["scan"] = {{"non_finite", list}};
        loadable = bad.empty();
      }
    } catch (const Error& e) {
      j["config"] = describe_config(c, std::max(c.mtp_num_hidden_layers, 0));
      j["error"] = e.what();
    }
  } catch (const Error& e) {
    j["error"] = e.what();
  }
  j["loadable"] = loadable;
  return {loadable, j, text_of(j, dir)};
}

}  // namespace nextn::qwen4_exp
