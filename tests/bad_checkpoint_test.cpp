// Bad checkpoints that get past the file format (P7): non-finite weights, config values that ruin the
// float32 forward or mean nothing, sizes that would allocate without bound, a tied head stored anyway. Each
// test copies a fixture checkpoint into a scratch folder, breaks one thing, and checks that the error names
// it (or that the behaviour stays bounded), in process and through the `nextn` command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "models/hy_v4/checkpoint_info.h"
#include "models/hy_v4/model.h"
#include "engine/generator.h"
#include "test_util.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- checkpoints in scratch folders ------------------------------------------------------------------

// This process's scratch folder (removed at exit); one sub-folder per checkpoint a test writes.
fs::path scratch(const std::string& name) {
  static const struct Root {
    fs::path path = fs::path(::testing::TempDir()) / ("nextn_bad_ckpt_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } root;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = root.path / (std::string(info->test_suite_name()) + "." + info->name()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct StoredTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A fixture checkpoint in memory (config and every tensor's bytes), to break and write out again.
struct Checkpoint {
  json config;
  std::map<std::string, StoredTensor> tensors;

  static Checkpoint of(const std::string& dir) {
    Checkpoint c;
    std::ifstream in(dir + "/config.json");
    c.config = json::parse(in);
    SafetensorsFile f(dir + "/model.safetensors");
    for (const TensorView& t : f.tensors()) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      c.tensors[t.name] = {t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)};
    }
    return c;
  }
  // Element i of tensor `name` set to these raw bits (sizeof(T) must be the dtype's size).
  template <class T>
  void set_bits(const std::string& name, int64_t i, T bits) {
    StoredTensor& t = tensors.at(name);
    ASSERT_EQ(sizeof(T), dtype_size(t.dtype)) << name;
    ASSERT_LE(size_t(i + 1) * sizeof(T), t.bytes.size()) << name;
    std::memcpy(t.bytes.data() + i * sizeof(T), &bits, sizeof(T));
  }
  void set_f32(const std::string& name, int64_t i, float v) { set_bits(name, i, v); }
  std::string write(const std::string& name) const {
    const fs::path dir = scratch(name);
    SafetensorsWriter w;
    for (const auto& [n, t] : tensors) w.add(n, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    w.write((dir / "model.safetensors").string());
    std::ofstream(dir / "config.json") << config.dump(2);
    return dir.string();
  }
};

const std::string kA = testing::fixture_dir("a_fp32");  // 5 layers, 1 MTP layer, context 256
std::string fp8_fixture(const std::string& name) {
  return std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4_fp8/" + name;
}
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// The nextn::Error message of loading `dir` ("" when it loads).
std::string load_error(const std::string& dir) {
  try {
    HYV4Model m(dir, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The nextn::Error message of `fn` ("" when it throws none).
template <class F>
std::string error_of(const F& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

SamplingParams greedy(int max_tokens) {
  SamplingParams sp;
  sp.max_tokens = max_tokens;
  return sp;
}

SpecOptions speculation(bool on) {
  SpecOptions so;
  so.enabled = on;
  so.num_speculative_tokens = 3;
  return so;
}

std::vector<int32_t> ids(std::initializer_list<int32_t> v) { return v; }

// ---- the command line ------------------------------------------------------------------------------------

struct CliRun {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `nextn ARGS` (stderr apart); with `address_space_mib`, under that limit of virtual memory (ulimit -v).
CliRun nextn_cli(const std::string& args, int64_t address_space_mib = 0) {
  const std::string err_file = scratch("stderr").string() + "/err.txt";
  std::string cmd = std::string(NEXTN_CLI_PATH) + " " + args + " 2>" + err_file + " </dev/null";
  if (address_space_mib > 0) cmd = "ulimit -v " + std::to_string(address_space_mib * 1024) + "; exec " + cmd;
  CliRun r{-1, "", ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err_file);
  return r;
}

bool address_sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

// Enough address space for these tiny models and two threads (the bounds below fail by gigabytes).
constexpr int64_t kAddressSpaceMib = 2048;

// ---- non-finite weights ----------------------------------------------------------------------------------

TEST(NonFiniteWeights, SmallVectorsAreCheckedAtLoadNamingTensorAndIndex) {
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("model.layers.2.post_attention_layernorm.weight", 5, kNaN);
  std::string e = load_error(c.write("norm"));
  EXPECT_NE(e.find("tensor 'model.layers.2.post_attention_layernorm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("1 non-finite value(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("first at index 5"), std::string::npos) << e;

  Checkpoint s = Checkpoint::of(kA);  // a sink, by its hub name
  s.set_f32("model.layers.0.self_attn.learnable_sink_param", 1, -kInf);
  s.set_f32("model.layers.0.self_attn.learnable_sink_param", 3, kInf);
  e = load_error(s.write("sink"));
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.learnable_sink_param'"), std::string::npos) << e;
  EXPECT_NE(e.find("2 non-finite value(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("first at index 1"), std::string::npos) << e;
}

TEST(NonFiniteWeights, LmHeadStopsGenerationAtTheFirstTargetForward) {
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("lm_head.weight", 7 * 64 + 3, kNaN);  // one weight of token 7's row: its logit is NaN
  const std::string dir = c.write("lm_head");
  HYV4Model m(dir, nullptr);  // mapped weights are not scanned at load
  for (bool spec : {false, true}) {
    Generator g(m);
    const std::string e = error_of([&] { g.generate(ids({1, 2, 3}), greedy(8), speculation(spec)); });
    EXPECT_NE(e.find("target forward at position 2"), std::string::npos) << "speculate " << spec << ": " << e;
    EXPECT_NE(e.find("non-finite logits"), std::string::npos) << e;
  }
}

TEST(NonFiniteWeights, AnEmbeddingRowStopsGenerationAtThePositionItIsFed) {
  const std::vector<int32_t> prompt = ids({1, 2, 3});
  HYV4Model clean(kA, nullptr);
  const std::vector<int32_t> out = Generator(clean).generate(prompt, greedy(4), speculation(false)).ids;
  ASSERT_EQ(out.size(), 4u);
  // The first generated token that is neither in the prompt nor the one before it: its row is fed at n + i.
  size_t i = 1;
  while (i < out.size() && (std::find(prompt.begin(), prompt.end(), out[i]) != prompt.end() ||
                            std::find(out.begin(), out.begin() + i, out[i]) != out.begin() + i))
    ++i;
  ASSERT_LT(i, out.size()) << "the fixture's greedy output repeats the prompt";
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("model.embed_tokens.weight", int64_t(out[i]) * 64 + 10, kInf);
  HYV4Model m(c.write("embed"), nullptr);
  Generator g(m);
  GenerationResult partial;
  const std::string e = error_of([&] {
    g.generate(prompt, greedy(4), speculation(false), [&](int32_t t) {
      partial.ids.push_back(t);
      return true;
    });
  });
  EXPECT_NE(e.find("target forward at position " + std::to_string(prompt.size() + i)), std::string::npos) << e;
  // Everything before the bad row came out as from the clean checkpoint.
  EXPECT_EQ(partial.ids, std::vector<int32_t>(out.begin(), out.begin() + i + 1));
}

TEST(NonFiniteWeights, AnMtpWeightStopsTheDraftStepAndLeavesPlainDecodingAlone) {
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("model.mtp_layers.0.eh_proj.weight", 0, kNaN);
  HYV4Model m(c.write("mtp"), nullptr);
  Generator g(m);
  const std::string e = error_of([&] { g.generate(ids({1, 2, 3}), greedy(8), speculation(true)); });
  EXPECT_NE(e.find("MTP draft step 0 (MTP layer 0, position 2)"), std::string::npos) << e;
  HYV4Model clean(kA, nullptr);
  EXPECT_EQ(g.generate(ids({1, 2, 3}), greedy(8), speculation(false)).ids,
            Generator(clean).generate(ids({1, 2, 3}), greedy(8), speculation(false)).ids);
}

TEST(NonFiniteWeights, Fp8ScalesStopTheTargetForwardAndScanFindsEveryFp8Nan) {
  struct Case {
    const char* fixture;
    std::string tensor;
    int64_t index;
    uint32_t bits;          // raw bits of the element's dtype
    bool reaches_logits;    // e4m3 NaN codes decode as ±480 · scale in the kernels: no forward shows them
  };
  const Case cases[] = {
      {"fp8_f32scale", "model.layers.0.mlp.down_proj.weight_scale_inv", 1, 0x7fc00000u, true},  // f32 NaN scale
      {"fp8_ue8m0", "model.layers.0.mlp.down_proj.weight_scale_inv", 1, 0xffu, true},          // ue8m0 NaN scale
      {"fp8_ue8m0", "model.layers.0.mlp.down_proj.weight", 100, 0x7fu, false},                 // e4m3 NaN
      {"fp8_ue8m0", "model.layers.1.self_attn.o_proj.weight", 5, 0xffu, false},                // e4m3 -NaN
  };
  for (const Case& k : cases) {
    Checkpoint c = Checkpoint::of(fp8_fixture(k.fixture));
    const DType dt = c.tensors.at(k.tensor).dtype;
    if (dt == DType::F32)
      c.set_bits(k.tensor, k.index, k.bits);
    else
      c.set_bits(k.tensor, k.index, static_cast<uint8_t>(k.bits));
    const std::string dir = c.write(std::string(k.fixture) + "_" + std::to_string(k.bits));
    HYV4Model m(dir, nullptr);
    if (k.reaches_logits) {
      const std::string e = error_of([&] { Generator(m).generate(ids({4, 5, 6}), greedy(4), speculation(true)); });
      EXPECT_NE(e.find("target forward at position 2"), std::string::npos) << k.tensor << ": " << e;
    }
    // The pass that faults the weights in before generation reads every value of a float dtype (U8 ue8m0
    // scales are left to the logits check above).
    const std::string pe = error_of([&] { m.prefault(false); });
    if (dt == DType::U8) {
      EXPECT_EQ(pe, "") << k.tensor;
    } else {
      EXPECT_NE(pe.find("tensor '" + k.tensor + "'"), std::string::npos) << pe;
      EXPECT_NE(pe.find("1 non-finite value(s) (NaN or inf), the first at index " + std::to_string(k.index)),
                std::string::npos)
          << pe;
    }
    const CheckpointInfo info = inspect_checkpoint(dir, /*scan=*/true);
    EXPECT_FALSE(info.loadable) << k.tensor;
    ASSERT_EQ(info.non_finite.size(), 1u) << k.tensor;
    EXPECT_EQ(info.non_finite[0].name, k.tensor);
    EXPECT_EQ(info.non_finite[0].count, 1);
    EXPECT_EQ(info.non_finite[0].first, k.index);
  }
}

TEST(NonFiniteWeights, AnFp8IndexerKeyIsCheckedWhenDequantizedAtLoad) {
  Checkpoint c = Checkpoint::of(fp8_fixture("fp8_ue8m0"));
  // wk [16, 64] in 32 x 32 blocks: the second scale covers columns 32..63 of all 16 rows.
  c.set_bits("model.layers.0.self_attn.indexer.wk.weight_scale_inv", 1, uint8_t{0xff});
  const std::string e = load_error(c.write("wk"));
  EXPECT_NE(e.find("FP8 tensor 'model.layers.0.self_attn.indexer.wk.weight' dequantizes to 512 non-finite value(s)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("first at index 32"), std::string::npos) << e;
}

// ---- nextn inspect --scan ------------------------------------------------------------------------------

TEST(ScanNonFinite, EveryStoredDtypeByItsOwnBitPatterns) {
  const fs::path dir = scratch("dtypes");
  SafetensorsWriter w;
  auto add = [&](const std::string& name, DType dt, std::vector<uint8_t> bytes) {
    const int64_t n = int64_t(bytes.size() / dtype_size(dt));
    w.add(name, dt, {n}, bytes.data(), bytes.size());
  };
  auto f32 = [](std::vector<float> v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  auto u16 = [](std::vector<uint16_t> v) {
    std::vector<uint8_t> b(v.size() * 2);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  const double dinf = std::numeric_limits<double>::infinity();
  std::vector<uint8_t> f64(3 * 8);
  const double dv[3] = {1.0, dinf, -2.0};
  std::memcpy(f64.data(), dv, sizeof dv);
  add("a.f32", DType::F32, f32({0, 1, 2, 3, kNaN, 5, 6, -kInf, 8, 9}));
  add("b.f32_clean", DType::F32, f32({0, 1e38f, -3.4e38f, 1e-45f}));
  add("c.f64", DType::F64, f64);
  add("d.bf16", DType::BF16, u16({0x7fc0, 0x3f80, 0xff80}));  // NaN, 1, -inf
  add("e.f16", DType::F16, u16({0x3c00, 0x7bff, 0x3c00, 0x3c00, 0x3c00, 0x7c00}));  // ..., max finite, ..., inf
  add("f.e4m3", DType::F8_E4M3, {0x00, 0x38, 0xff, 0x7e, 0xfe, 0x01, 0x7f, 0x80});  // -NaN at 2, NaN at 6
  add("g.e4m3_clean", DType::F8_E4M3, {0x7e, 0xfe, 0x00, 0x80});                    // ±448 is finite
  add("h.e8m0", DType::F8_E8M0, {0x7f, 0x00, 0xfe, 0xff});
  add("i.weight_scale_inv", DType::U8, {0xff, 0x7f, 0x80, 0x00});  // a ue8m0 block scale stored as U8
  add("j.token_counts", DType::U8, {0xff, 0xff});                    // plain bytes: not a float
  const int32_t all_ones = -1;
  w.add("k.i32", DType::I32, {1}, &all_ones, 4);
  w.write((dir / "model.safetensors").string());

  const std::vector<NonFiniteTensor> bad = scan_non_finite(WeightStore::open_dir(dir.string()));
  std::map<std::string, std::pair<int64_t, int64_t>> got;  // name -> (count, first)
  for (const NonFiniteTensor& t : bad) got[t.name] = {t.count, t.first};
  const std::map<std::string, std::pair<int64_t, int64_t>> want = {
      {"a.f32", {2, 4}},  {"c.f64", {1, 1}},  {"d.bf16", {2, 0}},          {"e.f16", {1, 5}},
      {"f.e4m3", {2, 2}}, {"h.e8m0", {1, 3}}, {"i.weight_scale_inv", {1, 0}}};
  EXPECT_EQ(got, want);
  for (const NonFiniteTensor& t : bad) EXPECT_EQ(t.file, (dir / "model.safetensors").string()) << t.name;
}

TEST(ScanNonFinite, InspectScanSaysNotLoadableAndNamesTheTensor) {
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("lm_head.weight", 300, kNaN);
  c.set_f32("lm_head.weight", 301, kNaN);
  const std::string dir = c.write("lm_head");
  // Without --scan the mapped weights are not read: the header checks pass.
  EXPECT_EQ(nextn_cli("inspect " + dir).status, 0);
  const CliRun r = nextn_cli("inspect --scan " + dir);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("tensor 'lm_head.weight'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 non-finite value(s) (NaN or inf), the first at index 300"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loadable:      no"), std::string::npos) << r.out;
  const CliRun j = nextn_cli("inspect " + dir + " --scan --json");
  EXPECT_EQ(j.status, 1);
  const json out = json::parse(j.out);
  ASSERT_EQ(out["scan"]["non_finite"].size(), 1u) << j.out;
  EXPECT_EQ(out["scan"]["non_finite"][0]["tensor"], "lm_head.weight");
  EXPECT_EQ(out["scan"]["non_finite"][0]["count"], 2);
  EXPECT_EQ(out["loadable"], false);

  const CliRun clean = nextn_cli("inspect --scan " + kA);
  EXPECT_EQ(clean.status, 0) << clean.out;
  EXPECT_NE(clean.out.find("no NaN or inf"), std::string::npos) << clean.out;
}

TEST(ScanNonFinite, LogitsAndGenerateRefuseNonFiniteOutput) {
  // Finite weights whose products overflow: lm_head row 9 at the float maximum makes logit 9 infinite.
  Checkpoint c = Checkpoint::of(kA);
  for (int64_t col = 0; col < 64; ++col) c.set_f32("lm_head.weight", 9 * 64 + col, 3.4e38f);
  const std::string dir = c.write("lm_head_overflow");
  const std::string out = scratch("out").string() + "/logits.safetensors";
  const CliRun l = nextn_cli("logits --model " + dir + " --ids 1,2,3 --output " + out + " --threads 1");
  EXPECT_EQ(l.status, 1) << l.err;
  EXPECT_NE(l.err.find("the target's logits hold 3 non-finite value(s)"), std::string::npos) << l.err;
  EXPECT_NE(l.err.find("row 0, column 9"), std::string::npos) << l.err;
  EXPECT_FALSE(fs::exists(out));
  const CliRun g = nextn_cli("generate --model " + dir + " --ids 1,2,3 -n 4 --threads 1");
  EXPECT_EQ(g.status, 1) << g.err;
  EXPECT_NE(g.err.find("target forward at position 2 produced non-finite logits"), std::string::npos) << g.err;
}

TEST(ScanNonFinite, LogitsAndGenerateRefuseANonFiniteWeightBeforeTheFirstForward) {
  Checkpoint c = Checkpoint::of(kA);
  c.set_f32("lm_head.weight", 9 * 64, -kInf);
  const std::string dir = c.write("lm_head");
  const std::string out = scratch("out").string() + "/logits.safetensors";
  for (const std::string& cmd : {"logits --model " + dir + " --ids 1,2,3 --output " + out + " --threads 1",
                                 "generate --model " + dir + " --ids 1,2,3 -n 4 --threads 1"}) {
    const CliRun r = nextn_cli(cmd);
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("tensor 'lm_head.weight' in " + dir + "/model.safetensors (F32) has 1 non-finite value(s) "
                         "(NaN or inf), the first at index 576"),
              std::string::npos)
        << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
}

// ---- config values and sizes against the checkpoint ----------------------------------------------------

TEST(ConfigAgainstTensors, AMissingSizeIsOneLineNamingTheField) {
  Checkpoint c = Checkpoint::of(kA);
  c.config.erase("hidden_size");
  std::string e = load_error(c.write("no_hidden"));
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;  // one line, not a shape error per tensor
  EXPECT_NE(e.find("config.json: field 'hidden_size' is missing, and transformers' default 2816 does not fit tensor "
                   "'model.embed_tokens.weight' [256, 64]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("(hidden_size = 64)"), std::string::npos) << e;

  Checkpoint v = Checkpoint::of(kA);
  v.config["vocab_size"] = 300;
  e = load_error(v.write("vocab"));
  EXPECT_NE(e.find("field 'vocab_size' is 300, which does not fit tensor 'model.embed_tokens.weight' [256, 64]"),
            std::string::npos)
      << e;

  Checkpoint l = Checkpoint::of(kA);
  for (const char* k : {"num_hidden_layers", "mlp_layer_types", "indexer_types"}) l.config.erase(k);
  e = load_error(l.write("layers"));
  EXPECT_NE(e.find("field 'num_hidden_layers' is missing, and transformers' default 34 does not fit the checkpoint: "
                   "its layers end at model.layers.4.*"),
            std::string::npos)
      << e;
}

TEST(ConfigAgainstTensors, HugeSizesFailBeforeAnythingIsAllocated) {
  if (address_sanitized()) GTEST_SKIP() << "an address-space limit does not work with AddressSanitizer";
  Checkpoint c = Checkpoint::of(kA);
  c.config["hidden_size"] = int64_t(1) << 28;  // used to allocate 1 GiB per norm vector before the shape check
  const std::string dir = c.write("hidden");
  for (const std::string& cmd : {"inspect " + dir, "generate --model " + dir + " --ids 1,2,3 -n 2 --threads 2"}) {
    const CliRun r = nextn_cli(cmd, kAddressSpaceMib);
    EXPECT_EQ(r.status, 1) << cmd;
    EXPECT_NE((r.out + r.err).find("field 'hidden_size' is 268435456, which does not fit tensor"), std::string::npos)
        << cmd << ": " << r.out << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  c.config["hidden_size"] = int64_t(1) << 40;
  const std::string e = load_error(c.write("hidden40"));
  EXPECT_NE(e.find("field 'hidden_size' is 1099511627776, more than nextn supports"), std::string::npos) << e;
}

TEST(ConfigAgainstTensors, ValuesThatBreakTheFloatForwardAreRefusedAtLoad) {
  const std::pair<std::string, json> cases[] = {
      {"routed_scaling_factor", 1e38}, {"rms_norm_eps", 1e300}, {"hc_magnitude", -2.0}, {"swiglu_limit", 1e300}};
  for (const auto& [field, value] : cases) {
    Checkpoint c = Checkpoint::of(kA);
    c.config[field] = value;
    const std::string e = load_error(c.write(field));
    EXPECT_NE(e.find("field '" + field + "'"), std::string::npos) << e;
  }
  Checkpoint t = Checkpoint::of(kA);
  t.config["rope_parameters"]["rope_theta"] = 1e-300;
  EXPECT_NE(load_error(t.write("theta")).find("field 'rope_parameters.rope_theta' is 1e-300"), std::string::npos);
}

// ---- context and memory ------------------------------------------------------------------------------------

TEST(ContextLimits, APromptLongerThanTheContextIsAnError) {
  HYV4Model m(kA, nullptr);
  const std::vector<int32_t> prompt(257, 5);
  const std::string e = error_of([&] { Generator(m).generate(prompt, greedy(1), speculation(true)); });
  EXPECT_NE(e.find("the prompt has 257 tokens, more than the model's context of 256 (max_position_embeddings)"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([&] { m.new_cache(257); }).find("max_position_embeddings = 256"), std::string::npos);
  EXPECT_NE(error_of([&] { m.new_draft_cache(257); }).find("max_position_embeddings = 256"), std::string::npos);
}

TEST(ContextLimits, MaxTokensIsCutToTheContextLeft) {
  HYV4Model m(kA, nullptr);
  std::vector<int32_t> prompt(250);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + i % 200);
  for (bool spec : {false, true}) {
    SamplingParams sp = greedy(1000);
    ::testing::internal::CaptureStderr();
    const GenerationResult r = Generator(m).generate(prompt, sp, speculation(spec));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.ids.size(), 6u) << "speculate " << spec;
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_NE(err.find("max_tokens 1000 is more than the context leaves (6 of 256 after the prompt's 250 tokens): "
                       "generating at most 6 tokens"),
              std::string::npos)
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  // A prompt that fills the context leaves nothing to generate.
  const GenerationResult full = Generator(m).generate(std::vector<int32_t>(256, 7), greedy(3), speculation(false));
  EXPECT_TRUE(full.ids.empty());
  EXPECT_EQ(full.finish_reason, "length");
}

TEST(ContextLimits, CacheBytesAreCheckedBeforeAllocating) {
  Checkpoint c = Checkpoint::of(kA);
  c.config["max_position_embeddings"] = std::numeric_limits<int32_t>::max();
  HYV4Model m(c.write("long_context"), nullptr);
  // 2^31 positions of 5 layers' latents and keys, 928 bytes each: about 2 TB, refused by arithmetic before
  // any allocation (not by bad_alloc, nor by swapping).
  if (double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) > 1.9e12) GTEST_SKIP() << "2 TB of memory";
  const std::string e = error_of([&] { m.new_cache(std::numeric_limits<int32_t>::max()); });
  EXPECT_NE(e.find("a KV cache of 2147483647 positions needs"), std::string::npos) << e;
  EXPECT_NE(e.find("more than this machine's memory"), std::string::npos) << e;
  const std::string g =
      error_of([&] { Generator(m).generate(ids({1, 2, 3}), greedy(std::numeric_limits<int>::max()), speculation(true)); });
  EXPECT_NE(g.find("more than this machine's memory"), std::string::npos) << g;
}

TEST(ContextLimits, IndexTopkBeyondTheContextAllocatesByTheContext) {
  Checkpoint c = Checkpoint::of(kA);
  c.config["index_topk"] = int64_t(1) << 28;  // used to take 1 GiB per row of top-k slots
  const std::string huge = c.write("topk_huge");
  c.config["index_topk"] = 256;  // the whole context: the same selection (every position)
  const std::string whole = c.write("topk_context");
  const std::vector<int32_t> prompt = ids({5, 9, 2, 77, 31});
  auto logits_of = [&](const std::string& dir) {
    HYV4Model m(dir, nullptr);
    KVCache cache = m.new_cache(16);
    std::vector<float> out(prompt.size() * 256);
    m.forward(prompt.data(), int64_t(prompt.size()), cache, out.data(), nullptr);
    return out;
  };
  EXPECT_EQ(logits_of(huge), logits_of(whole));
  if (address_sanitized()) return;
  const CliRun r = nextn_cli("generate --model " + huge + " --ids 1,2,3 -n 8 --ignore-eos --threads 2 --json", kAddressSpaceMib);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"].size(), 8u) << r.out;
}

TEST(ContextLimits, AMillionTokensRunToTheEndOfTheContextInBoundedMemory) {
  if (address_sanitized()) GTEST_SKIP() << "an address-space limit does not work with AddressSanitizer";
  const CliRun r = nextn_cli("generate --model " + kA + " --ids 1,2,3 -n 1000000 --ignore-eos --threads 2 --json", kAddressSpaceMib);
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["ids"].size(), 253u);
  EXPECT_EQ(out["finish_reason"], "length");
  EXPECT_NE(r.err.find("nextn: note: max_tokens 1000000 is more than the context leaves"), std::string::npos) << r.err;
}

// ---- tied embeddings ---------------------------------------------------------------------------------------

TEST(TiedEmbeddings, AStoredLmHeadIsNotUsedAndSaysSoOnce) {
  Checkpoint tied = Checkpoint::of(kA);
  tied.config["tie_word_embeddings"] = true;
  const std::string tied_dir = tied.write("tied");
  Checkpoint copied = Checkpoint::of(kA);  // what tying means: the head is the embedding
  copied.tensors["lm_head.weight"] = copied.tensors.at("model.embed_tokens.weight");
  const std::string copied_dir = copied.write("copied");
  const std::vector<int32_t> prompt = ids({1, 2, 3, 4});
  auto logits_of = [&](HYV4Model& m) {
    KVCache cache = m.new_cache(8);
    std::vector<float> out(prompt.size() * 256);
    m.forward(prompt.data(), int64_t(prompt.size()), cache, out.data(), nullptr);
    return out;
  };
  ::testing::internal::CaptureStderr();
  HYV4Model m(tied_dir, nullptr);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("nextn: warning: tie_word_embeddings is true: tensor 'lm_head.weight' in " + tied_dir +
                     "/model.safetensors is not used"),
            std::string::npos)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  HYV4Model reference(copied_dir, nullptr);
  EXPECT_EQ(logits_of(m), logits_of(reference));
}

}  // namespace
}  // namespace nextn
