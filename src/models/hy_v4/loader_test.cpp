// Checkpoint loading rules (docs/checkpoints.md): every test rewrites a fixture checkpoint in a temporary
// folder (renamed, relaid out, quantized, broken) and checks what the loader makes of it.
//   * pure renames / relayouts must give bit-identical target and draft logits;
//   * FP8 block quantization (done here in C++) must give the logits of the exactly dequantized weights
//     (same math: within 1e-5 relative);
//   * broken checkpoints must fail with a nextn::Error naming the tensor at fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../../tests/test_util.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "models/hy_v4/checkpoint_info.h"
#include "models/hy_v4/model.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- checkpoints in memory ---------------------------------------------------------------------------

struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::vector<float> f32() const {
    std::vector<float> v(numel());
    convert_to_f32(dtype, bytes.data(), v.data(), v.size());
    return v;
  }
};

using Ckpt = std::map<std::string, Tensor>;

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  Tensor t;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

struct Fixture {
  std::string dir;
  json config;
  Ckpt ckpt;
  std::vector<int32_t> prompt;
  int L = 0, n_mtp = 0;
};

const Fixture& fixture(const std::string& name) {
  static std::map<std::string, Fixture> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Fixture f;
  f.dir = testing::fixture_dir(name);
  std::ifstream in(f.dir + "/config.json");
  f.config = json::parse(in);
  SafetensorsFile file(f.dir + "/model.safetensors");
  for (const TensorView& t : file.tensors()) {
    Tensor x;
    x.dtype = t.dtype;
    x.shape = t.shape;
    const uint8_t* p = static_cast<const uint8_t*>(t.data);
    x.bytes.assign(p, p + t.nbytes);
    f.ckpt[t.name] = std::move(x);
  }
  f.prompt = testing::Reference(f.dir).ids("input_ids");
  f.L = f.config["num_hidden_layers"].get<int>();
  f.n_mtp = f.config.value("num_nextn_predict_layers", 0);
  return cache.emplace(name, std::move(f)).first->second;
}

