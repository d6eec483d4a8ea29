// `nextn bench`: measures, in one run, the machine's read bandwidth, the decode speed and the bandwidth it
// achieves, the cost of a (k+1)-token verify step relative to a 1-token step, and tokens/s with MTP
// speculation — on a given checkpoint or on a synthetic one large enough that DRAM, not cache, is measured.
#include <sys/mman.h>

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
#include <sstream>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/splitmix.h"
#include "core/profile.h"
#include "core/threadpool.h"
#include "io/mapped_file.h"
#include "io/tokenizer.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "models/registry.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn::cli {
namespace {

const char* kBenchUsage = R"(usage: nextn bench [--model DIR | --synthetic [--dtype bf16|fp8]] [options]

Measures in one run: the machine's read bandwidth (all threads), weight+cache bytes read per decode token,
decode tokens/s and the GB/s it achieves (fraction of the measured bandwidth), the time of a (k+1)-token
verify step relative to a 1-token step for k = 1..7 next to the bytes such a step reads relative to one
token (its bandwidth floor: with MoE, more rows touch more experts), and tokens/s with speculation for
k = 1..4 with the acceptance metrics (when the checkpoint has MTP layers); with --concurrency, also many
requests decoding together through one engine. JSON keys include read_bandwidth_gbps, decode_gbps,
bandwidth_fraction, baseline_tokens_per_s, verify_cost, verify_bytes, verify_floor_ratio (a step's time /
the time its bytes take at the measured bandwidth, keyed like verify_cost by rows = k + 1), speculative and (--concurrency)
concurrency.

