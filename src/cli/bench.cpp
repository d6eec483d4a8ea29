// `nextn bench`: measures, in one run, the machine's read bandwidth, the decode speed and the bandwidth it
// achieves, the cost of a (k+1)-token verify step relative to a 1-token step, and tokens/s with MTP
// speculation — on a given checkpoint or on a synthetic one large enough that DRAM, not cache, is measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threadpool.h"
#include "io/tokenizer.h"
#include "models/hy_v4/model.h"
#include "engine/generator.h"

namespace nextn::cli {
namespace {

const char* kBenchUsage = R"(usage: nextn bench [--model DIR | --synthetic [--dtype bf16|fp8]] [options]

Measures in one run: the machine's read bandwidth (all threads), weight+cache bytes read per decode token,
decode tokens/s and the GB/s it achieves (fraction of the measured bandwidth), the time of a (k+1)-token
verify step relative to a 1-token step for k = 1..7 next to the bytes such a step reads relative to one
token (its bandwidth floor: with MoE, more rows touch more experts), and tokens/s with speculation for
k = 1..4 with the acceptance metrics (when the checkpoint has MTP layers). JSON keys include
read_bandwidth_gbps, decode_gbps, bandwidth_fraction, baseline_tokens_per_s, verify_cost, verify_bytes
and speculative.

  --model DIR        checkpoint to measure (default: the bundled model)
  --synthetic        write (once, cached) and measure a random HY V4 checkpoint at realistic width
                     (hidden 2048, 32 experts, a few GB) so that bandwidth, not cache, is measured
  --dtype bf16|fp8   weights of the synthetic checkpoint (default bf16)
  --mlp moe|dense    synthetic MLPs: 32-expert MoE (default) or dense (isolates verify cost from expert
                     coverage: k+1 tokens routed independently read up to k+1 times the expert bytes)
  --cache-dir DIR    where synthetic checkpoints live (default ~/.cache/nextn)
  --tokens N         decode tokens per measurement (default 64)
  --prompt-tokens N  prompt length (default 64)
  --threads N        worker threads, 1 to 4x the cores (default, or 0: all cores)
  --repeats N        passes (default 3; one pass is at the mercy of a noisy machine): decode is measured
                     N times, each right after a bandwidth measurement of its own, and speculation in N
                     interleaved passes over plain, k = 1..4 and tuned k; reported are the medians of the
                     per-pass bandwidth fractions and speedups (each against the same pass's plain run)
  --oracle-acceptance P  also measure speculation with drafts replaced by the target's own greedy token
                     with probability P per draft position (a what-if for a draft of that quality on this
                     checkpoint; the output stays the target's, the MTP layers still run)
  --json             print one JSON object
)";

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Best-of-5 streaming read of a 3 GiB buffer, split over the pool's threads.
double measure_read_bandwidth(ThreadPool& pool) {
  const size_t bytes = size_t(3) << 30;  // well past any L3 (480 MiB on the development VM)
  std::vector<uint64_t> buf(bytes / 8);
  parallel_for(&pool, int64_t(buf.size()), 1 << 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = uint64_t(i) * 0x9E3779B97F4A7C15ull;
  });
  double best = 0;
  std::vector<uint64_t> sums(pool.size() + 1);
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    parallel_for(&pool, int64_t(buf.size()), 1 << 16, [&](int64_t b, int64_t e, int tid) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      for (; i < e; ++i) s0 += buf[i];
      sums[tid] += s0 + s1 + s2 + s3;
    });
    best = std::max(best, double(bytes) / (now_s() - t0) / 1e9);
  }
  volatile uint64_t sink = 0;
  for (auto s : sums) sink = sink + s;
  (void)sink;
  return best;
}

// ---- synthetic checkpoint ------------------------------------------------------------------------------

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