// This process's scratch folder, one sub-folder per test; a test's folders are removed when the next test
// makes its first one, and the whole folder at exit.
struct ScratchRoot {
  fs::path root = fs::path(::testing::TempDir()) / ("nextn_loader_" + std::to_string(::getpid()));
  std::string test;  // the test that owns root/test
  ~ScratchRoot() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

// A fresh folder for the current test (suffix distinguishes several checkpoints of one test).
std::string test_dir(const std::string& suffix) {
  static ScratchRoot scratch;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = std::string(info->test_suite_name()) + "_" + info->name();
  std::replace(test.begin(), test.end(), '/', '_');
  if (test != scratch.test) {
    std::error_code ec;
    if (!scratch.test.empty()) fs::remove_all(scratch.root / scratch.test, ec);
    scratch.test = test;
  }
  fs::path dir = scratch.root / test / suffix;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string write_ckpt(const std::string& suffix, const Ckpt& ck, const json& config) {
  const std::string dir = test_dir(suffix);
  SafetensorsWriter w;
  for (const auto& [name, t] : ck) w.add(name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write(dir + "/model.safetensors", {{"format", "pt"}});
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

// ---- relayouts -----------------------------------------------------------------------------------------

// Rows [r0, r0 + n) of every [rows, cols] matrix in a [lead, rows, cols] tensor (lead = 1 for 2-D).
Tensor slice_rows(const Tensor& t, int64_t index, int64_t r0, int64_t n) {
  const int64_t R = t.shape[t.shape.size() - 2], C = t.shape.back();
  const size_t es = dtype_size(t.dtype);
  Tensor o;
  o.dtype = t.dtype;
  o.shape = {n, C};
  const uint8_t* src = t.bytes.data() + static_cast<size_t>((index * R + r0) * C) * es;
  o.bytes.assign(src, src + static_cast<size_t>(n * C) * es);
  return o;
}

Tensor concat_rows(const std::vector<const Tensor*>& parts) {
  Tensor o;
  o.dtype = parts[0]->dtype;
  o.shape = {0, parts[0]->shape[1]};
  for (const Tensor* p : parts) {
    o.shape[0] += p->shape[0];
    o.bytes.insert(o.bytes.end(), p->bytes.begin(), p->bytes.end());
  }
  return o;
}

// Fused experts [E, 2I, H] / [E, H, I] -> mlp.experts.{e}.gate_proj / up_proj / down_proj.weight.
void split_experts(Ckpt& ck) {
  Ckpt out;
  for (const auto& [name, t] : ck) {
    if (ends_with(name, ".experts.gate_up_proj")) {
      const std::string p = name.substr(0, name.size() - 12);  // "...experts."
      const int64_t E = t.shape[0], I = t.shape[1] / 2;
      for (int64_t e = 0; e < E; ++e) {
        out[p + std::to_string(e) + ".gate_proj.weight"] = slice_rows(t, e, 0, I);
        out[p + std::to_string(e) + ".up_proj.weight"] = slice_rows(t, e, I, I);
      }
    } else if (ends_with(name, ".experts.down_proj")) {
      const std::string p = name.substr(0, name.size() - 9);
      for (int64_t e = 0; e < t.shape[0]; ++e) out[p + std::to_string(e) + ".down_proj.weight"] = slice_rows(t, e, 0, t.shape[1]);
    } else {
      out[name] = t;
    }
  }
  ck = std::move(out);
}

// Separate projections -> vLLM's stacked tensors (dense / shared-expert gate_up_proj, fused_qkv_a_proj,
// indexer wk_weights_proj).
void fuse_projections(Ckpt& ck) {
  struct Rule {
    const char* first;
    const char* second;
    const char* fused;
  };
  const Rule rules[] = {{".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.gate_up_proj.weight"},
                        {".shared_experts.gate_proj.weight", ".shared_experts.up_proj.weight",
                         ".shared_experts.gate_up_proj.weight"},
                        {".self_attn.q_a_proj.weight", ".self_attn.kv_a_proj_with_mqa.weight",
                         ".self_attn.fused_qkv_a_proj.weight"},
                        {".indexer.wk.weight", ".indexer.weights_proj.weight", ".indexer.wk_weights_proj.weight"}};
  std::vector<std::string> names;
  for (const auto& kv : ck) names.push_back(kv.first);
  for (const std::string& name : names)
    for (const Rule& r : rules) {
      if (!ends_with(name, r.first)) continue;
      const std::string base = name.substr(0, name.size() - std::strlen(r.first));
      const std::string second = base + r.second;
      ASSERT_TRUE(ck.count(second)) << second;
      ck[base + r.fused] = concat_rows({&ck.at(name), &ck.at(second)});
      ck.erase(name);
      ck.erase(second);
    }
}

// model.mtp_layers.{i}.* -> model.layers.{L+i}.* for the listed i (optionally inside "mtp_block.").
void flatten_mtp(Ckpt& ck, int L, const std::vector<int>& layers, bool mtp_block = false) {
  Ckpt out;
  for (auto& [name, t] : ck) {
    std::string n = name;
    for (int i : layers) {
      const std::string from = "model.mtp_layers." + std::to_string(i) + ".";
      if (!starts_with(n, from)) continue;
      std::string rest = n.substr(from.size());
      const bool top = starts_with(rest, "enorm") || starts_with(rest, "hnorm") || starts_with(rest, "eh_proj") ||
                       starts_with(rest, "final_layernorm") || starts_with(rest, "embed_tokens") ||
                       starts_with(rest, "shared_head");
      if (mtp_block && !top) rest = "mtp_block." + rest;
      n = "model.layers." + std::to_string(L + i) + "." + rest;
    }
    out[n] = std::move(t);
  }
  ck = std::move(out);
}

void rename_suffix(Ckpt& ck, const std::string& from, const std::string& to) {
  Ckpt out;
  for (auto& [name, t] : ck) out[ends_with(name, from) ? name.substr(0, name.size() - from.size()) + to : name] = std::move(t);
  ck = std::move(out);
}

// ---- FP8 block quantization ---------------------------------------------------------------------------

// Nearest e4m3fn code of v (|v| <= 448).
uint8_t encode_e4m3(float v) {
  static const std::vector<float> pos = [] {
    std::vector<float> t(127);  // codes 0x00..0x7e ascend; 0x7f is NaN
    for (int i = 0; i < 127; ++i) t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  const float a = std::fabs(v);
  size_t i = std::lower_bound(pos.begin(), pos.end(), a) - pos.begin();
  if (i >= pos.size()) i = pos.size() - 1;
  if (i > 0 && a - pos[i - 1] <= pos[i] - a) --i;
  return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) | i);
}

enum class ScaleFmt { F32, UE8M0_U8 };

struct QuantOptions {
  int64_t bo = 128, bi = 128;
  ScaleFmt fmt = ScaleFmt::F32;
  bool dot_scale_for_split_experts = false;  // name split experts' scales "<proj>.scale" (seed style)
  std::function<bool(const std::string&)> keep_unquantized = [](const std::string&) { return false; };
};

// Linear weights: 2-D "*.weight" (not norms / embedding / heads) and fused 3-D expert tensors.
bool quantizable(const std::string& name, const Tensor& t) {
  if (ends_with(name, ".experts.gate_up_proj") || ends_with(name, ".experts.down_proj")) return true;
  return ends_with(name, ".weight") && t.shape.size() == 2 && name.find("norm") == std::string::npos &&
         name.find("embed_tokens") == std::string::npos && name.find("lm_head") == std::string::npos &&
         name.find("shared_head") == std::string::npos;
}

// Quantizes every linear weight to e4m3 with [bo, bi] block scales. Returns the FP8 checkpoint and the same
// checkpoint with those weights replaced by their exact dequantization (fp32).
std::pair<Ckpt, Ckpt> quantize(const Ckpt& in, const QuantOptions& o) {
  Ckpt q, d;
  for (const auto& [name, t] : in) {
    if (!quantizable(name, t) || o.keep_unquantized(name)) {
      q[name] = t;
      d[name] = t;
      continue;
    }
    const std::vector<float> w = t.f32();
    const int64_t E = t.shape.size() == 3 ? t.shape[0] : 1, R = t.shape[t.shape.size() - 2], C = t.shape.back();
    const int64_t sr = (R + o.bo - 1) / o.bo, sc = (C + o.bi - 1) / o.bi;
    Tensor qt;
    qt.dtype = DType::F8_E4M3;
    qt.shape = t.shape;
    qt.bytes.resize(w.size());
    std::vector<float> deq(w.size()), scales(E * sr * sc);
    std::vector<uint8_t> exps(E * sr * sc);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t br = 0; br < sr; ++br)
        for (int64_t bc = 0; bc < sc; ++bc) {
          const int64_t r0 = br * o.bo, r1 = std::min(R, r0 + o.bo), c0 = bc * o.bi, c1 = std::min(C, c0 + o.bi);
          float amax = 0;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[(e * R + r) * C + c]));
          float s = amax > 0 ? amax / 448.0f : 1.0f;
          const int64_t si = (e * sr + br) * sc + bc;
          if (o.fmt == ScaleFmt::UE8M0_U8) {
            const int ex = static_cast<int>(std::ceil(std::log2(s)));
            s = std::ldexp(1.0f, ex);
            exps[si] = static_cast<uint8_t>(ex + 127);
            EXPECT_EQ(e8m0_to_f32(exps[si]), s);
          }
          scales[si] = s;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t i = (e * R + r) * C + c;
              qt.bytes[i] = encode_e4m3(w[i] / s);
              deq[i] = fp8_e4m3_to_f32(qt.bytes[i]) * s;  // what the kernel computes
              EXPECT_LE(std::fabs(deq[i] - w[i]), amax / 16 + 1e-30f) << name;  // e4m3: 3 mantissa bits
            }
        }
    Tensor st;
    st.shape = t.shape.size() == 3 ? std::vector<int64_t>{E, sr, sc} : std::vector<int64_t>{sr, sc};
    if (o.fmt == ScaleFmt::UE8M0_U8) {
      st.dtype = DType::U8;
      st.bytes = exps;
    } else {
      st = f32_tensor(st.shape, scales);
    }
    std::string scale_name = name + "_scale_inv";  // "x.weight_scale_inv", fused experts "x.gate_up_proj_scale_inv"
    const bool split_expert = name.find(".experts.") != std::string::npos && ends_with(name, "_proj.weight");
    if (o.dot_scale_for_split_experts && split_expert) scale_name = name.substr(0, name.size() - 7) + ".scale";
    q[name] = std::move(qt);
    q[scale_name] = std::move(st);
    d[name] = f32_tensor(t.shape, deq);
  }
  return {std::move(q), std::move(d)};
}