  --model DIR        checkpoint to measure (default: the bundled model)
  --synthetic        write (once, cached) and measure a random HY V4 checkpoint at realistic width
                     (hidden 2048, 32 experts, a few GB) so that bandwidth, not cache, is measured
  --dtype bf16|fp8   weights of the synthetic checkpoint (default bf16)
  --mlp moe|dense    synthetic MLPs: 32-expert MoE (default) or dense (isolates verify cost from expert
                     coverage: k+1 tokens routed independently read up to k+1 times the expert bytes)
  --layers N         target layers of the synthetic checkpoint (default 8; real checkpoints have dozens,
                     which makes a draft step, one MTP layer and lm_head, a small share of a target step)
  --hidden N         hidden size of the synthetic checkpoint, a multiple of 1024 up to 8192 (default 2048;
                     the MLP, the experts, the heads and the attention's low ranks scale with it: real
                     checkpoints are 4096-7168 wide, and wider matrices make fewer, longer GPU kernels)
  --cache-dir DIR    where synthetic checkpoints live (default ~/.cache/nextn)
  --tokens N         decode tokens per measurement (default 64)
  --prompt-tokens N  prompt length (default 64)
  --threads N        worker threads, 1 to 4x the cores (default, or 0: every CPU this process may use)
  --tensor-parallel N  N tensor-parallel ranks, processes of this command (docs/parallel.md)
  --weights mapped|memory  the checkpoint's files mapped (default, or $NEXTN_WEIGHTS) or read into huge-page
                     memory at load (JSON "weights": how they were held)
  --draft-head H     the drafts' lm_head: fp8 (an FP8 copy of a bf16 head), target (its own), or auto
                     (default: fp8 for a head of 8 MiB or more); JSON "draft_head"
  --device cpu|cuda  where the model runs (default cpu); with cuda every bandwidth is the GPU's
                     device-to-device copy bandwidth ((read + write) / time over 2 GiB), measured likewise
  --repeats N        passes (default 3; one pass is at the mercy of a noisy machine): decode is measured
                     N times, each right after a bandwidth measurement of its own, and speculation in N
                     interleaved passes over plain, k = 1..4 and tuned k (their order rotated pass by pass);
                     reported are the medians of the per-pass bandwidth fractions and speedups (each
                     against the same pass's plain run)
  --oracle-acceptance P[,P2,...]  also measure speculation with drafts replaced by the target's own greedy
                     token with probability P per draft position, or, given a list, P_i at a round's draft
                     position i given the ones before it (the last P for positions past the list; e.g.
                     another model's measured per-position acceptance): a what-if for a draft of that
                     quality on this checkpoint (k = 1..4 and tuned k, in --repeats interleaved passes
                     over plain); the output stays the target's, the MTP layers still run
  --concurrency N,N,...  also run N greedy requests of --tokens tokens at once through one engine (prompts:
                     the bench prompt, rotated per request), plain and with speculation (tuned k up to the
                     checkpoint's default k, as generate does), for each N (1..256); reported per N, as
                     medians of --repeats passes (plain and speculative alternate which runs first, pass
                     by pass): aggregate decode tokens/s = the tokens generated after
                     each request's first token / the wall time from the end of the step that gave the
                     last request its first token to the end of the last step; its ratio to one sequence's
                     plain decode through the engine (same pass), speculative / plain, the mean
                     acceptance length, and the bytes a step reads next to the bandwidth-bound ceiling
                     (N x read bandwidth / bytes per plain step). JSON: "concurrency": [{"sequences",
                     "plain_tokens_per_s", "speculative_tokens_per_s", "plain_vs_single",
                     "speculative_vs_plain", "mean_acceptance_length", ...}]; with the tuned k, also the
                     tuner's estimate of a sequence's time per token at each k at the end of the last pass
                     ("speculative_tuner_us_per_token"), printed beside the measured ones; and the
                     speculative steps that did one-off work (a GPU shape's first run or graph recording:
                     "speculative_one_off_steps", "speculative_one_off_share" of the decode time); and
                     the same tokens/s while all N decode (up to the step in which the first request
                     finished, which leaves out the drain after it: "plain_all_in_flight_tokens_per_s",
                     "speculative_all_in_flight_tokens_per_s", "speculative_vs_plain_all_in_flight")
  --concurrency-k K  the --concurrency runs' speculation at a fixed k (1..8) instead of the tuned k: what
                     the tuner could reach at each N; 0: speculative requests that never draft (the upkeep
                     of speculation alone: hidden states kept for the drafter, the engine's bookkeeping)
  --concurrency-temperature T  sample the --concurrency runs' requests at temperature T (default 0: greedy),
                     each with a seed of its own and no output to reproduce, as an API request without a
                     seed (speculation then tunes k as for greedy ones); with --concurrency-top-p P, the
                     nucleus P (default 1: off). What a server's sampled requests cost the host: each token a
                     distribution over the vocabulary, each draft too
  --json             print one JSON object
)";

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// The yardstick's buffer, on huge pages: reads from 4 KB pages are ~10% slower on the 2-vCPU Xeon VM, and the
// weights may sit on huge pages (--weights memory).
struct HugePageBuffer {
  uint64_t* data;
  size_t bytes;
  explicit HugePageBuffer(size_t n) : data(reinterpret_cast<uint64_t*>(map_huge_page_memory(n))), bytes(n) {
    if (data == nullptr)
      throw Error("bench: cannot map " + std::to_string(n >> 20) + " MiB for the bandwidth measurement");
  }
  ~HugePageBuffer() { ::munmap(data, bytes); }
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  uint64_t& operator[](int64_t i) { return data[i]; }
  size_t size() const { return bytes / 8; }
};

// Best-of-5 streaming read of a 3 GiB buffer on huge pages, split over the pool's threads.
double measure_read_bandwidth(ThreadPool& pool) {
  const size_t bytes = size_t(3) << 30;  // well past any L3 (480 MiB on the development VM)
  HugePageBuffer buf(bytes);
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

// ---- measurements -------------------------------------------------------------------------------------

struct DecodeResult {
  double tokens_per_s, seconds_per_token;
};

// One sequence's rows of a forward (a row's values never depend on the rest of the batch, so one sequence
// alone measures what it costs in a batch of one).
void forward_one(Model& m, SequenceState& seq, const int32_t* tokens, int64_t rows, bool all_logits, float* logits,
                 float* hidden = nullptr) {
  const BatchSegment seg{&seq, tokens, rows, all_logits};
  m.forward(&seg, 1, logits, hidden);
}

// Plain decode of `n` tokens after a prompt (greedy), timing only the decode steps.
DecodeResult time_decode(Model& m, const std::vector<int32_t>& prompt, int n) {
  const int64_t V = m.facts().vocab_size;
  auto seq = m.new_sequence(int64_t(prompt.size()) + n + 1);
  std::vector<float> logits(V);
  forward_one(m, *seq, prompt.data(), int64_t(prompt.size()), false, logits.data());
  int32_t t = Sampler::argmax(logits.data(), V);
  forward_one(m, *seq, &t, 1, false, logits.data());  // warm-up step
  profile::clear();
  const double t0 = now_s();
  for (int i = 0; i < n; ++i) {
    t = Sampler::argmax(logits.data(), V);
    forward_one(m, *seq, &t, 1, false, logits.data());
  }
  const double dt = now_s() - t0;
  return {n / dt, dt / n};
}

// Median time of a forward over `rows` tokens at the end of `prompt`, rolled back after each rep.
struct StepResult {
  double seconds;       // median time of a step
  double weight_bytes;  // mean weight bytes a step read (the routed experts its rows used)
};
StepResult time_step(Model& m, const std::vector<int32_t>& prompt, int rows, int reps) {
  const int64_t V = m.facts().vocab_size;
  auto seq = m.new_sequence(int64_t(prompt.size()) + rows + 1);
  std::vector<float> logits(int64_t(rows) * V);
  forward_one(m, *seq, prompt.data(), int64_t(prompt.size()), false, nullptr);
  profile::clear();  // (NEXTN_PROFILE: the steps only)
  std::vector<int32_t> toks(rows);
  std::mt19937 rng(rows);
  std::vector<double> times;
  double bytes = 0;
  for (int r = 0; r < reps + 1; ++r) {
    for (auto& t : toks) t = int32_t(rng() % V);
    const double t0 = now_s();
    forward_one(m, *seq, toks.data(), rows, true, logits.data());
    if (r > 0) {
      times.push_back(now_s() - t0);
      bytes += double(m.last_forward_weight_bytes());
    }
    seq->rollback(int64_t(prompt.size()));
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], bytes / reps};
}

// Median time of a drafting round at k = 1 (the MTP layers' catch-up on the one position the target just
// verified: one MTP layer over one row, then lm_head), as the engine runs it through the model's DraftSession.
// The target's verify forwards between the rounds are not timed.
double time_draft_step(Model& m, const std::vector<int32_t>& prompt, int reps) {
  const int64_t V = m.facts().vocab_size, H = m.facts().hidden_width, T = int64_t(prompt.size());
  auto seq = m.new_sequence(T + reps + 2);
  std::vector<float> hid(T * H), lg(V);
  forward_one(m, *seq, prompt.data(), T, false, lg.data(), hid.data());
  std::vector<int32_t> toks = prompt;
  toks.push_back(Sampler::argmax(lg.data(), V));
  DraftOptions dopt;
  dopt.k_max = 1;
  auto drafter = m.new_draft_session(*seq, dopt);
  struct Argmax final : DraftPicker {
    int64_t V;
    explicit Argmax(int64_t v) : V(v) {}
    int32_t pick(int, float* logits) override { return Sampler::argmax(logits, V); }
    bool picks_argmax() const override { return true; }
  } argmax(V);
  drafter->push_verified(hid.data(), T);
  drafter->catch_up_prompt(toks, 1);
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    const int32_t t = toks.back();  // the target verifies the newest token
    forward_one(m, *seq, &t, 1, true, lg.data(), hid.data());
    toks.push_back(Sampler::argmax(lg.data(), V));
    drafter->push_verified(hid.data(), 1);
    const double t0 = now_s();
    run_draft_round(m, *drafter, toks, 1, argmax);
    ts.push_back(now_s() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
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
  int layers = 0;  // --layers: target layers of the synthetic checkpoint (0: its default)
  int hidden = 0;  // --hidden: its hidden size (0: its default)
  std::string dir;  // the checkpoint (for --synthetic: where it is written once)
  int n_tokens = 64, n_prompt = 64, repeats = 3, threads = 0;
  bool oracle = false;
  std::vector<double> oracle_p;  // per draft position (the last for those past it)
  std::vector<int> concurrency;  // --concurrency: the numbers of concurrent sequences (empty: not measured)
  int concurrency_k = -1;        // --concurrency-k: the speculative runs' fixed k (-1: tuned)
  float concurrency_temperature = 0, concurrency_top_p = 1;  // --concurrency-temperature, --concurrency-top-p
  std::string device = "cpu";    // --device: cpu, or cuda (bandwidths are then the device's copy bandwidth)
};

// The family the synthetic checkpoints are of (`--synthetic`).
const char* const kSyntheticModelType = "hy_v4";
SyntheticOptions synthetic_options(const BenchOptions& o) {
  SyntheticOptions so;
  so.fp8 = o.fp8;
  so.dense = o.dense;
  so.layers = o.layers;
  so.hidden = o.hidden;
  return so;
}

// Positions a run uses beyond prompt and generated tokens: verify steps of up to 8 rows and drafts.
constexpr int kBenchExtraPositions = 16;
// Concurrent sequences --concurrency accepts: what one engine decodes at once (EngineOptions::max_sequences).
constexpr int kMaxConcurrency = 256;

// A comma-separated list of at most kMaxListItems items, each parsed by `item`.
template <class T, class Parse>
std::vector<T> parse_list(const std::string& text, const std::string& what, const char* example, Parse item) {
  constexpr size_t kMaxListItems = 256;
  std::vector<T> out;
  std::stringstream ss(text);
  std::string one;
  while (std::getline(ss, one, ',') && out.size() <= kMaxListItems) out.push_back(item(one));
  if (out.empty() || out.size() > kMaxListItems || text.back() == ',')
    throw UsageError(what + " expects a list like " + example + " (at most 256 items), got '" + text + "'");
  return out;
}

std::vector<int> parse_concurrency(const std::string& text) {
  std::vector<int> out = parse_list<int>(text, "--concurrency", "1,4,16", [](const std::string& item) {
    return int(parse_int(item, "--concurrency", 1, kMaxConcurrency));
  });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

BenchOptions parse_bench_options(const Args& a) {
  BenchOptions o;
  o.json = a.has("json");
  o.synthetic = a.has("synthetic");
  if (o.synthetic && a.has("model")) throw UsageError("give --model or --synthetic, not both");
  for (const char* only_synthetic : {"dtype", "mlp", "layers", "hidden", "cache-dir"})
    if (!o.synthetic && a.has(only_synthetic))
      throw UsageError(std::string("--") + only_synthetic + " applies to --synthetic checkpoints only");
  const std::string dtype = a.get("dtype", "bf16"), mlp = a.get("mlp", "moe");
  if (dtype != "bf16" && dtype != "fp8") throw UsageError("--dtype must be bf16 or fp8, got '" + dtype + "'");
  if (mlp != "moe" && mlp != "dense") throw UsageError("--mlp must be moe or dense, got '" + mlp + "'");
  o.fp8 = dtype == "fp8";
  o.dense = mlp == "dense";
  o.layers = a.get_int("layers", 0, 1, 128);  // 0 (absent): the family's default
  o.hidden = a.get_int("hidden", 0, 1024, 8192);
  if (o.hidden % 1024 != 0) throw UsageError("--hidden must be a multiple of 1024, got " + std::to_string(o.hidden));
  constexpr int kMaxTokens = 1 << 20;  // further bounded by the checkpoint's context below
  o.n_tokens = a.get_int("tokens", 64, 1, kMaxTokens);
  o.n_prompt = a.get_int("prompt-tokens", 64, 1, kMaxTokens);
  o.repeats = a.get_int("repeats", 3, 1, 100);
  o.threads = thread_count(a);
  o.device = a.get("device", "cpu");
  if (o.device != "cpu" && o.device != "cuda") throw UsageError("--device must be cpu or cuda, got '" + o.device + "'");
  o.oracle = a.has("oracle-acceptance");
  if (o.oracle)
    o.oracle_p = parse_list<double>(a.get("oracle-acceptance"), "--oracle-acceptance", "0.9,0.8,0.7",
                                    [](const std::string& item) { return parse_double(item, "--oracle-acceptance", {0, 1}); });
  if (a.has("concurrency")) {
    o.concurrency = parse_concurrency(a.get("concurrency"));
    if (o.n_tokens < 2)
      throw UsageError("--concurrency measures the tokens after each request's first: it needs --tokens >= 2");
    o.concurrency_k = a.get_int("concurrency-k", -1, 0, 8);  // (SpecOptions' range, and 0)
    o.concurrency_temperature = float(a.get_double("concurrency-temperature", 0, {0, 100}));
    o.concurrency_top_p = float(a.get_double("concurrency-top-p", 1, {0, 1, /*lo_open=*/true}));
  } else {
    for (const char* flag : {"concurrency-k", "concurrency-temperature", "concurrency-top-p"})
      if (a.has(flag)) throw UsageError(std::string("--") + flag + " applies to --concurrency runs only");
  }
  if (o.synthetic) {
    const char* home = std::getenv("HOME");
    const std::string cache = a.get("cache-dir", std::string(home ? home : "/tmp") + "/.cache/nextn");
    o.dir = cache + "/" + describe_synthetic_checkpoint(kSyntheticModelType, synthetic_options(o)).name;
  } else {
    o.dir = a.get("model", NEXTN_DEFAULT_MODEL);
  }
  return o;
}

// What the options ask of the checkpoint (its context, MTP layers for --oracle-acceptance), from its facts.
void check_against_facts(const BenchOptions& o, const ModelFacts& f) {
  const int64_t positions = int64_t(o.n_prompt) + o.n_tokens + kBenchExtraPositions;
  if (positions > f.context)
    throw UsageError("--prompt-tokens " + std::to_string(o.n_prompt) + " + --tokens " + std::to_string(o.n_tokens) +
                     " (+ " + std::to_string(kBenchExtraPositions) + " for verify steps and drafts) exceed " +
                     o.dir + "'s max_position_embeddings " + std::to_string(f.context));
  if (o.oracle && f.num_mtp_layers < 1)
    throw UsageError("--oracle-acceptance needs a checkpoint with MTP layers; " + o.dir + " has none");
}

// ---- concurrency -------------------------------------------------------------------------------------

// N prompts for N concurrent requests: the bench prompt, then for request i its tokens after the first
// rotated by 1..L-1 places (and, once the rotations run out, its last token shifted), so that no two
// requests share a prompt and their greedy continuations differ.
std::vector<std::vector<int32_t>> concurrent_prompts(const std::vector<int32_t>& base, int n, int64_t vocab) {
  std::vector<std::vector<int32_t>> out(n, base);
  const int64_t L = int64_t(base.size());
  for (int i = 1; i < n; ++i) {
    std::vector<int32_t>& p = out[i];
    if (L < 2) {
      p[0] = int32_t((base[0] + i) % vocab);
      continue;
    }
    const int64_t rot = 1 + (i - 1) % (L - 1), cycle = (i - 1) / (L - 1);
    std::rotate(p.begin() + 1, p.begin() + 1 + rot, p.end());
    if (cycle > 0) p.back() = int32_t((p.back() + cycle) % vocab);
  }
  return out;
}

// N requests through one engine, greedy, max_tokens each (no stop ids: every request generates them all).
struct ConcurrentRun {
  double tokens_per_s = 0;      // decode tokens / decode seconds (the definition in the usage text)
  double decode_seconds = 0;
  int64_t decode_tokens = 0, decode_steps = 0;
  double bytes_per_step = 0;    // mean over the decode steps: target weights read + KV cache of the sequences
  double mean_acceptance_length = 1;  // over all requests: 1 + accepted / drafts
  std::vector<int64_t> rounds_at_k;   // tuned k: the requests' rounds at each k, summed
  double draft_share = 0;             // the MTP layers' time (drafts and catch-up, all requests) / decode_seconds
  std::vector<double> tuner_seconds_per_token;  // tuned k: the N-sequence class's estimates per k at the end
  int64_t one_off_steps = 0;      // decode steps that did one-off work (a GPU shape's first run or recording)
  double one_off_seconds = 0;     // and their time
  // Decode tokens / seconds up to the end of the step in which the first request finished: all N decoding,
  // without the drain after it (under speculation the requests finish apart, and the last ones decode in a
  // batch that shrinks; plain greedy requests of one length finish in one step, so for them it is the whole).
  double all_in_flight_tokens_per_s = 0;
};

// sampling: temperature and top_p of every request (greedy: temperature 0); request i samples with seed i.
ConcurrentRun run_concurrent(Model& m, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                             const SpecOptions& spec, const SamplingParams& sampling) {
  const size_t n = prompts.size();
  Engine engine(m);
  SamplingParams sp;
  sp.max_tokens = max_tokens;
  sp.temperature = sampling.temperature;
  sp.top_p = sampling.top_p;
  sp.reproducible = false;  // (no seed asked for, as most API requests: speculation tunes k)
  std::vector<int64_t> emitted(n, 0);
  int64_t total = 0, started = 0;
  for (size_t i = 0; i < n; ++i) {
    sp.seed = i;
    engine.submit(Request{prompts[i], sp, spec, [&emitted, &total, &started, i](int32_t, const TokenLogprob*) {
                            if (emitted[i]++ == 0) ++started;
                            ++total;
                            return true;
                          }, {}});
  }
  // Prefill: until every request has its first token (the KV pool is sized so that all are admitted at once,
  // and they all prefill in the first step's forward).
  while (!engine.idle() && started < int64_t(n)) engine.step();
  ConcurrentRun r;
  const double kv_per_position = double(m.kv_bytes_per_position(false));
  const int64_t tokens0 = total;
  double bytes = 0;
  if (profile::enabled()) profile::clear();  // (NEXTN_PROFILE: the decode steps only)
  const double t0 = now_s();
  bool one_finished = false;
  while (!engine.idle()) {
    // The cache each unfinished sequence's attention reads in this step: its positions so far.
    int64_t positions = 0;
    for (size_t i = 0; i < n; ++i)
      if (emitted[i] < max_tokens) positions += int64_t(prompts[i].size()) + emitted[i];
    const uint64_t one_offs = m.one_off_forwards();
    const double step_t0 = now_s();
    engine.step();
    if (m.one_off_forwards() != one_offs) {
      ++r.one_off_steps;
      r.one_off_seconds += now_s() - step_t0;
    }
    ++r.decode_steps;
    bytes += double(m.last_forward_weight_bytes()) + double(positions) * kv_per_position;
    if (!one_finished && std::find(emitted.begin(), emitted.end(), int64_t(max_tokens)) != emitted.end()) {
      one_finished = true;
      const double seconds = now_s() - t0;
      r.all_in_flight_tokens_per_s = seconds > 0 ? double(total - tokens0) / seconds : 0.0;
    }
  }
  r.decode_seconds = now_s() - t0;
  r.decode_tokens = total - tokens0;
  if (profile::enabled()) {
    std::fprintf(stderr, "  (%zu sequences, %s: %.3f ms per decode step)\n", n, spec.enabled ? "speculative" : "plain",
                 r.decode_steps ? r.decode_seconds * 1e3 / double(r.decode_steps) : 0.0);
    profile::report(stderr, "step", double(r.decode_steps));
  }
  r.tokens_per_s = r.decode_seconds > 0 ? double(r.decode_tokens) / r.decode_seconds : 0.0;
  if (!one_finished) r.all_in_flight_tokens_per_s = r.tokens_per_s;  // (none reached max_tokens: no drain)
  r.bytes_per_step = r.decode_steps ? bytes / double(r.decode_steps) : 0.0;
  int64_t drafts = 0, accepted = 0;
  for (auto& [id, res] : engine.take_finished()) {
    if (res.finish_reason == "error") throw Error("bench --concurrency: request " + std::to_string(id) + ": " + res.error);
    drafts += res.stats.num_drafts;
    accepted += res.stats.num_accepted_tokens;
    r.draft_share += res.stats.draft_seconds + res.stats.catch_up_seconds;
    const auto& at_k = res.stats.rounds_at_k;
    if (r.rounds_at_k.size() < at_k.size()) r.rounds_at_k.resize(at_k.size(), 0);
    for (size_t k = 0; k < at_k.size(); ++k) r.rounds_at_k[k] += at_k[k];
  }
  r.mean_acceptance_length = drafts ? 1.0 + double(accepted) / double(drafts) : 1.0;
  for (const Engine::TunerClass& c : engine.tuner_classes())
    if (c.contains(int64_t(n)))
      r.tuner_seconds_per_token = c.seconds_per_token;
  r.draft_share = r.decode_seconds > 0 ? r.draft_share / r.decode_seconds : 0.0;
  return r;
}

// The tuner's estimates against what the runs measured, both as a sequence's time per token (the tuner's
// unit: a step's time shared by its sequences, over the tokens each emits).
std::string tuner_text(const ConcurrentRun& spec, const ConcurrentRun& plain) {
  if (spec.tuner_seconds_per_token.empty()) return "";
  std::string s = "; the tuner's estimates, us a token a sequence:";
  for (size_t k = 0; k < spec.tuner_seconds_per_token.size(); ++k) {
    char cell[48];
    std::snprintf(cell, sizeof cell, " %zu:%.1f", k, spec.tuner_seconds_per_token[k] * 1e6);
    s += cell;
  }
  // (a step of n sequences emitting t tokens a sequence in T seconds: T / n a round, T / (n t) a token each)
  auto measured = [](const ConcurrentRun& r) { return r.tokens_per_s > 0 ? 1e6 / r.tokens_per_s : 0.0; };
  char tail[96];
  std::snprintf(tail, sizeof tail, " (measured: plain %.1f, speculative %.1f)", measured(plain), measured(spec));
  return s + tail;
}

std::string rounds_at_k_text(const std::vector<int64_t>& at_k) {
  std::string s;
  for (size_t k = 0; k < at_k.size(); ++k) {
    char cell[48];
    std::snprintf(cell, sizeof cell, " %zu:%lld", k, static_cast<long long>(at_k[k]));
    s += cell;
  }
  return s;
}

}  // namespace

int run_bench(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "json", "synthetic"},
         {"model", "dtype", "mlp", "layers", "hidden", "cache-dir", "tokens", "prompt-tokens", "threads", "repeats",
          "oracle-acceptance", "concurrency", "concurrency-k", "concurrency-temperature", "concurrency-top-p", "device",
          "tensor-parallel", "weights", "draft-head"});
  if (a.has("help")) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
  apply_weights_option(a);
  const DraftHeadKind draft_head = draft_head_option(a);
  const BenchOptions o = parse_bench_options(a);
  if (o.synthetic) {
    check_against_facts(o, describe_synthetic_checkpoint(kSyntheticModelType, synthetic_options(o)).facts);
    if (!std::filesystem::exists(o.dir + "/model.safetensors")) {
      std::fprintf(stderr, "writing synthetic checkpoint to %s ...\n", o.dir.c_str());
      write_synthetic_checkpoint(kSyntheticModelType, o.dir, synthetic_options(o));
    }
  }
  const std::string& dir = o.dir;
  const int n_tokens = o.n_tokens, n_prompt = o.n_prompt, repeats = o.repeats;
  const bool json = o.json;
  ThreadPool pool(o.threads);
  auto log = [&](const char* fmt, auto... args) {
    if (json) return;
    if constexpr (sizeof...(args) == 0)
      std::fputs(fmt, stdout);  // (no arguments: not a format)
    else
      std::fprintf(stdout, fmt, args...);
    std::fflush(stdout);
  };

  // Loading maps the weights (prefault reads them, below): the options are checked against the checkpoint
  // before anything is measured.
  const std::unique_ptr<Model> loaded = load_command_model(dir, pool, tensor_parallel(a));
  Model& m = *loaded;
  const ModelFacts& facts = m.facts();
  check_against_facts(o, facts);
  const int max_concurrency = o.concurrency.empty() ? 0 : o.concurrency.back();
  if (max_concurrency > 0) {
    // One KV pool for all the sequences of the largest batch, each of the run's prompt + tokens + the rows of
    // verify steps and drafts, so that an engine admits them all at once (the default pool holds one sequence).
    MemoryOptions mem;
    mem.kv_cache_bytes = m.memory_bytes_for(max_concurrency, int64_t(n_prompt) + n_tokens + kBenchExtraPositions, mem.page_tokens);
    m.configure_memory(mem);
  }

  nlohmann::json out;
  m.prefault(!json);
  const bool gpu = o.device == "cuda";
  // (as asked: a file that cannot have the memory stays mapped, io/mapped_file.h)
  const char* weights = file_residency() == FileResidency::kInMemory ? "memory" : "mapped";
  const std::string where = place_model(m, o.device);
  const std::string drafts = m.use_draft_head(draft_head);
  // The yardstick of a bandwidth-bound decode: the CPU's read bandwidth, or the GPU's copy bandwidth.
  auto measure_bandwidth = [&] { return gpu ? cuda::copy_bandwidth_gbps(size_t(2) << 30) : measure_read_bandwidth(pool); };
  const double bw = measure_bandwidth();
  if (gpu)
    log("machine: %s, device copy bandwidth %.2f GB/s (the yardstick below)\n", where.c_str(), bw);
  else
    log("machine: %d threads, CPU kernels %s (FP8 decode: %s), weights %s, read bandwidth %.2f GB/s\n",
        pool.size(), cpu_target_text().c_str(), ops::cpu_fp8_decode_name(), weights, bw);
  out["device"] = where;
  out["cpu_target"] = ops::cpu_target_name();
  out["cpu_target_forced"] = ops::cpu_target_forced();
  if (!gpu) out["cpu_fp8_decode"] = ops::cpu_fp8_decode_name();
  out["weights"] = weights;
  out["draft_head"] = draft_head_name(draft_head);
  if (!drafts.empty()) log("drafts: %s\n", drafts.c_str());

  auto prompt = bench_prompt(dir, facts.vocab_size, n_prompt);
  // Bytes one decode token reads: weights (active experts only) + the KV cache (latent + rope key +
  // indexer key per cached position and layer) at the mean context length of the run.
  const double ctx = double(prompt.size()) + n_tokens / 2.0;
  const double cache_bytes = ctx * double(m.kv_bytes_per_position(false));
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
    pass_bw.push_back(pass == 0 ? bw : measure_bandwidth());
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
  const bool fits_in_llc = !gpu && llc_bytes > 0 && checkpoint_bytes <= llc_bytes;
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
  // And against the time those bytes take at the read bandwidth measured in this run (verify_floor_ratio:
  // 1.0 = a step as fast as its bytes allow; no bound when the checkpoint fits in the last-level cache).
  nlohmann::json vf;
  const StepResult one = time_step(m, prompt, 1, kStepReps);
  std::string bytes_line, floor_line;
  log("verify cost (time of a k+1-token step / 1-token step):");
  for (int rows = 1; rows <= 8; ++rows) {
    const StepResult st = rows == 1 ? one : time_step(m, prompt, rows, kStepReps);
    const double bytes_ratio = (st.weight_bytes + cache_bytes) / (one.weight_bytes + cache_bytes);
    vc[std::to_string(rows)] = st.seconds / one.seconds;
    vb[std::to_string(rows)] = bytes_ratio;
    const double floor_seconds = (st.weight_bytes + cache_bytes) / (bw_med * 1e9);
    vf[std::to_string(rows)] = st.seconds / floor_seconds;
    log(" %d:%.2f", rows, st.seconds / one.seconds);
    char cell[32];
    std::snprintf(cell, sizeof cell, " %d:%.2f", rows, bytes_ratio);
    bytes_line += cell;
    std::snprintf(cell, sizeof cell, " %d:%.2f", rows, st.seconds / floor_seconds);
    floor_line += cell;
  }
  log("\n");
  log("bytes a k+1-token step reads / 1-token step (the bandwidth floor of the ratio above):%s\n", bytes_line.c_str());
  log("step time / the time its bytes take at %.1f GB/s (verify_floor_ratio%s):%s\n", bw_med,
      fits_in_llc ? "; the checkpoint fits in the last-level cache, so no bound" : "", floor_line.c_str());
  out["verify_cost"] = vc;
  out["verify_bytes"] = vb;
  out["verify_floor_ratio"] = vf;
  if (profile::enabled()) {  // what grows with the rows of a verification step
    for (int rows : {1, 4}) {
      profile::clear();
      time_step(m, prompt, rows, kStepReps);
      log("  %d-row step:\n", rows);
      profile::report(stderr, "step", kStepReps + 1);  // every step is profiled, the untimed one too
    }
  }

  nlohmann::json specs = nlohmann::json::array();
  if (facts.num_mtp_layers > 0) {
    SamplingParams sp;
    sp.max_tokens = n_tokens;
    Generator gen(m);
    // Draft step cost relative to a target step: one MTP layer + lm_head versus the whole target.
    {
      const double draft_s = time_draft_step(m, prompt, 9);
      out["draft_step_cost"] = draft_s / one.seconds;
      log("draft step (1 MTP layer + lm_head) = %.3f of a target step\n", draft_s / one.seconds);
    }
    // Passes over plain, k = 1..4 and tuned k (k_max 4, what `nextn generate` does by default for greedy
    // decoding), interleaved so that a slow moment of the machine hits every setting alike; each speedup
    // is taken against the plain run of the same pass, then the median over the passes is reported.
    constexpr int kSettings = 6;  // plain, k = 1..4, tuned
    std::vector<double> tps[kSettings], ratio[kSettings];
    GenerationResult last[kSettings];
    for (int pass = 0; pass < repeats; ++pass) {
      for (int j = 0; j < kSettings; ++j) {
        const int i = (j + pass) % kSettings;  // (the order rotates pass by pass: no setting always runs last)
        SpecOptions so;
        so.enabled = i > 0;
        so.num_speculative_tokens = i == 5 ? 4 : std::max(i, 1);
        so.tune_k = i == 5;
        last[i] = gen.generate(prompt, sp, so);
        tps[i].push_back(last[i].stats.tokens_per_second());
      }
      for (int i = 0; i < kSettings; ++i) ratio[i].push_back(tps[i].back() / tps[0].back());
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
  if (o.oracle && facts.num_mtp_layers > 0) {
    const std::vector<double>& p = o.oracle_p;
    SamplingParams sp;
    sp.max_tokens = n_tokens;
    SpecOptions plain;
    plain.enabled = false;
    Generator gen(m);
    const auto ref = gen.generate(prompt, sp, plain);
    // An independent draw per (position, step): a Weyl sequence of the position alone (as this was) makes
    // neighbouring positions' draws depend on each other, and 3 drafts in a row right at 0.84, 0.73, 0.58
    // impossible. The draws are the same in every pass: only the times vary between them.
    auto oracle_draft = [&](int64_t pos, int step, int32_t d) -> int32_t {
      const int64_t i = pos - int64_t(prompt.size());
      if (i < 0 || i >= int64_t(ref.ids.size())) return d;
      const uint64_t h = splitmix64(uint64_t(pos) * 64 + uint64_t(step));
      const bool right = double(h >> 11) / double(1ull << 53) < p[std::min<size_t>(size_t(step), p.size() - 1)];
      return right ? ref.ids[i] : (ref.ids[i] + 1) % int32_t(facts.vocab_size);
    };
    // Passes over plain, k = 1..4 and tuned k, interleaved, each speedup against its own pass's plain run
    // (as above: one pass on a shared machine moves by 10% or more).
    constexpr int kSettings = 6;  // plain, k = 1..4, tuned
    std::vector<double> tps[kSettings], ratio[kSettings];
    GenerationResult last[kSettings];
    for (int pass = 0; pass < repeats; ++pass) {
      for (int j = 0; j < kSettings; ++j) {
        const int i = (j + pass) % kSettings;  // (rotated pass by pass, as above)
        SpecOptions so = plain;
        if (i > 0) {
          so.enabled = true;
          so.num_speculative_tokens = i == 5 ? 4 : i;
          so.tune_k = i == 5;
          so.draft_hook = oracle_draft;
        }
        last[i] = gen.generate(prompt, sp, so);
        tps[i].push_back(last[i].stats.tokens_per_second());
      }
      for (int i = 0; i < kSettings; ++i) ratio[i].push_back(tps[i].back() / tps[0].back());
    }
    nlohmann::json oracle = nlohmann::json::array();
    std::string p_text;
    for (double pi : p) p_text += (p_text.empty() ? "" : ", ") + std::to_string(pi).substr(0, 4);
    log("oracle drafts (right with probability %s at draft position 1%s; plain %.2f tokens/s, medians of %d "
        "interleaved passes):\n",
        p_text.c_str(), p.size() > 1 ? ", 2, ... given the ones before" : " and after", median(tps[0]), repeats);
    for (int i = 1; i < kSettings; ++i) {
      const Range ri = range(ratio[i]);
      const SpecStats& st = last[i].stats;
      nlohmann::json run = {{"tokens_per_s", median(tps[i])}, {"mean_acceptance_length", st.mean_acceptance_length()},
                            {"speedup", median(ratio[i])}, {"speedup_range", range_json(ri)}};
      if (i < 5) {
        run["k"] = i;
        log("  k=%d: %.2f tokens/s (%.2fx [%.2f-%.2f]), mean acceptance length %.2f\n", i, median(tps[i]),
            median(ratio[i]), ri.lo, ri.hi, st.mean_acceptance_length());
      } else {
        run["k_max"] = 4;
        run["rounds_at_k"] = st.rounds_at_k;
        log("  tuned k (0..4): %.2f tokens/s (%.2fx [%.2f-%.2f]), mean acceptance length %.2f, steps per k (last "
            "pass):%s\n",
            median(tps[i]), median(ratio[i]), ri.lo, ri.hi, st.mean_acceptance_length(), st.rounds_at_k_text().c_str());
      }
      oracle.push_back(run);
    }
    out["oracle_speculative"] = {{"acceptance", p}, {"runs", oracle}};
  }
  if (!o.concurrency.empty()) {
    // N requests at once through one engine: plain, then speculative (tuned k up to the checkpoint's default k,
    // as `nextn generate` decodes greedy requests), in `repeats` passes, each pass after a bandwidth reading of
    // its own and with its own single-sequence plain run that its ratios are taken against.
    const int k_default = default_speculative_tokens(dir, /*warn_unusable=*/false);
    const bool drafting = facts.num_mtp_layers > 0;
    SpecOptions plain;
    plain.enabled = false;
    SpecOptions spec;
    spec.num_speculative_tokens = o.concurrency_k > 0 ? o.concurrency_k : k_default;
    spec.tune_k = o.concurrency_k < 0;
    if (o.concurrency_k == 0) spec.k_schedule_for_tests = [](int64_t) { return 0; };  // (what drafting's upkeep costs)
    SamplingParams sampling;
    sampling.temperature = o.concurrency_temperature;
    sampling.top_p = o.concurrency_top_p;
    const auto prompts = concurrent_prompts(prompt, max_concurrency, facts.vocab_size);
    // Every decode shape of the largest batch recorded before the first pass (as serve does at start): the
    // passes measure steady decoding, not the first sight of the row counts a draining batch meets.
    const int k = drafting ? spec.num_speculative_tokens : 0;
    prepare_forwards(m, int64_t(max_concurrency) * forward_rows_per_sequence(k), int64_t(prompt.size()) + n_tokens + k + 2,
                     json);
    auto first = [&](int n) { return std::vector<std::vector<int32_t>>(prompts.begin(), prompts.begin() + n); };
    const size_t C = o.concurrency.size();
    std::vector<double> pass_bw_c, single_tps;
    std::vector<std::vector<double>> plain_tps(C), spec_tps(C), plain_x(C), spec_x(C), plain_frac(C), spec_frac(C),
        spec_draft(C), plain_full(C), spec_full(C), spec_full_x(C);
    std::vector<ConcurrentRun> last_plain(C), last_spec(C);
    auto fraction = [](const ConcurrentRun& r, double gbps) {
      return r.decode_seconds > 0 ? r.bytes_per_step * double(r.decode_steps) / r.decode_seconds / 1e9 / gbps : 0.0;
    };
    for (int pass = 0; pass < repeats; ++pass) {
      pass_bw_c.push_back(measure_bandwidth());
      const double gbps = pass_bw_c.back();
      double single =
          o.concurrency.front() == 1 ? 0.0 : run_concurrent(m, first(1), n_tokens, plain, sampling).tokens_per_s;
      // Which of the pair runs first alternates pass by pass: the second of two back-to-back runs of many
      // sequences ran slower whichever it was (docs/performance.md), which a fixed order charged to speculation.
      const bool spec_first = drafting && pass % 2 == 1;
      for (size_t i = 0; i < C; ++i) {
        const int n = o.concurrency[i];
        if (spec_first) last_spec[i] = run_concurrent(m, first(n), n_tokens, spec, sampling);
        last_plain[i] = run_concurrent(m, first(n), n_tokens, plain, sampling);
        if (n == 1) single = last_plain[i].tokens_per_s;
        plain_tps[i].push_back(last_plain[i].tokens_per_s);
        plain_x[i].push_back(last_plain[i].tokens_per_s / single);
        plain_frac[i].push_back(fraction(last_plain[i], gbps));
        plain_full[i].push_back(last_plain[i].all_in_flight_tokens_per_s);
        if (!drafting) continue;
        if (!spec_first) last_spec[i] = run_concurrent(m, first(n), n_tokens, spec, sampling);
        spec_tps[i].push_back(last_spec[i].tokens_per_s);
        spec_x[i].push_back(last_spec[i].tokens_per_s / last_plain[i].tokens_per_s);
        spec_frac[i].push_back(fraction(last_spec[i], gbps));
        spec_draft[i].push_back(last_spec[i].draft_share);
        spec_full[i].push_back(last_spec[i].all_in_flight_tokens_per_s);
        spec_full_x[i].push_back(last_spec[i].all_in_flight_tokens_per_s / last_plain[i].all_in_flight_tokens_per_s);
      }
      single_tps.push_back(single);
    }
    const double bw_c = median(pass_bw_c);
    out["concurrency_read_bandwidth_gbps"] = bw_c;
    out["concurrency_single_tokens_per_s"] = median(single_tps);
    out["concurrency_k_max"] = drafting ? spec.num_speculative_tokens : 0;
    out["concurrency_k_fixed"] = o.concurrency_k >= 0;
    out["concurrency_temperature"] = sampling.temperature;
    out["concurrency_top_p"] = sampling.top_p;
    char how[64] = "greedy";
    if (!sampling.greedy())
      std::snprintf(how, sizeof how, "sampled (T %g, top-p %g)", sampling.temperature, sampling.top_p);
    log("concurrency: N %s requests of %d tokens through one engine (prompts: the bench prompt rotated per "
        "request); speculative = %s k, k_max %d\n"
        "  decode tokens/s = tokens generated after each request's first token / wall time from the end of the step "
        "that gave the last request its first token to the end of the last step\n"
        "  medians of %d passes, each after its own bandwidth reading (median %.2f GB/s) and with its own single-"
        "sequence plain run: %.2f tokens/s\n"
        "  ceiling = N x read bandwidth / bytes a plain step reads (target weights with the experts its rows used, "
        "plus each sequence's KV cache): the bandwidth-bound limit of plain decoding at N\n",
        how, n_tokens, o.concurrency_k >= 0 ? "fixed" : "tuned", drafting && o.concurrency_k != 0 ? spec.num_speculative_tokens : 0,
        repeats, bw_c,
        median(single_tps));
    log("  %5s %12s %8s %9s %13s %7s | %12s %7s %10s %9s %7s %7s\n", "N", "plain tok/s", "x single", "MB/step",
        "ceiling tok/s", "of ceil", "spec tok/s", "x plain", "accept len", "MB/step", "of BW", "drafts");
    nlohmann::json conc = nlohmann::json::array();
    std::string k_lines, one_off_lines, in_flight_lines;
    for (size_t i = 0; i < C; ++i) {
      const int n = o.concurrency[i];
      const ConcurrentRun& lp = last_plain[i];
      const double ptps = median(plain_tps[i]), pfrac = median(plain_frac[i]);
      const double ceiling = lp.bytes_per_step > 0 ? double(n) * bw_c * 1e9 / lp.bytes_per_step : 0.0;
      nlohmann::json e = {{"sequences", n},
                          {"plain_tokens_per_s", ptps},
                          {"plain_vs_single", median(plain_x[i])},
                          {"plain_vs_single_range", range_json(range(plain_x[i]))},
                          {"plain_bytes_per_step", lp.bytes_per_step},
                          {"plain_ceiling_tokens_per_s", ceiling},
                          {"plain_bandwidth_fraction", pfrac},
                          {"speculative_tokens_per_s", nullptr},
                          {"speculative_vs_plain", nullptr},
                          {"mean_acceptance_length", nullptr},
                          {"plain_all_in_flight_tokens_per_s", median(plain_full[i])}};
      char plain_cells[128];
      std::snprintf(plain_cells, sizeof plain_cells, "  %5d %12.2f %8.2f %9.2f %13.1f %6.1f%%", n, ptps,
                    median(plain_x[i]), lp.bytes_per_step / 1e6, ceiling, 100 * pfrac);
      if (drafting) {
        const ConcurrentRun& ls = last_spec[i];
        e["speculative_tokens_per_s"] = median(spec_tps[i]);
        e["speculative_vs_plain"] = median(spec_x[i]);
        e["speculative_vs_plain_range"] = range_json(range(spec_x[i]));
        e["mean_acceptance_length"] = ls.mean_acceptance_length;
        e["speculative_bytes_per_step"] = ls.bytes_per_step;
        e["speculative_bandwidth_fraction"] = median(spec_frac[i]);
        e["speculative_rounds_at_k"] = ls.rounds_at_k;
        e["speculative_draft_share"] = median(spec_draft[i]);
        const double one_off_share = ls.decode_seconds > 0 ? ls.one_off_seconds / ls.decode_seconds : 0.0;
        e["speculative_one_off_steps"] = ls.one_off_steps;
        e["speculative_one_off_share"] = one_off_share;
        e["speculative_all_in_flight_tokens_per_s"] = median(spec_full[i]);
        e["speculative_vs_plain_all_in_flight"] = median(spec_full_x[i]);
        e["speculative_vs_plain_all_in_flight_range"] = range_json(range(spec_full_x[i]));
        {
          const Range rf = range(spec_full_x[i]);
          char cell[160];
          std::snprintf(cell, sizeof cell, "  N=%d: plain %.2f, speculative %.2f tokens/s: %.2fx [%.2f-%.2f]\n", n,
                        median(plain_full[i]), median(spec_full[i]), median(spec_full_x[i]), rf.lo, rf.hi);
          in_flight_lines += cell;
        }
        if (ls.one_off_steps > 0) {
          char cell[128];
          std::snprintf(cell, sizeof cell, "  N=%d: %lld of %lld decode steps, %.1f%% of the decode time\n", n,
                        static_cast<long long>(ls.one_off_steps), static_cast<long long>(ls.decode_steps),
                        100 * one_off_share);
          one_off_lines += cell;
        }
        log("%s | %12.2f %7.2f %10.2f %9.2f %6.1f%% %6.1f%%\n", plain_cells, median(spec_tps[i]), median(spec_x[i]),
            ls.mean_acceptance_length, ls.bytes_per_step / 1e6, 100 * median(spec_frac[i]), 100 * median(spec_draft[i]));
        k_lines += "  N=" + std::to_string(n) + ":" + rounds_at_k_text(ls.rounds_at_k) + tuner_text(ls, lp) + "\n";
        std::vector<double> estimates;
        for (double v : ls.tuner_seconds_per_token) estimates.push_back(v * 1e6);
        if (!estimates.empty()) e["speculative_tuner_us_per_token"] = estimates;
      } else {
        log("%s | %12s %7s %10s %9s %7s %7s\n", plain_cells, "-", "-", "-", "-", "-", "-");
      }
      conc.push_back(e);
    }
    if (drafting)
      log("  drafts = the MTP layers' time (draft steps and catch-up, summed over the requests) / decode time\n");
    if (drafting && o.concurrency_k < 0)
      log("  speculative rounds at each k, summed over the requests (last pass; MB/step and of BW count the target's "
          "forwards only, not the MTP layers'):\n%s", k_lines.c_str());
    if (!in_flight_lines.empty())
      log("  while all N requests decode (to the end of the step in which the first one finished: the batch's drain, "
          "when speculation's requests finish apart, left out; medians, per-pass ratios):\n%s",
          in_flight_lines.c_str());
    if (!one_off_lines.empty())
      log("  speculative steps that did one-off work (a GPU shape's first run or graph recording; last pass; the k "
          "tuner does not measure them):\n%s", one_off_lines.c_str());
    if (fits_in_llc)
      log("  (the checkpoint fits in the last-level cache: the ceiling above, from DRAM bandwidth, is no bound)\n");
    out["concurrency"] = conc;
  }
  if (json) std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace nextn::cli
