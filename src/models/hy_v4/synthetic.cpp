// Synthetic HY V4 checkpoints (see synthetic.h). The tensors, their order, values and the config are those
// `nextn bench` has written since synthetic-hy4-v2: a change to any of them must bump the version in
// hy_v4_synthetic_name, or cached checkpoints of the old writer would be measured as the new one.
#include "models/hy_v4/synthetic.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "models/hy_v4/config.h"

namespace nextn {
namespace {

struct SynthTensor {
  std::string name;
  std::string dtype;  // "BF16", "F32", "F8_E4M3"
  std::vector<int64_t> shape;
  float scale;        // values ~ N(0, scale²) (or this constant for norms when const_value)
  bool const_value = false;
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::vector<SynthTensor> synthetic_tensors(const nlohmann::json& c, bool fp8, bool dense) {
  const int64_t H = c["hidden_size"], V = c["vocab_size"], L = c["num_hidden_layers"], nh = c["num_attention_heads"];
  const int64_t ql = c["q_lora_rank"], kvl = c["kv_lora_rank"], nope = c["qk_nope_head_dim"], rope = c["qk_rope_head_dim"];
  const int64_t vd = c["v_head_dim"], nih = c["index_n_heads"], ihd = c["index_head_dim"];
  const int64_t E = c["n_routed_experts"], I = c["moe_intermediate_size"], Id = c["intermediate_size"];
  const int64_t C = c["hc_mult"];
  std::vector<SynthTensor> t;
  const std::string lin = fp8 ? "F8_E4M3" : "BF16";
  auto linear = [&](const std::string& n, int64_t out, int64_t in) {
    t.push_back({n + ".weight", lin, {out, in}, 1.0f / std::sqrt(float(in))});
    if (fp8) t.push_back({n + ".weight_scale_inv", "F32", {(out + 127) / 128, (in + 127) / 128}, 0, true});
  };
  auto norm = [&](const std::string& n, int64_t d) { t.push_back({n, "BF16", {d}, 1.0f, true}); };
  auto block = [&](const std::string& p, bool sparse, bool hc, bool own_indexer) {
    if (hc)
      for (const char* k : {"attn_hc", "ffn_hc"}) {
        t.push_back({p + k + ".fn", "F32", {2 * C, C * H}, 1.0f / std::sqrt(float(C * H))});
        t.push_back({p + k + ".base", "F32", {2 * C}, 0.5f});
        t.push_back({p + k + ".scale", "F32", {2}, 0.5f});
      }
    norm(p + "input_layernorm.weight", H);
    norm(p + "post_attention_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    linear(a + "q_a_proj", ql, H);
    norm(a + "q_a_layernorm.weight", ql);
    linear(a + "q_b_proj", nh * (nope + rope), ql);
    linear(a + "kv_a_proj_with_mqa", kvl + rope, H);
    norm(a + "kv_a_layernorm.weight", kvl);
    linear(a + "kv_b_proj", nh * (nope + vd), kvl);
    linear(a + "o_proj", H, nh * vd);
    linear(a + "gate_proj", nh * vd, H);
    t.push_back({a + "sinks", "F32", {nh}, 1.0f});
    if (own_indexer) {
      linear(a + "indexer.wq_b", nih * ihd, ql);
      linear(a + "indexer.wk", ihd, H);
      norm(a + "indexer.k_norm.weight", ihd);
      t.push_back({a + "indexer.k_norm.bias", "F32", {ihd}, 0.1f});
      t.push_back({a + "indexer.weights_proj.weight", "F32", {nih, H}, 1.0f / std::sqrt(float(H))});
    }
    const std::string m = p + "mlp.";
    if (!sparse) {
      linear(m + "gate_proj", Id, H);
      linear(m + "up_proj", Id, H);
      linear(m + "down_proj", H, Id);
      return;
    }
    t.push_back({m + "gate.weight", "F32", {E, H}, 1.0f / std::sqrt(float(H))});
    t.push_back({m + "gate.e_score_correction_bias", "F32", {E}, 0.1f});
    linear(m + "shared_experts.gate_proj", I, H);
    linear(m + "shared_experts.up_proj", I, H);
    linear(m + "shared_experts.down_proj", H, I);
    t.push_back({m + "experts.gate_up_proj", lin, {E, 2 * I, H}, 1.0f / std::sqrt(float(H))});
    if (fp8) t.push_back({m + "experts.gate_up_proj_scale_inv", "F32", {E, (2 * I + 127) / 128, (H + 127) / 128}, 0, true});
    t.push_back({m + "experts.down_proj", lin, {E, H, I}, 1.0f / std::sqrt(float(I))});
    if (fp8) t.push_back({m + "experts.down_proj_scale_inv", "F32", {E, (H + 127) / 128, (I + 127) / 128}, 0, true});
  };
  t.push_back({"model.embed_tokens.weight", "BF16", {V, H}, 1.0f});
  // default indexer pattern: own indexer on layer 0 and every layer with (i - 1) % 4 == 0
  for (int64_t i = 0; i < L; ++i)
    block("model.layers." + std::to_string(i) + ".", i > 0 && !dense, true, i == 0 || (i - 1) % 4 == 0);
  t.push_back({"model.hc_head.hc_fn", "F32", {C, C * H}, 1.0f / std::sqrt(float(C * H))});
  t.push_back({"model.hc_head.hc_base", "F32", {C}, 0.5f});
  t.push_back({"model.hc_head.hc_scale", "F32", {1}, 0.5f});
  norm("model.norm.weight", H);
  t.push_back({"lm_head.weight", "BF16", {V, H}, 0.5f / std::sqrt(float(H))});
  const std::string mp = "model.mtp_layers.0.";
  norm(mp + "enorm.weight", H);
  norm(mp + "hnorm.weight", H);
  norm(mp + "final_layernorm.weight", H);
  linear(mp + "eh_proj", H, 2 * H);
  block(mp, !dense, false, true);
  return t;
}

size_t dtype_bytes(const std::string& d) { return d == "F32" ? 4 : d == "BF16" ? 2 : 1; }

}  // namespace

nlohmann::json hy_v4_synthetic_config(bool fp8, bool dense, int layers, int hidden) {
  if (layers < 1 || layers > kHYV4SyntheticMaxLayers)
    throw Error("synthetic checkpoint: layers must be 1.." + std::to_string(kHYV4SyntheticMaxLayers) + ", got " +
                std::to_string(layers));
  if (hidden < 1024 || hidden > 8192 || hidden % 1024 != 0)
    throw Error("synthetic checkpoint: the hidden size must be a multiple of 1024 from 1024 to 8192, got " +
                std::to_string(hidden));
  // (at the default 2048: MLP 5632, experts 768, 16 heads, q rank 768, kv rank 256)
  const int h = hidden;
  nlohmann::json c = {{"model_type", "hy_v4"},
                      {"architectures", {"HYV4ForCausalLM"}},
                      {"vocab_size", 32000},
                      {"hidden_size", h},
                      {"intermediate_size", h / 4 * 11},
                      {"moe_intermediate_size", h / 8 * 3},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", h / 128},
                      {"q_lora_rank", h / 8 * 3},
                      {"kv_lora_rank", h / 8},
                      {"qk_nope_head_dim", 64},
                      {"qk_rope_head_dim", 32},
                      {"v_head_dim", 64},
                      {"index_topk", 512},
                      {"index_head_dim", 64},
                      {"index_n_heads", 8},
                      {"n_routed_experts", 32},
                      {"num_experts_per_tok", 4},
                      {"n_shared_experts", 1},
                      {"hc_mult", 4},
                      {"max_position_embeddings", 8192},
                      {"num_nextn_predict_layers", 1},
                      {"tie_word_embeddings", false}};
  if (dense) c["mlp_layer_types"] = std::vector<std::string>(int(c["num_hidden_layers"]), "dense");
  if (fp8)
    c["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"weight_block_size", {128, 128}},
                                {"activation_scheme", "dynamic"},
                                {"ignored_layers", nlohmann::json::array()}};
  return c;
}

ModelFacts hy_v4_synthetic_facts(bool fp8, bool dense, int layers, int hidden) {
  const HYV4Config c = parse_hy_v4_config(hy_v4_synthetic_config(fp8, dense, layers, hidden), "synthetic checkpoint");
  ModelFacts f;  // as HYV4Model::init_facts fills them
  f.model_type = "hy_v4";
  f.vocab_size = c.vocab_size;
  f.hidden_width = c.hidden_size;
  f.context = c.max_position_embeddings;
  f.num_mtp_layers = c.num_nextn_predict_layers;
  f.sparse_budget = c.index_topk;
  for (int64_t e : c.eos_token_ids) f.eos_token_ids.push_back(static_cast<int32_t>(e));
  return f;
}

std::string hy_v4_synthetic_name(bool fp8, bool dense, int layers, int hidden) {
  return std::string("synthetic-hy4-v2-") + (fp8 ? "fp8" : "bf16") + (dense ? "-dense" : "") +
         (layers != kHYV4SyntheticLayers ? "-" + std::to_string(layers) + "l" : "") +
         (hidden != kHYV4SyntheticHidden ? "-h" + std::to_string(hidden) : "");
}

// Streams a random checkpoint to disk tensor by tensor (never the whole model in memory).
void write_hy_v4_synthetic(const std::string& dir, bool fp8, bool dense, int layers, int hidden) {
  const auto cfg = hy_v4_synthetic_config(fp8, dense, layers, hidden);
  std::filesystem::create_directories(dir);
  const auto tensors = synthetic_tensors(cfg, fp8, dense);
  nlohmann::json header = nlohmann::json::object();
  size_t off = 0;
  for (const auto& t : tensors) {
    const size_t n = size_t(numel(t.shape)) * dtype_bytes(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hs = header.dump();
  while (hs.size() % 8) hs += ' ';
  const std::string tmp = dir + "/model.safetensors.tmp";
  std::ofstream f(tmp, std::ios::binary);
  if (!f) throw Error("cannot write " + tmp);
  uint64_t hl = hs.size();
  f.write(reinterpret_cast<const char*>(&hl), 8);
  f.write(hs.data(), hs.size());
  std::mt19937_64 rng(1234);
  std::vector<char> buf;
  for (const auto& t : tensors) {
    const int64_t n = numel(t.shape);
    buf.resize(size_t(n) * dtype_bytes(t.dtype));
    for (int64_t i = 0; i < n; ++i) {
      // cheap approximately-normal values: sum of 4 uniforms, centred and scaled
      const uint64_t r = rng();
      const float u = (float((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) / 65536.0f - 2.0f) *
                      1.7320508f;
      const float v = t.const_value ? (t.dtype == "F32" && fp8 && t.name.find("scale_inv") != std::string::npos
                                           ? 1.0f / 256.0f
                                           : t.scale)
                                    : u * t.scale;
      if (t.dtype == "F32") {
        std::memcpy(&buf[size_t(i) * 4], &v, 4);
      } else if (t.dtype == "BF16") {
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(&buf[size_t(i) * 2], &b, 2);
      } else {  // e4m3 code of a value ~N(0, 64²)/... : random sign, exponent 5..9, random mantissa
        buf[size_t(i)] = char((r & 0x80) | (((5 + (r >> 8) % 5) & 0xf) << 3) | ((r >> 16) & 7));
      }
    }
    f.write(buf.data(), buf.size());
  }
  f.close();
  std::filesystem::rename(tmp, dir + "/model.safetensors");
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

}  // namespace nextn