json fp8_config(const json& base, int64_t bo, int64_t bi, bool ue8m0, const std::vector<std::string>& ignored = {}) {
  json c = base;
  c["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"weight_block_size", {bo, bi}},
                              {"activation_scheme", "dynamic"}};
  if (ue8m0) c["quantization_config"]["scale_fmt"] = "ue8m0";
  if (!ignored.empty()) c["quantization_config"]["ignored_layers"] = ignored;
  return c;
}

// ---- running a checkpoint --------------------------------------------------------------------------------

struct Outputs {
  std::vector<float> logits;              // [T, V]
  std::vector<std::vector<float>> draft;  // per MTP layer: layer 0 [T-1, V], layer 1 [T-2, V] (chained)
  int64_t V = 0;
};

Outputs run(const std::string& dir, const std::vector<int32_t>& prompt) {
  ThreadPool pool(2);
  HYV4Model m(dir, &pool);
  const int64_t T = prompt.size(), V = m.config().vocab_size, H = m.config().hidden_size;
  Outputs o;
  o.V = V;
  o.logits.resize(T * V);
  std::vector<float> hidden(T * H);
  KVCache cache = m.new_cache(T);
  m.forward(prompt.data(), T, cache, o.logits.data(), hidden.data());
  if (m.num_mtp_layers() >= 1) {
    KVCache dc = m.new_draft_cache(T);
    std::vector<float> h0((T - 1) * H);
    o.draft.emplace_back((T - 1) * V);
    m.draft_forward(0, prompt.data() + 1, hidden.data(), T - 1, 0, dc, o.draft[0].data(), h0.data());
    if (m.num_mtp_layers() >= 2) {
      KVCache dc1 = m.new_draft_cache(T);
      dc1.set_base_position(1);
      o.draft.emplace_back((T - 2) * V);
      m.draft_forward(1, prompt.data() + 2, h0.data(), T - 2, 1, dc1, o.draft[1].data(), nullptr);
    }
  }
  return o;
}

const Outputs& baseline(const std::string& name) {
  static std::map<std::string, Outputs> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, run(fixture(name).dir, fixture(name).prompt)).first;
  return it->second;
}

void expect_identical(const Outputs& a, const Outputs& b) {
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float))) << "target logits differ";
  ASSERT_EQ(a.draft.size(), b.draft.size()) << "number of MTP layers";
  for (size_t i = 0; i < a.draft.size(); ++i)
    EXPECT_EQ(0, std::memcmp(a.draft[i].data(), b.draft[i].data(), a.draft[i].size() * sizeof(float)))
        << "draft layer " << i << " logits differ";
}

void expect_close(const Outputs& got, const Outputs& ref, double tol) {
  ASSERT_EQ(got.logits.size(), ref.logits.size());
  auto d = testing::compare(got.logits.data(), ref.logits.data(), got.logits.size() / got.V, got.V);
  EXPECT_LE(d.rel(), tol) << "target max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0);
  ASSERT_EQ(got.draft.size(), ref.draft.size());
  for (size_t i = 0; i < got.draft.size(); ++i) {
    auto dd = testing::compare(got.draft[i].data(), ref.draft[i].data(), got.draft[i].size() / got.V, got.V);
    EXPECT_LE(dd.rel(), tol) << "draft layer " << i << " max|Δ| " << dd.max_abs;
    EXPECT_EQ(dd.argmax_mismatches, 0) << "draft layer " << i;
  }
}