nlohmann::json synthetic_config(bool fp8, bool dense) {
  nlohmann::json c = {{"model_type", "hy_v4"},
                      {"architectures", {"HYV4ForCausalLM"}},
                      {"vocab_size", 32000},
                      {"hidden_size", 2048},
                      {"intermediate_size", 5632},
                      {"moe_intermediate_size", 768},
                      {"num_hidden_layers", 8},
                      {"num_attention_heads", 16},
                      {"q_lora_rank", 768},
                      {"kv_lora_rank", 256},
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

// Streams a random checkpoint to disk tensor by tensor (never the whole model in memory).
void write_synthetic(const std::string& dir, bool fp8, bool dense) {
  std::filesystem::create_directories(dir);
  const auto cfg = synthetic_config(fp8, dense);
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

// ---- measurements -------------------------------------------------------------------------------------

struct DecodeResult {
  double tokens_per_s, seconds_per_token;
};

// Plain decode of `n` tokens after a prompt (greedy), timing only the decode steps.
DecodeResult time_decode(HYV4Model& m, const std::vector<int32_t>& prompt, int n) {
  const int64_t V = m.config().vocab_size;
  KVCache cache = m.new_cache(prompt.size() + n + 1);
  std::vector<float> logits(V);
  m.forward(prompt.data(), prompt.size(), cache, logits.data(), nullptr, false);
  int32_t t = Sampler::argmax(logits.data(), V);
  m.forward(&t, 1, cache, logits.data(), nullptr, false);  // warm-up step
  profile::clear();
  const double t0 = now_s();
  for (int i = 0; i < n; ++i) {
    t = Sampler::argmax(logits.data(), V);
    m.forward(&t, 1, cache, logits.data(), nullptr, false);
  }
  const double dt = now_s() - t0;
  return {n / dt, dt / n};
}

// Median time of a forward over `rows` tokens at the end of `prompt`, rolled back after each rep.
struct StepResult {
  double seconds;       // median time of a step
  double weight_bytes;  // mean weight bytes a step read (the routed experts its rows used)
};
StepResult time_step(HYV4Model& m, const std::vector<int32_t>& prompt, int rows, int reps) {
  const int64_t V = m.config().vocab_size;
  KVCache cache = m.new_cache(prompt.size() + rows + 1);
  std::vector<float> logits(int64_t(rows) * V);
  m.forward(prompt.data(), prompt.size(), cache, nullptr, nullptr);
  profile::clear();  // (NEXTN_PROFILE: the steps only)
  std::vector<int32_t> toks(rows);
  std::mt19937 rng(rows);
  std::vector<double> times;
  double bytes = 0;
  for (int r = 0; r < reps + 1; ++r) {
    for (auto& t : toks) t = int32_t(rng() % V);
    const double t0 = now_s();
    m.forward(toks.data(), rows, cache, logits.data(), nullptr, true);
    if (r > 0) {
      times.push_back(now_s() - t0);
      bytes += double(m.last_forward_weight_bytes());
    }
    cache.truncate(prompt.size());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], bytes / reps};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
struct Range {
  double lo, hi;
};
Range range(const std::vector<double>& v) {
  return {*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}
nlohmann::json range_json(const Range& r) { return {r.lo, r.hi}; }

std::vector<int32_t> bench_prompt(const std::string& dir, int64_t vocab, int n) {
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    Tokenizer tok = Tokenizer::from_dir(dir);
    static const char* kText =
        "import os\nimport sys\n\n\nclass Config:\n    \"\"\"Settings read from the environment.\"\"\"\n\n"
        "    def __init__(self, prefix=\"APP_\"):\n        self.prefix = prefix\n        self.values = {}\n"
        "        for key, value in os.environ.items():\n            if key.startswith(prefix):\n"
        "                self.values[key[len(prefix):].lower()] = value\n\n    def get(self, name, default=None):\n";
    auto ids = tok.encode(kText, true);
    if (int(ids.size()) > n) ids.resize(n);
    return ids;
  }
  std::vector<int32_t> ids(n);
  std::mt19937 rng(7);
  for (auto& t : ids) t = int32_t(3 + rng() % (vocab - 3));
  return ids;
}

// Every option of a bench run, checked before any measurement starts (a bad value is refused at once,
// not after minutes of benchmarking).
struct BenchOptions {
  bool json = false, synthetic = false, fp8 = false, dense = false;
  std::string dir;  // the checkpoint (for --synthetic: where it is written once)
  int n_tokens = 64, n_prompt = 64, repeats = 3, threads = 0;
  bool oracle = false;
  double oracle_p = 0.7;
};

// Positions a run uses beyond prompt and generated tokens: verify steps of up to 8 rows and drafts.
constexpr int kBenchExtraPositions = 16;

BenchOptions parse_bench_options(const Args& a) {
  BenchOptions o;
  o.json = a.has("json");
  o.synthetic = a.has("synthetic");
  if (o.synthetic && a.has("model")) throw UsageError("give --model or --synthetic, not both");
  for (const char* only_synthetic : {"dtype", "mlp", "cache-dir"})
    if (!o.synthetic && a.has(only_synthetic))
      throw UsageError(std::string("--") + only_synthetic + " applies to --synthetic checkpoints only");
  const std::string dtype = a.get("dtype", "bf16"), mlp = a.get("mlp", "moe");
  if (dtype != "bf16" && dtype != "fp8") throw UsageError("--dtype must be bf16 or fp8, got '" + dtype + "'");
  if (mlp != "moe" && mlp != "dense") throw UsageError("--mlp must be moe or dense, got '" + mlp + "'");
  o.fp8 = dtype == "fp8";
  o.dense = mlp == "dense";
  constexpr int kMaxTokens = 1 << 20;  // further bounded by the checkpoint's context below
  o.n_tokens = a.get_int("tokens", 64, 1, kMaxTokens);
  o.n_prompt = a.get_int("prompt-tokens", 64, 1, kMaxTokens);
  o.repeats = a.get_int("repeats", 3, 1, 100);
  o.threads = thread_count(a);
  o.oracle = a.has("oracle-acceptance");
  o.oracle_p = a.get_double("oracle-acceptance", 0.7, {0, 1});
  if (o.synthetic) {
    const char* home = std::getenv("HOME");
    const std::string cache = a.get("cache-dir", std::string(home ? home : "/tmp") + "/.cache/nextn");
    o.dir = cache + "/synthetic-hy4-v2-" + dtype + (o.dense ? "-dense" : "");
  } else {
    o.dir = a.get("model", NEXTN_DEFAULT_MODEL);
  }
  return o;
}

// What the options ask of the checkpoint (its context, MTP layers for --oracle-acceptance), from its config.
void check_against_config(const BenchOptions& o, const HYV4Config& c) {
  const int64_t positions = int64_t(o.n_prompt) + o.n_tokens + kBenchExtraPositions;
  if (positions > c.max_position_embeddings)
    throw UsageError("--prompt-tokens " + std::to_string(o.n_prompt) + " + --tokens " + std::to_string(o.n_tokens) +
                     " (+ " + std::to_string(kBenchExtraPositions) + " for verify steps and drafts) exceed " +
                     o.dir + "'s max_position_embeddings " + std::to_string(c.max_position_embeddings));
  if (o.oracle && c.num_nextn_predict_layers < 1)
    throw UsageError("--oracle-acceptance needs a checkpoint with MTP layers; " + o.dir + " has none");
}

}  // namespace

int run_bench(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "json", "synthetic"},
         {"model", "dtype", "mlp", "cache-dir", "tokens", "prompt-tokens", "threads", "repeats", "oracle-acceptance"});
  if (a.has("help")) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
  const BenchOptions o = parse_bench_options(a);
  if (o.synthetic) {
    check_against_config(o, parse_hy_v4_config(synthetic_config(o.fp8, o.dense), "synthetic checkpoint"));
    if (!std::filesystem::exists(o.dir + "/model.safetensors")) {
      std::fprintf(stderr, "writing synthetic checkpoint to %s ...\n", o.dir.c_str());
      write_synthetic(o.dir, o.fp8, o.dense);
    }
  } else {
    check_against_config(o, load_hy_v4_config(o.dir));
  }
  const std::string& dir = o.dir;
  const int n_tokens = o.n_tokens, n_prompt = o.n_prompt, repeats = o.repeats;
  const bool json = o.json;
  ThreadPool pool(o.threads);
  auto log = [&](const char* fmt, auto... args) {
    if (!json) std::fprintf(stdout, fmt, args...);
    std::fflush(stdout);
  };

  nlohmann::json out;
  const double bw = measure_read_bandwidth(pool);
  log("machine: %d threads, CPU kernels %s, read bandwidth %.2f GB/s\n", pool.size(), cpu_target_text().c_str(), bw);
  out["cpu_target"] = ops::cpu_target_name();
  out["cpu_target_forced"] = ops::cpu_target_forced();

  HYV4Model m(dir, &pool);
  m.prefault(!json);
  auto prompt = bench_prompt(dir, m.config().vocab_size, n_prompt);
  const auto& c = m.config();
  // Bytes one decode token reads: weights (active experts only) + the KV cache (latent + rope key +
  // indexer key per cached position and layer) at the mean context length of the run.
  const double ctx = double(prompt.size()) + n_tokens / 2.0;
  int own_idx = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) own_idx += c.has_own_indexer(i);
  const double cache_bytes =
      ctx * 4.0 * (double(c.num_hidden_layers) * (c.kv_lora_rank + c.qk_rope_head_dim) + own_idx * c.index_head_dim);
  const double weight_bytes = double(m.weight_bytes_total());
  const double bytes_per_token = weight_bytes + cache_bytes;
  out["model"] = dir;
  out["weight_bytes_per_token"] = weight_bytes;
  out["cache_bytes_per_token"] = cache_bytes;

  // Decode in `repeats` passes, each right after a read-bandwidth measurement of its own: the machine's
  // bandwidth drifts (a VM's by ±15% within minutes), so each pass's decode is set against the bandwidth
  // measured next to it, and the medians are reported (the first pass uses the measurement above).
  std::vector<double> pass_bw, pass_tps, pass_frac;
  DecodeResult base{};
  for (int pass = 0; pass < repeats; ++pass) {
    if (profile::enabled()) profile::clear();  // (NEXTN_PROFILE: the last pass's decode steps)
    pass_bw.push_back(pass == 0 ? bw : measure_read_bandwidth(pool));
    base = time_decode(m, prompt, n_tokens);
    pass_tps.push_back(base.tokens_per_s);
    pass_frac.push_back(bytes_per_token * base.tokens_per_s / 1e9 / pass_bw.back());
  }
  const double bw_med = median(pass_bw), tps_med = median(pass_tps), frac_med = median(pass_frac);
  const double decode_gbps = bytes_per_token * tps_med / 1e9;
  out["read_bandwidth_gbps"] = bw_med;
  out["baseline_tokens_per_s"] = tps_med;
  out["decode_gbps"] = decode_gbps;
  out["bandwidth_fraction"] = frac_med;
  const Range fr = range(pass_frac), br = range(pass_bw);
  out["bandwidth_fraction_range"] = range_json(fr);
  log("decode: %.2f tokens/s, %.1f MB read per token, %.2f GB/s = %.1f%% of read bandwidth (median of %d passes, "
      "each against its own bandwidth reading: %.1f-%.1f%%; bandwidth %.1f-%.1f GB/s)\n",
      tps_med, bytes_per_token / 1e6, decode_gbps, 100 * frac_med, repeats, 100 * fr.lo, 100 * fr.hi, br.lo, br.hi);
  // The read bandwidth is DRAM's (a buffer far larger than any cache); a checkpoint that fits in the
  // last-level cache is read from there, and its fraction of DRAM bandwidth is no bound.
  const double checkpoint_bytes = double(m.checkpoint_bytes());
  const double llc_bytes = double(std::max<long>(0, sysconf(_SC_LEVEL3_CACHE_SIZE)));
  const bool fits_in_llc = llc_bytes > 0 && checkpoint_bytes <= llc_bytes;
  out["checkpoint_bytes"] = checkpoint_bytes;
  out["llc_bytes"] = llc_bytes;
  out["fits_in_llc"] = fits_in_llc;
  if (fits_in_llc)
    log("  (the checkpoint's %.0f MB fit in the %.0f MB last-level cache: decode reads them from there, so the "
        "fraction of DRAM bandwidth above is no bound; --synthetic measures a checkpoint larger than the cache)\n",
        checkpoint_bytes / 1e6, llc_bytes / 1e6);
  if (profile::enabled()) {
    log("  (%.3f ms per decode token)\n", base.seconds_per_token * 1e3);
    profile::report(stderr, "token", n_tokens);
  }

  nlohmann::json vc;
  constexpr int kStepReps = 9;  // timed steps per size (after one untimed)
  // Against the bytes each step reads (weights with the experts its rows used, plus the cache, read once
  // per step): with MoE, more rows touch more experts, and the bytes ratio is the floor under the time ratio.
  nlohmann::json vb;
  const StepResult one = time_step(m, prompt, 1, kStepReps);
  std::string bytes_line;
  log("verify cost (time of a k+1-token step / 1-token step):");
  for (int rows = 1; rows <= 8; ++rows) {
    const StepResult st = rows == 1 ? one : time_step(m, prompt, rows, kStepReps);
    const double bytes_ratio = (st.weight_bytes + cache_bytes) / (one.weight_bytes + cache_bytes);
    vc[std::to_string(rows)] = st.seconds / one.seconds;
    vb[std::to_string(rows)] = bytes_ratio;
    log(" %d:%.2f", rows, st.seconds / one.seconds);
    char cell[32];
    std::snprintf(cell, sizeof cell, " %d:%.2f", rows, bytes_ratio);
    bytes_line += cell;
  }
  log("\n");
  log("bytes a k+1-token step reads / 1-token step (the bandwidth floor of the ratio above):%s\n", bytes_line.c_str());
  out["verify_cost"] = vc;
  out["verify_bytes"] = vb;
  if (profile::enabled()) {  // what grows with the rows of a verification step
    for (int rows : {1, 4}) {
      profile::clear();
      time_step(m, prompt, rows, kStepReps);
      log("  %d-row step:\n", rows);
      profile::report(stderr, "step", kStepReps + 1);  // every step is profiled, the untimed one too
    }
  }

  nlohmann::json specs = nlohmann::json::array();
  if (m.num_mtp_layers() > 0) {
    SamplingParams sp;
    sp.max_tokens = n_tokens;
    Generator gen(m);
    // Draft step cost relative to a target step: one MTP layer + lm_head versus the whole target.
    {
      const int64_t H = c.hidden_size, V = c.vocab_size;
      KVCache dc = m.new_draft_cache(prompt.size() + 8);
      std::vector<float> hid(prompt.size() * H), lg(V);
      KVCache tc = m.new_cache(prompt.size());
      m.forward(prompt.data(), prompt.size(), tc, nullptr, hid.data());
      m.draft_forward(0, prompt.data() + 1, hid.data(), prompt.size() - 1, 0, dc, nullptr, nullptr);
      std::vector<double> ts;
      for (int r = 0; r < 9; ++r) {
        const double t0 = now_s();
        m.draft_forward(0, &prompt.back(), hid.data() + (prompt.size() - 1) * H, 1, prompt.size() - 1, dc, nullptr,
                        hid.data());
        m.lm_head(hid.data(), 1, lg.data());
        ts.push_back(now_s() - t0);
        dc.truncate(prompt.size() - 1);
      }
      std::sort(ts.begin(), ts.end());
      out["draft_step_cost"] = ts[ts.size() / 2] / one.seconds;
      log("draft step (1 MTP layer + lm_head) = %.3f of a target step\n", ts[ts.size() / 2] / one.seconds);
    }
    // Passes over plain, k = 1..4 and tuned k (k_max 4, what `nextn generate` does by default for greedy
    // decoding), interleaved so that a slow moment of the machine hits every setting alike; each speedup
    // is taken against the plain run of the same pass, then the median over the passes is reported.
    constexpr int kSettings = 6;  // plain, k = 1..4, tuned
    std::vector<double> tps[kSettings], ratio[kSettings];
    GenerationResult last[kSettings];
    for (int pass = 0; pass < repeats; ++pass)
      for (int i = 0; i < kSettings; ++i) {
        SpecOptions so;
        so.enabled = i > 0;
        so.num_speculative_tokens = i == 5 ? 4 : std::max(i, 1);
        so.tune_k = i == 5;
        last[i] = gen.generate(prompt, sp, so);
        tps[i].push_back(last[i].stats.tokens_per_second());
        ratio[i].push_back(tps[i].back() / tps[0].back());
      }
    const double base_tps = median(tps[0]);
    out["generate_baseline_tokens_per_s"] = base_tps;
    out["speculative_repeats"] = repeats;
    log("speculative (greedy, plain %.2f tokens/s; medians of %d interleaved passes, speedup range in brackets):\n",
        base_tps, repeats);
    for (int k = 1; k <= 4; ++k) {
      const SpecStats& st = last[k].stats;
      const double sp_med = median(ratio[k]);
      const Range rk = range(ratio[k]);
      const SpecStats::DecodeShares split = st.decode_shares();
      specs.push_back({{"k", k},
                       {"tokens_per_s", median(tps[k])},
                       {"mean_acceptance_length", st.mean_acceptance_length()},
                       {"per_position_acceptance", st.per_position_acceptance()},
                       {"speedup", sp_med},
                       {"speedup_range", range_json(rk)},
                       {"decode_split", {{"verify", split.verify}, {"catch_up", split.catch_up}, {"draft", split.draft}}}});
      log("  k=%d: %.2f tokens/s (%.2fx [%.2f-%.2f]), mean acceptance length %.2f; decode time (last pass): %s\n", k,
          median(tps[k]), sp_med, rk.lo, rk.hi, st.mean_acceptance_length(), st.round_split_text().c_str());
    }
    const SpecStats& tst = last[5].stats;
    const Range rt = range(ratio[5]);
    out["speculative_tuned"] = {{"k_max", 4},
                                {"tokens_per_s", median(tps[5])},
                                {"speedup", median(ratio[5])},
                                {"speedup_range", range_json(rt)},
                                {"rounds_at_k", tst.rounds_at_k}};
    log("  tuned k (0..4): %.2f tokens/s (%.2fx [%.2f-%.2f]), steps per k (last pass):%s\n", median(tps[5]),
        median(ratio[5]), rt.lo, rt.hi, tst.rounds_at_k_text().c_str());
  }
  out["speculative"] = specs;
  if (o.oracle && m.num_mtp_layers() > 0) {
    const double p = o.oracle_p;
    SamplingParams sp;
    sp.max_tokens = n_tokens;
    SpecOptions plain;
    plain.enabled = false;
    Generator gen(m);
    const auto ref = gen.generate(prompt, sp, plain);
    const double base_tps = ref.stats.tokens_per_second();
    nlohmann::json oracle = nlohmann::json::array();
    log("oracle drafts (each right with probability %.2f):\n", p);
    for (int k = 1; k <= 4; ++k) {
      SpecOptions so;
      so.num_speculative_tokens = k;
      so.draft_hook = [&](int64_t pos, int32_t d) -> int32_t {
        const int64_t i = pos - int64_t(prompt.size());
        if (i < 0 || i >= int64_t(ref.ids.size())) return d;
        const uint64_t h = uint64_t(pos) * 0x9E3779B97F4A7C15ull;
        const bool right = double(h >> 11) / double(1ull << 53) < p;
        return right ? ref.ids[i] : (ref.ids[i] + 1) % int32_t(m.config().vocab_size);
      };
      auto r = gen.generate(prompt, sp, so);
      const double tps = r.stats.tokens_per_second();
      oracle.push_back({{"k", k}, {"tokens_per_s", tps}, {"mean_acceptance_length", r.stats.mean_acceptance_length()},
                        {"speedup", tps / base_tps}});
      log("  k=%d: %.2f tokens/s (%.2fx), mean acceptance length %.2f\n", k, tps, tps / base_tps,
          r.stats.mean_acceptance_length());
    }
    out["oracle_speculative"] = {{"acceptance", p}, {"runs", oracle}};
  }
  if (json) std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace nextn::cli
