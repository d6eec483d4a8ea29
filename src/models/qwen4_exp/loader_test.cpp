// Qwen4-Exp checkpoints that lie or deviate: each problem is a load error naming the tensor or the config
// field, and the layouts published checkpoints use (vLLM's MTP layer numbering, no mtp_num_hidden_layers)
// load to the same numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../../../tests/test_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/qwen4_exp/model.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Tensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using Ckpt = std::map<std::string, Tensor>;

struct Source {
  json config;
  Ckpt ckpt;
};

Source read_fixture(const std::string& name) {
  Source s;
  const std::string dir = testing::qwen4_exp_fixture_dir(name);
  std::ifstream in(dir + "/config.json");
  s.config = json::parse(in);
  SafetensorsFile file(dir + "/model.safetensors");
  for (const TensorView& t : file.tensors()) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    s.ckpt[t.name] = Tensor{t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)};
  }
  return s;
}

std::string write(const Source& s, const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = std::string(info->test_suite_name()) + "_" + info->name();
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("nextn_qwen_loader_" + std::to_string(::getpid())) / test / suffix;
  fs::remove_all(dir);
  fs::create_directories(dir);
  SafetensorsWriter w;
  for (const auto& [name, t] : s.ckpt) w.add(name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write((dir / "model.safetensors").string(), {{"format", "pt"}});
  std::ofstream(dir / "config.json") << s.config.dump(2);
  return dir.string();
}

std::string load_error(const std::string& dir) {
  try {
    Qwen4ExpModel m(dir, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Qwen4ExpLoader, MissingMtpTensorIsNamed) {
  Source s = read_fixture("a_fp32");
  ASSERT_EQ(s.ckpt.erase("mtp.layers.0.self_attn.q_proj.weight"), 1u);
  const std::string e = load_error(write(s, "ck"));
  EXPECT_NE(e.find("mtp.layers.0.self_attn.q_proj"), std::string::npos) << e;
}

TEST(Qwen4ExpLoader, WronglyShapedMtpTensorIsNamed) {
  Source s = read_fixture("b_fp32");
  Tensor& t = s.ckpt.at("mtp.fc_hidden.weight");
  t.shape = {64, 32};
  t.bytes.resize(64 * 32 * 4);
  const std::string e = load_error(write(s, "ck"));
  EXPECT_NE(e.find("mtp.fc_hidden.weight"), std::string::npos) << e;
}

TEST(Qwen4ExpLoader, MissingPleShardIsNamed) {
  Source s = read_fixture("a_fp32");
  ASSERT_EQ(s.ckpt.erase("model.language_model.layers.0.ple.ple_embedding.ngram_embedding.shard_3.weight"), 1u);
  const std::string e = load_error(write(s, "ck"));
  EXPECT_NE(e.find("model.layers.0.ple.ple_embedding.ngram_embedding."), std::string::npos) << e;
  EXPECT_NE(e.find("shards"), std::string::npos) << e;
}

TEST(Qwen4ExpLoader, ConfigProblemsNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  const Case cases[] = {
      {"hc_count", 1, "hc_count"},
      {"ple_layer_ids", json::array({3}), "ple_layer_ids"},  // layer 3 is a QSA layer
      {"indexer_budget", nullptr, "indexer_budget"},
      {"indexer_kv_heads", 2, "indexer_kv_heads"},
      {"indexer_budget", 6, "indexer_budget"},  // not a multiple of the compress ratio 4
      {"output_gate_type", "tanh", "output_gate_type"},
      {"layer_types", json::array({"linear_attention", "mamba", "full_attention", "linear_attention",
                                   "full_attention"}),
       "layer_types[1]"},
      {"num_experts_per_tok", 9, "num_experts_per_tok"},
  };
  const Source base = read_fixture("a_fp32");
  for (const Case& c : cases) {
    Source s;
    s.config = base.config;
    s.config["text_config"][c.field] = c.value;
    const std::string dir = write(s, "cfg");
    std::string e;
    try {
      load_qwen4_exp_config(dir);
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.field << ": " << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << c.field << ": " << e;
  }
  Source s;
  s.config = base.config;
  s.config.erase("text_config");
  std::string e;
  try {
    load_qwen4_exp_config(write(s, "cfg"));
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("text_config"), std::string::npos) << e;
}

// vLLM numbers the MTP layers after the target's (mtp.layers.{L + j}); without mtp_num_hidden_layers the
// loader takes the layers the checkpoint holds. Either way the drafts are the same, bit for bit.
TEST(Qwen4ExpLoader, MtpLayerNumberingAndCountVariantsDraftTheSame) {
  const Source base = read_fixture("b_fp32");
  const int L = base.config["num_hidden_layers"].get<int>();
  Source s = base;
  s.ckpt.clear();
  for (const auto& [name, t] : base.ckpt) {
    std::string n = name;
    for (int j = 0; j < 2; ++j) {
      const std::string from = "mtp.layers." + std::to_string(j) + ".";
      if (n.rfind(from, 0) == 0) {
        n = "mtp.layers." + std::to_string(L + j) + "." + n.substr(from.size());
        break;
      }
    }
    s.ckpt[n] = t;
  }
  s.config.erase("mtp_num_hidden_layers");
  Qwen4ExpModel ref(testing::qwen4_exp_fixture_dir("b_fp32"), nullptr);
  Qwen4ExpModel var(write(s, "ck"), nullptr);
  ASSERT_EQ(var.num_mtp_layers(), 2);
  const auto prompt = testing::Reference(testing::qwen4_exp_fixture_dir("b_fp32")).ids("input_ids");
  const int64_t T = prompt.size(), V = ref.facts().vocab_size, CH = ref.facts().hidden_width;
  std::vector<float> h(T * CH), a((T - 1) * V), b((T - 1) * V);
  auto seq = ref.new_sequence(T);
  const BatchSegment seg{seq.get(), prompt.data(), T, true};
  ref.forward(&seg, 1, nullptr, h.data());
  ref.prompt_draft_logits(prompt.data(), T, h.data(), a.data());
  var.prompt_draft_logits(prompt.data(), T, h.data(), b.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(Qwen4ExpLoader, StoredMixerInjectionIsNeverRead) {
  // The fixtures store mtp.hyper_connection_mixer.block_inject_weight (as vLLM expects to drop); loading must
  // neither use it nor warn about it: removing it changes nothing.
  Source s = read_fixture("a_fp32");
  ASSERT_EQ(s.ckpt.erase("mtp.hyper_connection_mixer.block_inject_weight.weight"), 1u);
  Qwen4ExpModel var(write(s, "ck"), nullptr);
  EXPECT_EQ(var.num_mtp_layers(), 1);
}

TEST(Qwen4ExpLoader, AttentionBiasesAreAddedOnce) {
  // With the output gates' weights zeroed, a gate bias beta makes every head's output gate sigmoid(beta): the same
  // logits (to rounding) as no biases and o_proj scaled by sigmoid(beta) / sigmoid(0). A bias added twice would
  // give sigmoid(2 beta) instead (0.88 for 0.73 at beta = 1). The other biases are zero.
  const float beta = 1.0f;
  const Source base = read_fixture("a_fp32");
  const json& tc = base.config.contains("text_config") ? base.config["text_config"] : base.config;
  const int64_t nh = tc["num_attention_heads"].get<int64_t>(), hd = tc["head_dim"].get<int64_t>();
  const int64_t kv = tc["num_key_value_heads"].get<int64_t>(), H = tc["hidden_size"].get<int64_t>();
  Source biased = base, scaled = base;
  (biased.config.contains("text_config") ? biased.config["text_config"] : biased.config)["attention_bias"] = true;
  auto f32 = [](Tensor& t) { return reinterpret_cast<float*>(t.bytes.data()); };
  auto zeros = [](int64_t n) { return Tensor{DType::F32, {n}, std::vector<uint8_t>(size_t(n) * 4, 0)}; };
  int layers = 0;
  for (const auto& [name, t] : base.ckpt) {
    const size_t at = name.find("self_attn.q_proj.weight");
    if (at == std::string::npos) continue;
    const std::string p = name.substr(0, at) + "self_attn.";
    ++layers;
    for (Source* s : {&biased, &scaled}) {
      float* q = f32(s->ckpt[name]);
      for (int64_t h = 0; h < nh; ++h) std::fill(q + (h * 2 * hd + hd) * H, q + (h * 2 + 2) * hd * H, 0.0f);
    }
    Tensor qb = zeros(nh * 2 * hd);
    for (int64_t h = 0; h < nh; ++h) std::fill(f32(qb) + h * 2 * hd + hd, f32(qb) + (h + 1) * 2 * hd, beta);
    biased.ckpt[p + "q_proj.bias"] = qb;
    biased.ckpt[p + "k_proj.bias"] = zeros(kv * hd);
    biased.ckpt[p + "v_proj.bias"] = zeros(kv * hd);
    biased.ckpt[p + "o_proj.bias"] = zeros(H);
    Tensor& o = scaled.ckpt[p + "o_proj.weight"];
    const float k = (1.0f / (1.0f + std::exp(-beta))) / 0.5f;
    for (size_t i = 0; i < o.bytes.size() / 4; ++i) f32(o)[i] *= k;
  }
  ASSERT_GT(layers, 0);
  Qwen4ExpModel mb(write(biased, "biased"), nullptr), ms(write(scaled, "scaled"), nullptr);
  const auto prompt = testing::Reference(testing::qwen4_exp_fixture_dir("a_fp32")).ids("input_ids");
  const int64_t T = prompt.size(), V = mb.facts().vocab_size;
  std::vector<float> lb(T * V), ls(T * V);
  for (auto [m, out] : {std::pair{&mb, &lb}, std::pair{&ms, &ls}}) {
    auto seq = m->new_sequence(T);
    const BatchSegment seg{seq.get(), prompt.data(), T, true};
    m->forward(&seg, 1, out->data(), nullptr);
  }
  const auto d = testing::compare(lb.data(), ls.data(), T, V);
  EXPECT_LE(d.rel(), 1e-5) << "max|Δ| " << d.max_abs << " of " << d.max_ref;
}

}  // namespace
}  // namespace nextn