// The nextn::Error loading `dir` throws ("" when it loads).
std::string load_error(const std::string& dir) {
  ThreadPool pool(1);
  try {
    HYV4Model m(dir, &pool);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- renames and relayouts: bit-identical ----------------------------------------------------------------

class LoaderLayouts : public ::testing::TestWithParam<const char*> {};

TEST_P(LoaderLayouts, SplitExpertsAreBitIdentical) {
  const Fixture& f = fixture(GetParam());
  Ckpt ck = f.ckpt;
  split_experts(ck);
  ASSERT_TRUE(ck.count("model.mtp_layers.0.mlp.experts.0.gate_proj.weight"));
  expect_identical(run(write_ckpt("split", ck, f.config), f.prompt), baseline(GetParam()));
}

TEST_P(LoaderLayouts, FusedStackedProjectionsAreBitIdentical) {
  const Fixture& f = fixture(GetParam());
  Ckpt ck = f.ckpt;
  fuse_projections(ck);
  ASSERT_TRUE(ck.count("model.layers.0.self_attn.fused_qkv_a_proj.weight"));
  ASSERT_TRUE(ck.count("model.layers.0.self_attn.indexer.wk_weights_proj.weight"));
  ASSERT_TRUE(ck.count("model.layers.0.mlp.gate_up_proj.weight"));
  ASSERT_TRUE(ck.count("model.mtp_layers.0.mlp.shared_experts.gate_up_proj.weight"));
  expect_identical(run(write_ckpt("fused", ck, f.config), f.prompt), baseline(GetParam()));
}

TEST_P(LoaderLayouts, FlattenedMtpNamesAreBitIdentical) {
  const Fixture& f = fixture(GetParam());
  Ckpt ck = f.ckpt;
  flatten_mtp(ck, f.L, {0});  // only layer 0: the flattened form covers i < max(n - 1, 1)
  ASSERT_TRUE(ck.count("model.layers." + std::to_string(f.L) + ".eh_proj.weight"));
  expect_identical(run(write_ckpt("flat", ck, f.config), f.prompt), baseline(GetParam()));
}

TEST_P(LoaderLayouts, VllmDraftModuleNamesAreBitIdentical) {
  const Fixture& f = fixture(GetParam());
  Ckpt ck = f.ckpt;
  flatten_mtp(ck, f.L, {0}, /*mtp_block=*/true);
  ASSERT_TRUE(ck.count("model.layers." + std::to_string(f.L) + ".mtp_block.self_attn.o_proj.weight"));
  expect_identical(run(write_ckpt("mtp_block", ck, f.config), f.prompt), baseline(GetParam()));
}

TEST_P(LoaderLayouts, ExpertBiasNamesAreBitIdentical) {
  const Fixture& f = fixture(GetParam());
  for (const char* alias : {".mlp.gate.expert_bias", ".mlp.expert_bias"}) {
    Ckpt ck = f.ckpt;
    rename_suffix(ck, ".mlp.gate.e_score_correction_bias", alias);
    ASSERT_TRUE(ck.count("model.mtp_layers.0" + std::string(alias)));
    expect_identical(run(write_ckpt(alias + 1, ck, f.config), f.prompt), baseline(GetParam()));
  }
}

TEST_P(LoaderLayouts, EverythingAtOnceIsBitIdentical) {
  const Fixture& f = fixture(GetParam());
  Ckpt ck = f.ckpt;
  split_experts(ck);
  fuse_projections(ck);
  flatten_mtp(ck, f.L, {0});
  rename_suffix(ck, ".mlp.gate.e_score_correction_bias", ".mlp.expert_bias");
  // KV-cache scales are remapped and ignored (one info line), unknown tensors warned about and skipped.
  ck["model.layers.0.self_attn.k_scale"] = f32_tensor({}, {1.0f});
  ck["model.layers.0.self_attn.k_proj.k_scale"] = f32_tensor({}, {1.0f});
  ck["model.layers.1.self_attn.kv_scale"] = f32_tensor({}, {1.0f});
  ck["model.layers.0.mystery.weight"] = f32_tensor({2}, {1.0f, 2.0f});
  const std::string dir = write_ckpt("all", ck, f.config);
  ::testing::internal::CaptureStderr();
  Outputs o = run(dir, f.prompt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  expect_identical(o, baseline(GetParam()));
  EXPECT_NE(err.find("warning: unknown checkpoint tensor 'model.layers.0.mystery.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("ignoring 3 KV-cache scale tensor(s)"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoaderLayouts, ::testing::Values("a_fp32", "b_fp32", "c_bf16"));

// attention_bias: a fused_qkv_a_proj.bias is split like its weight.
TEST(LoaderBias, FusedQkvBiasIsSplitLikeTheWeight) {
  const Fixture& f = fixture("a_fp32");
  json cfg = f.config;
  cfg["attention_bias"] = true;
  Ckpt ck = f.ckpt;
  uint32_t state = 12345;
  auto noise = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    return v;
  };
  std::vector<std::string> prefixes;
  for (const auto& kv : f.ckpt)
    if (ends_with(kv.first, ".self_attn.q_a_proj.weight")) prefixes.push_back(kv.first.substr(0, kv.first.size() - 15));
  ASSERT_EQ(prefixes.size(), size_t(f.L + f.n_mtp));
  for (const std::string& p : prefixes) {
    ck[p + "q_a_proj.bias"] = f32_tensor({32}, noise(32));
    ck[p + "kv_a_proj_with_mqa.bias"] = f32_tensor({40}, noise(40));
    ck[p + "o_proj.bias"] = f32_tensor({64}, noise(64));
  }
  const Outputs separate = run(write_ckpt("separate", ck, cfg), f.prompt);
  EXPECT_NE(0, std::memcmp(separate.logits.data(), baseline("a_fp32").logits.data(), separate.logits.size() * 4));
  for (const std::string& p : prefixes) {
    std::vector<float> b = ck.at(p + "q_a_proj.bias").f32(), kv = ck.at(p + "kv_a_proj_with_mqa.bias").f32();
    b.insert(b.end(), kv.begin(), kv.end());
    ck[p + "fused_qkv_a_proj.bias"] = f32_tensor({72}, b);
    ck.erase(p + "q_a_proj.bias");
    ck.erase(p + "kv_a_proj_with_mqa.bias");
  }
  fuse_projections(ck);
  expect_identical(run(write_ckpt("fused", ck, cfg), f.prompt), separate);
}

// ---- MTP naming rules ----------------------------------------------------------------------------------

// vLLM recognizes flattened model.layers.{L+i} names only for i < max(n - 1, 1): with two MTP layers, layer 1
// flattened is not found (its tensors are unknown and it is reported missing).
TEST(LoaderMtp, FlattenedNamesBeyondTheSeedRangeAreNotRecognized) {
  const Fixture& f = fixture("b_fp32");
  ASSERT_EQ(f.n_mtp, 2);
  Ckpt ck = f.ckpt;
  flatten_mtp(ck, f.L, {0, 1});
  const std::string dir = write_ckpt("flat01", ck, f.config);
  ::testing::internal::CaptureStderr();
  const std::string e = load_error(dir);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(e.find("model.mtp_layers.1.eh_proj.weight"), std::string::npos) << e;
  EXPECT_EQ(e.find("model.mtp_layers.0."), std::string::npos) << e;
  EXPECT_NE(e.find("only recognized for i < 1"), std::string::npos) << e;
  EXPECT_NE(err.find("unknown checkpoint tensor 'model.layers.5.eh_proj.weight'"), std::string::npos) << err;
}

TEST(LoaderMtp, NoMtpLayersIgnoresMtpTensorsQuietly) {
  const Fixture& f = fixture("a_fp32");
  json cfg = f.config;
  cfg["num_nextn_predict_layers"] = 0;
  Ckpt ck = f.ckpt;
  const std::string dir = write_ckpt("nomtp", ck, cfg);
  ::testing::internal::CaptureStderr();
  Outputs o = run(dir, f.prompt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(o.draft.empty());
  EXPECT_EQ(0, std::memcmp(o.logits.data(), baseline("a_fp32").logits.data(), o.logits.size() * sizeof(float)));
  EXPECT_EQ(err.find("warning"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("no MTP draft"), std::string::npos) << err;
}

TEST(LoaderMtp, MissingMtpTensorIsAnErrorNamingIt) {
  const Fixture& f = fixture("a_fp32");
  Ckpt ck = f.ckpt;
  ck.erase("model.mtp_layers.0.eh_proj.weight");
  ck.erase("model.mtp_layers.0.self_attn.indexer.wk.weight");
  const std::string e = load_error(write_ckpt("x", ck, f.config));
  EXPECT_NE(e.find("lacks 2 tensor(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("model.mtp_layers.0.eh_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model.mtp_layers.0.self_attn.indexer.wk.weight"), std::string::npos) << e;
}

// ---- shape / dtype errors ----------------------------------------------------------------------------

TEST(LoaderErrors, ShapeMismatchNamesTensorExpectedAndFound) {
  const Fixture& f = fixture("a_fp32");
  Ckpt ck = f.ckpt;
  Tensor& t = ck.at("model.layers.2.self_attn.q_b_proj.weight");
  std::swap(t.shape[0], t.shape[1]);
  const std::string e = load_error(write_ckpt("x", ck, f.config));
  EXPECT_NE(e.find("tensor 'model.layers.2.self_attn.q_b_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected shape [96, 32], found [32, 96]"), std::string::npos) << e;
}

TEST(LoaderErrors, DtypeMismatchNamesTensor) {
  const Fixture& f = fixture("a_fp32");
  Ckpt ck = f.ckpt;
  ck.at("model.norm.weight").dtype = DType::I32;
  const std::string e = load_error(write_ckpt("x", ck, f.config));
  EXPECT_NE(e.find("tensor 'model.norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("found I32"), std::string::npos) << e;
}

TEST(LoaderErrors, BothFusedAndSeparateProjectionsAreAnError) {
  const Fixture& f = fixture("a_fp32");
  Ckpt ck = f.ckpt;
  ck["model.layers.0.mlp.gate_up_proj.weight"] =
      concat_rows({&ck.at("model.layers.0.mlp.gate_proj.weight"), &ck.at("model.layers.0.mlp.up_proj.weight")});
  const std::string e = load_error(write_ckpt("x", ck, f.config));
  EXPECT_NE(e.find("model.layers.0.mlp.gate_up_proj.weight"), std::string::npos) << e;
}

// ---- FP8 ----------------------------------------------------------------------------------------------------

struct Fp8Case {
  const char* fixture;
  int64_t bo, bi;
  bool ue8m0;
  bool fused;  // fused experts / stacked projections (else split experts, separate projections)
};

class LoaderFp8 : public ::testing::TestWithParam<Fp8Case> {};

// The FP8 checkpoint computes exactly what its dequantized fp32 copy computes (weight-only FP8).
TEST_P(LoaderFp8, MatchesExactlyDequantizedWeights) {
  const Fp8Case& p = GetParam();
  const Fixture& f = fixture(p.fixture);
  Ckpt ck = f.ckpt;
  if (p.fused)
    fuse_projections(ck);
  else
    split_experts(ck);
  QuantOptions o;
  o.bo = p.bo;
  o.bi = p.bi;
  o.fmt = p.ue8m0 ? ScaleFmt::UE8M0_U8 : ScaleFmt::F32;
  o.dot_scale_for_split_experts = p.ue8m0;
  auto [q, d] = quantize(ck, o);
  const std::string qdir = write_ckpt("fp8", q, fp8_config(f.config, p.bo, p.bi, p.ue8m0));
  const std::string ddir = write_ckpt("deq", d, f.config);
  ::testing::internal::CaptureStderr();
  Outputs got = run(qdir, f.prompt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  expect_close(got, run(ddir, f.prompt), 1e-5);
  // sanity: quantization did change the model (how much depends on discrete top-k / routing flips)
  auto dd = testing::compare(got.logits.data(), baseline(p.fixture).logits.data(), f.prompt.size(), got.V);
  EXPECT_GT(dd.max_abs, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Blocks, LoaderFp8,
                         ::testing::Values(Fp8Case{"a_fp32", 128, 128, false, false},
                                           Fp8Case{"a_fp32", 48, 40, false, false},
                                           Fp8Case{"b_fp32", 48, 40, true, false},
                                           Fp8Case{"a_fp32", 128, 128, true, false},
                                           Fp8Case{"a_fp32", 16, 40, false, true},
                                           Fp8Case{"b_fp32", 16, 24, true, true},
                                           // fused parts starting inside a scale block (e.g. up rows at I = 32)
                                           Fp8Case{"a_fp32", 48, 40, false, true},
                                           Fp8Case{"b_fp32", 128, 128, true, true},
                                           Fp8Case{"c_bf16", 32, 48, false, false}),
                         [](const ::testing::TestParamInfo<Fp8Case>& i) {
                           const Fp8Case& c = i.param;
                           return std::string(c.fixture) + "_" + std::to_string(c.bo) + "x" + std::to_string(c.bi) +
                                  (c.ue8m0 ? "_ue8m0" : "") + (c.fused ? "_fused" : "_split");
                         });

// Modules on the exclusion lists stay unquantized: by exact name, by parent module, by trailing-* prefix; MTP
// entries named the checkpoint way (model.mtp_layers.0...) also cover the flattened model.layers.{L+0} names.
TEST(LoaderFp8Ignored, IgnoredModulesLoadUnquantized) {
  const Fixture& f = fixture("a_fp32");
  for (bool flat : {false, true}) {
    SCOPED_TRACE(flat ? "flattened MTP names" : "model.mtp_layers names");
    Ckpt ck = f.ckpt;
    split_experts(ck);
    const std::vector<std::string> ignored = {"model.layers.0.self_attn.linear_gate", "model.layers.1.mlp.shared_experts",
                                              "model.mtp_layers.0.self_attn.linear_gate*",
                                              "model.mtp_layers.0.mlp.experts.3"};
    QuantOptions o;
    o.keep_unquantized = [](const std::string& n) {
      return n == "model.layers.0.self_attn.linear_gate.weight" || n.find("model.layers.1.mlp.shared_experts.") == 0 ||
             n == "model.mtp_layers.0.self_attn.linear_gate.weight" || n.find("model.mtp_layers.0.mlp.experts.3.") == 0;
    };
    auto [q, d] = quantize(ck, o);
    EXPECT_EQ(q.at("model.layers.0.self_attn.linear_gate.weight").dtype, DType::F32);
    EXPECT_EQ(q.at("model.mtp_layers.0.mlp.experts.3.up_proj.weight").dtype, DType::F32);
    EXPECT_EQ(q.at("model.mtp_layers.0.mlp.experts.4.up_proj.weight").dtype, DType::F8_E4M3);
    if (flat) {
      flatten_mtp(q, f.L, {0});
      flatten_mtp(d, f.L, {0});
    }
    const std::string qdir = write_ckpt(flat ? "fp8_flat" : "fp8", q, fp8_config(f.config, 128, 128, false, ignored));
    const std::string ddir = write_ckpt(flat ? "deq_flat" : "deq", d, f.config);
    expect_close(run(qdir, f.prompt), run(ddir, f.prompt), 1e-5);
  }
}

// One FP8 checkpoint broken in several ways, each error naming the tensor at fault.
class LoaderFp8Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    const Fixture& f = fixture("a_fp32");
    ck_ = f.ckpt;
    split_experts(ck_);
    QuantOptions o;
    o.bo = 48;
    o.bi = 40;
    q_ = quantize(ck_, o).first;
    cfg_ = fp8_config(f.config, 48, 40, false);
  }
  std::string error_of(const Ckpt& q, const json& cfg) { return load_error(write_ckpt("x", q, cfg)); }
  Ckpt ck_, q_;
  json cfg_;
};

TEST_F(LoaderFp8Errors, FP8TensorWithoutScale) {
  Ckpt q = q_;
  q.erase("model.layers.3.mlp.down_proj.weight_scale_inv");
  const std::string e = error_of(q, cfg_);
  EXPECT_NE(e.find("FP8 tensor 'model.layers.3.mlp.down_proj.weight' has no block scale"), std::string::npos) << e;
}

TEST_F(LoaderFp8Errors, ScaleWithWrongShape) {
  Ckpt q = q_;
  // o_proj [64, 64] with [48, 40] blocks needs a [2, 2] scale; a [1, 2] one (as for 128-row blocks) is wrong.
  q["model.layers.0.self_attn.o_proj.weight_scale_inv"] = f32_tensor({1, 2}, {1.0f, 1.0f});
  const std::string e = error_of(q, cfg_);
  EXPECT_NE(e.find("scale tensor 'model.layers.0.self_attn.o_proj.weight_scale_inv'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected shape [2, 2]"), std::string::npos) << e;
  EXPECT_NE(e.find("found [1, 2]"), std::string::npos) << e;
}

TEST_F(LoaderFp8Errors, FP8ModuleListedAsIgnored) {
  json cfg = cfg_;
  cfg["quantization_config"]["modules_to_not_convert"] = {"model.layers.2.self_attn.kv_b_proj"};
  const std::string e = error_of(q_, cfg);
  EXPECT_NE(e.find("tensor 'model.layers.2.self_attn.kv_b_proj.weight' is F8_E4M3 but its module is excluded"),
            std::string::npos)
      << e;
}

TEST_F(LoaderFp8Errors, UnquantizedModuleNotListedAsIgnored) {
  Ckpt q = q_;
  q["model.layers.2.self_attn.kv_b_proj.weight"] = ck_.at("model.layers.2.self_attn.kv_b_proj.weight");
  q.erase("model.layers.2.self_attn.kv_b_proj.weight_scale_inv");
  const std::string e = error_of(q, cfg_);
  EXPECT_NE(e.find("tensor 'model.layers.2.self_attn.kv_b_proj.weight' is F32 and has no block scale"),
            std::string::npos)
      << e;
}

TEST_F(LoaderFp8Errors, FP8WithoutQuantizationConfig) {
  const std::string e = error_of(q_, fixture("a_fp32").config);
  EXPECT_NE(e.find("is F8_E4M3 but config.json has no quantization_config"), std::string::npos) << e;
}

TEST_F(LoaderFp8Errors, U8ScalesNeedUe8m0) {
  QuantOptions o;
  o.bo = 48;
  o.bi = 40;
  o.fmt = ScaleFmt::UE8M0_U8;
  const std::string e = error_of(quantize(ck_, o).first, cfg_);
  EXPECT_NE(e.find("is U8 but quantization_config.scale_fmt is not \"ue8m0\""), std::string::npos) << e;
}

// ---- mtp_quant_algo --------------------------------------------------------------------------------------

class LoaderMtpQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    const Fixture& f = fixture("a_fp32");
    Ckpt ck = f.ckpt;
    split_experts(ck);
    QuantOptions o;
    auto qd = quantize(ck, o);
    q_ = qd.first;
    d_ = qd.second;
    // the same with the MTP layer left unquantized
    QuantOptions keep;
    keep.keep_unquantized = [](const std::string& n) { return n.rfind("model.mtp_layers.", 0) == 0; };
    auto qd2 = quantize(ck, keep);
    q_bf_mtp_ = qd2.first;
    d_bf_mtp_ = qd2.second;
    cfg_ = fp8_config(f.config, 128, 128, false);
  }
  Ckpt q_, d_, q_bf_mtp_, d_bf_mtp_;
  json cfg_;
};

TEST_F(LoaderMtpQuant, Bf16DraftIsUnquantized) {
  const Fixture& f = fixture("a_fp32");
  json cfg = cfg_;
  cfg["mtp_quant_algo"] = "BF16";
  expect_close(run(write_ckpt("q", q_bf_mtp_, cfg), f.prompt), run(write_ckpt("d", d_bf_mtp_, f.config), f.prompt),
               1e-5);
  // ... and an FP8 draft tensor is then an error
  const std::string e = load_error(write_ckpt("bad", q_, cfg));
  EXPECT_NE(e.find("tensor 'model.mtp_layers.0.self_attn.o_proj.weight' is F8_E4M3 but mtp_quant_algo is BF16"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("model.layers."), std::string::npos) << e;
}

TEST_F(LoaderMtpQuant, NoneAndFp8UseTheQuantizationConfig) {
  const Fixture& f = fixture("a_fp32");
  const Outputs ref = run(write_ckpt("d", d_, f.config), f.prompt);
  for (const char* algo : {"NONE", "none", "FP8"}) {
    json cfg = cfg_;
    cfg["mtp_quant_algo"] = algo;
    expect_close(run(write_ckpt(std::string("q_") + algo, q_, cfg), f.prompt), ref, 1e-5);
  }
}

TEST_F(LoaderMtpQuant, UnknownAlgoWarnsAndUsesTheBackbone) {
  const Fixture& f = fixture("a_fp32");
  json cfg = cfg_;
  cfg["mtp_quant_algo"] = "INT4";
  const std::string dir = write_ckpt("q", q_, cfg);
  ::testing::internal::CaptureStderr();
  Outputs o = run(dir, f.prompt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: unknown mtp_quant_algo 'INT4'"), std::string::npos) << err;
  expect_close(o, run(write_ckpt("d", d_, f.config), f.prompt), 1e-5);
}

// An MTP module left unquantized and named only in exclude_modules: the backbone's config (union of the three
// lists) covers it, but the draft config mtp_quant_algo FP8 builds reads ignored_layers / modules_to_not_convert.
TEST_F(LoaderMtpQuant, Fp8DraftConfigReadsOnlyIgnoredLayersOrModulesToNotConvert) {
  const Fixture& f = fixture("a_fp32");
  Ckpt q = q_;
  const std::string w = "model.mtp_layers.0.self_attn.linear_gate.weight";
  q[w] = d_.at(w);
  q.erase(w + "_scale_inv");
  json cfg = cfg_;
  cfg["quantization_config"]["exclude_modules"] = {"model.mtp_layers.0.self_attn.linear_gate"};
  expect_close(run(write_ckpt("none", q, cfg), f.prompt), run(write_ckpt("d", d_, f.config), f.prompt), 1e-5);
  cfg["mtp_quant_algo"] = "FP8";
  const std::string e = load_error(write_ckpt("fp8", q, cfg));
  EXPECT_NE(e.find("tensor '" + w + "' is F32 and has no block scale"), std::string::npos) << e;
}

// ---- inspect ---------------------------------------------------------------------------------------------

TEST(CheckpointInfo, DescribesLayoutNamingQuantizationAndProblems) {
  const Fixture& f = fixture("b_fp32");
  Ckpt ck = f.ckpt;
  split_experts(ck);
  fuse_projections(ck);
  QuantOptions o;
  o.bo = 16;
  o.bi = 24;
  o.fmt = ScaleFmt::UE8M0_U8;
  Ckpt q = quantize(ck, o).first;
  flatten_mtp(q, f.L, {0});
  q["model.layers.0.self_attn.k_scale"] = f32_tensor({}, {1.0f});
  json cfg = fp8_config(f.config, 16, 24, true, {"lm_head"});
  cfg["mtp_quant_algo"] = "BF16";
  const CheckpointInfo info = inspect_checkpoint(write_ckpt("x", q, cfg));
  const json j = checkpoint_info_json(info);
  EXPECT_EQ(j["architectures"], json::array({"HYV4ForCausalLM"}));
  EXPECT_EQ(j["sizes"]["num_hidden_layers"], 4);
  EXPECT_GT(j["sizes"]["params"].get<int64_t>(), 0);
  EXPECT_GT(j["sizes"]["bytes_by_dtype"]["F8_E4M3"].get<int64_t>(), 0);
  EXPECT_EQ(j["layers"][0]["mlp"], "dense");
  EXPECT_EQ(j["layers"][1]["mlp"], "sparse");
  EXPECT_EQ(j["quantization"]["weight_block_size"], json::array({16, 24}));
  EXPECT_EQ(j["quantization"]["scale_fmt"], "ue8m0");
  EXPECT_EQ(j["quantization"]["ignored_modules"], json::array({"lm_head"}));
  EXPECT_EQ(j["mtp"]["naming"], "both");  // layer 0 flattened, layer 1 as model.mtp_layers.1
  EXPECT_EQ(j["mtp"]["layers_found"], json::array({0, 1}));
  EXPECT_EQ(j["mtp"]["draft_fp8"], false);
  EXPECT_EQ(j["tensor_names"]["expert_layout"], "split");
  EXPECT_NE(std::find(j["tensor_names"]["forms"].begin(), j["tensor_names"]["forms"].end(), "vllm"),
            j["tensor_names"]["forms"].end());
  EXPECT_EQ(j["infos"].size(), 1u);
  // The draft is declared BF16 but its tensors are FP8: the loader would refuse, inspect says why.
  EXPECT_FALSE(info.loadable);
  ASSERT_FALSE(j["errors"].empty());
  EXPECT_NE(j["errors"][0].get<std::string>().find("mtp_quant_algo is BF16"), std::string::npos) << j["errors"][0];
  const std::string text = checkpoint_info_text(info);
  EXPECT_NE(text.find("loadable:      no"), std::string::npos) << text;
}

TEST(CheckpointInfo, FixturesAreLoadable) {
  for (const char* name : {"a_fp32", "b_fp32", "c_bf16"}) {
    const CheckpointInfo info = inspect_checkpoint(fixture(name).dir);
    EXPECT_TRUE(info.loadable) << name << ": " << info.report.error_message(name);
    EXPECT_TRUE(info.report.warnings.empty()) << name;
    EXPECT_EQ(info.report.expert_layout, "fused");
    EXPECT_EQ(info.report.mtp_naming, "model.mtp_layers.N");
  }
  EXPECT_EQ(checkpoint_info_json(inspect_checkpoint(fixture("b_fp32").dir))["tensor_names"]["forms"],
            json::array({"internal"}));
}

}  // namespace
}  // namespace nextn
