// Qwen4-Exp on the CUDA backend (models/qwen4_exp/cuda_blocks.*) against the CPU backend and transformers:
// prompt and decode logits, the pre-mixer streams and the MTP draft logits (teacher-forced and a live draft
// round) within the fixtures' tolerance (fp32 compute on both: max|Δ| <= 1e-4 · max|ref|, identical argmax),
// and the GPU's own exactness: decode steps and verify blocks bit-identical to a full recompute, rejected
// verify rows rolled back by state slot without a trace, greedy speculation equal to plain greedy for k = 1..7,
// and each of many sequences decoded together bit-identical to it alone. Without a usable GPU every test
// reports itself skipped, with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "models/qwen4_exp/model.h"
#include "models/registry.h"
#include "ops/cuda/cuda_test_util.h"
#include "prepared_forwards_check.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::compare;

const std::string kBundled = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-qwen4exp-tiny";

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(size_t(std::max<int64_t>(len, 1)));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
  return p;
}

// Through the registry, as the CLI loads it, then on the GPU with `memory` (the CLI's order: device, then
// memory; max_verify_rows is the number of recurrent state slots each sequence keeps).
std::unique_ptr<Model> load_on_gpu(const std::string& dir, ThreadPool* pool, const MemoryOptions& memory = {}) {
  auto m = load_model(dir, pool);
  m->use_device(Device::kCuda);
  m->configure_memory(memory);
  return m;
}

// A BatchSegment of one sequence's rows, every row's logits.
void run(Model& m, SequenceState& seq, const int32_t* tokens, int64_t rows, float* logits, float* hidden) {
  const BatchSegment seg{&seq, tokens, rows, true};
  m.forward(&seg, 1, logits, hidden);
}

// Logits (all rows) and pre-mixer streams of a prompt's prefill, then of one decode step per token of `next`.
struct ForwardRun {
  std::vector<float> logits, hidden, decode, decode_hidden;
};
ForwardRun prefill_and_decode(Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& next) {
  const int64_t T = prompt.size(), N = next.size(), V = m.facts().vocab_size, CH = m.facts().hidden_width;
  ForwardRun r;
  r.logits.resize(size_t(T * V));
  r.hidden.resize(size_t(T * CH));
  r.decode.resize(size_t(N * V));
  r.decode_hidden.resize(size_t(N * CH));
  auto seq = m.new_sequence(T + N);
  run(m, *seq, prompt.data(), T, r.logits.data(), r.hidden.data());
  for (int64_t i = 0; i < N; ++i) run(m, *seq, &next[i], 1, r.decode.data() + i * V, r.decode_hidden.data() + i * CH);
  return r;
}

// The step logits [k, V] of one draft round right after prefill (the engine's DraftSession path: catch-up over
// the prompt, then k steps cycling through the MTP layers). The drafter reads `hidden` (the same streams on
// both backends) and the picks are fixed (`picks[s + 1]` at step s), so that both backends draft one chain.
std::vector<float> draft_round_logits(Model& m, const std::vector<int32_t>& prompt, const float* hidden,
                                      const std::vector<int32_t>& picks, int k) {
  const int64_t T = prompt.size(), V = m.facts().vocab_size;
  auto seq = m.new_sequence(T + k + 2);
  std::vector<float> last(static_cast<size_t>(V));
  const BatchSegment seg{seq.get(), prompt.data(), T, /*all_logits=*/false};
  m.forward(&seg, 1, last.data(), nullptr);
  DraftOptions opt;
  opt.k_max = k;
  auto ds = m.new_draft_session(*seq, opt);
  if (!ds) throw Error("no draft session");
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(picks.at(0));
  ds->push_verified(hidden, T);
  ds->catch_up_prompt(tokens, k);
  struct Record final : DraftPicker {
    int64_t V = 0;
    const std::vector<int32_t>* picks = nullptr;
    std::vector<float> logits;
    int32_t pick(int s, float* l) override {
      logits.insert(logits.end(), l, l + V);
      return size_t(s + 1) < picks->size() ? (*picks)[size_t(s + 1)] : 0;
    }
  } rec;
  rec.V = V;
  rec.picks = &picks;
  run_draft_round(m, *ds, tokens, k, rec);
  return rec.logits;
}

class CudaQwen4Exp : public ::testing::TestWithParam<std::string> {
 protected:
  ThreadPool pool_{2};
};

bool has_reference(const std::string& dir) {
  return std::filesystem::exists(dir + "/reference.safetensors") && testing::Reference(dir).has("input_ids");
}

// Whether the fixture's recorded prompt outgrows the QSA budget by two blocks: then the block top-k drops
// blocks on it (c_bf16's 20 tokens stay under its budget of 32, where every block is kept and nothing is chosen).
bool reference_prompt_is_sparse(const Qwen4ExpModel& m, const std::string& dir) {
  if (!has_reference(dir)) return false;
  const auto& c = m.config();
  return int64_t(testing::Reference(dir).ids("input_ids").size()) > c.indexer_budget + 2 * c.indexer_compress_ratio;
}

std::vector<int32_t> prompt_for(const Qwen4ExpModel& m, const std::string& dir) {
  if (reference_prompt_is_sparse(m, dir)) return testing::Reference(dir).ids("input_ids");
  return random_prompt(3 * m.config().indexer_budget + 5, m.config().vocab_size, 11);
}

// transformers' fp32 run of a tensor: `name_f32up` for a bf16 checkpoint (fp32 over its bf16 weights).
std::string exact_name(const testing::Reference& ref, const std::string& name) {
  return ref.has(name + "_f32up") ? name + "_f32up" : name;
}

TEST_P(CudaQwen4Exp, LogitsStreamsAndDraftLogitsMatchTheCpuBackend) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  Qwen4ExpModel cpu(dir, &pool_), gpu(dir, &pool_);
  gpu.use_device(Device::kCuda);
  ASSERT_EQ(gpu.device(), Device::kCuda);
  const auto prompt = prompt_for(cpu, dir);
  const bool recorded = reference_prompt_is_sparse(cpu, dir);
  const int64_t T = prompt.size(), V = cpu.config().vocab_size, CH = cpu.config().hc_width();
  ASSERT_GT(T, cpu.config().indexer_budget + cpu.config().indexer_compress_ratio)
      << "the prompt must be longer than the QSA budget so the block top-k drops blocks";
  // After the recorded prompt, its recorded greedy tokens (so transformers' decode logits apply too).
  const std::vector<int32_t> next = recorded ? testing::Reference(dir).ids("greedy_ids") : random_prompt(8, V, 5);
  const int64_t N = next.size();
  const ForwardRun c = prefill_and_decode(cpu, prompt, next), g = prefill_and_decode(gpu, prompt, next);

  const auto dl = compare(g.logits.data(), c.logits.data(), T, V);
  EXPECT_LE(dl.rel(), 1e-4) << "prompt logits max|Δ| " << dl.max_abs << " max|ref| " << dl.max_ref;
  EXPECT_EQ(dl.argmax_mismatches, 0) << "first at row " << dl.first_mismatch_row;
  const auto dh = compare(g.hidden.data(), c.hidden.data(), T, CH);
  EXPECT_LE(dh.rel(), 1e-4) << "prompt streams max|Δ| " << dh.max_abs << " max|ref| " << dh.max_ref;
  const auto dd = compare(g.decode.data(), c.decode.data(), N, V);
  EXPECT_LE(dd.rel(), 1e-4) << "decode logits max|Δ| " << dd.max_abs << " max|ref| " << dd.max_ref;
  EXPECT_EQ(dd.argmax_mismatches, 0) << "first at step " << dd.first_mismatch_row;
  const auto ddh = compare(g.decode_hidden.data(), c.decode_hidden.data(), N, CH);
  EXPECT_LE(ddh.rel(), 1e-4) << "decode streams max|Δ| " << ddh.max_abs;

  ASSERT_GT(cpu.num_mtp_layers(), 0);
  // MTP layer 0 teacher-forced over the prompt, from the same streams on both backends.
  std::vector<float> cd(size_t((T - 1) * V)), gd(cd.size());
  cpu.prompt_draft_logits(prompt.data(), T, c.hidden.data(), cd.data());
  gpu.prompt_draft_logits(prompt.data(), T, c.hidden.data(), gd.data());
  const auto d = compare(gd.data(), cd.data(), T - 1, V);
  EXPECT_LE(d.rel(), 1e-4) << "teacher-forced draft logits max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;

  // A live round of 3 steps: step 0 by layer 0 after its catch-up, steps 1 and 2 by layer s % L, each reusing
  // the QSA selection and cache of the steps before it.
  constexpr int kSteps = 3;
  const auto cr = draft_round_logits(cpu, prompt, c.hidden.data(), next, kSteps);
  const auto gr = draft_round_logits(gpu, prompt, c.hidden.data(), next, kSteps);
  ASSERT_EQ(cr.size(), size_t(kSteps * V));
  ASSERT_EQ(gr.size(), cr.size());
  const auto dr = compare(gr.data(), cr.data(), kSteps, V);
  EXPECT_LE(dr.rel(), 1e-4) << "draft round logits max|Δ| " << dr.max_abs << " max|ref| " << dr.max_ref;
  EXPECT_EQ(dr.argmax_mismatches, 0) << "first at step " << dr.first_mismatch_row;

  if (recorded) {  // and the GPU's own chain against transformers (the CPU's is in qwen4_exp_parity_test.cpp)
    testing::Reference ref(dir);
    const auto rl = ref.f32(exact_name(ref, "logits"));
    const auto tl = compare(g.logits.data(), rl.data(), T, V);
    EXPECT_LE(tl.rel(), 1e-4) << "prompt logits against transformers: max|Δ| " << tl.max_abs;
    EXPECT_EQ(tl.argmax_mismatches, 0);
    const auto rh = ref.f32(exact_name(ref, "multi_hidden"));
    const auto th = compare(g.hidden.data(), rh.data(), T, CH);
    EXPECT_LE(th.rel(), 1e-4) << "streams against transformers: max|Δ| " << th.max_abs;
    const auto rd = ref.f32(exact_name(ref, "decode_logits"));
    const auto td = compare(g.decode.data(), rd.data(), N, V);
    EXPECT_LE(td.rel(), 1e-4) << "decode logits against transformers: max|Δ| " << td.max_abs;
    EXPECT_EQ(td.argmax_mismatches, 0);
    std::vector<float> own(size_t((T - 1) * V));
    gpu.prompt_draft_logits(prompt.data(), T, g.hidden.data(), own.data());
    const auto rm = ref.f32(exact_name(ref, "draft_logits"));
    const auto tm = compare(own.data(), rm.data(), T - 1, V);
    EXPECT_LE(tm.rel(), 1e-4) << "draft logits against transformers: max|Δ| " << tm.max_abs;
    EXPECT_EQ(tm.argmax_mismatches, 0);
  }
}

// On the GPU as on the CPU: prefill, then single rows and a 4-row block (a verify), gives the bits of one
// forward over all of it, logits and streams (the Gated DeltaNet state carried across forwards, the QSA cache).
TEST_P(CudaQwen4Exp, DecodeStepsEqualAFullRecomputeBitForBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  Qwen4ExpModel m(dir, &pool_);
  m.use_device(Device::kCuda);
  const auto prompt = prompt_for(m, dir);
  const std::vector<int32_t> next = random_prompt(12, m.config().vocab_size, 6);
  const int64_t T = prompt.size(), N = next.size(), V = m.config().vocab_size, CH = m.config().hc_width();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), next.begin(), next.end());
  std::vector<float> full(size_t((T + N) * V)), full_hidden(size_t((T + N) * CH));
  {
    auto seq = m.new_sequence(T + N);
    run(m, *seq, all.data(), T + N, full.data(), full_hidden.data());
  }
  auto seq = m.new_sequence(T + N);
  std::vector<float> out(size_t(T * V)), hidden(size_t(T * CH));
  run(m, *seq, prompt.data(), T, out.data(), hidden.data());
  EXPECT_EQ(0, std::memcmp(out.data(), full.data(), size_t(T * V) * sizeof(float))) << "prefill logits";
  EXPECT_EQ(0, std::memcmp(hidden.data(), full_hidden.data(), size_t(T * CH) * sizeof(float))) << "prefill streams";
  for (int64_t i = 0; i < N;) {
    const int64_t rows = i == 1 ? std::min<int64_t>(4, N - i) : 1;
    run(m, *seq, &next[i], rows, out.data(), hidden.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = T + i + r;
      ASSERT_EQ(0, std::memcmp(out.data() + r * V, full.data() + p * V, size_t(V) * sizeof(float)))
          << "logits at position " << p << " (step of " << rows << " rows)";
      ASSERT_EQ(0, std::memcmp(hidden.data() + r * CH, full_hidden.data() + p * CH, size_t(CH) * sizeof(float)))
          << "streams at position " << p << " (step of " << rows << " rows)";
    }
    i += rows;
  }
}

// Kernel branches (cuda::branch_begin: the selection beside the queries' and keys' norms, the shared expert
// beside the routed ones) change when kernels run, never a value: a prefill and decode steps with them give the
// bits of the same forwards without.
TEST_P(CudaQwen4Exp, KernelBranchesChangeNoBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  cuda_test::expect_branches_change_no_bit([&] {  // prefill and decode logits and streams
    Qwen4ExpModel m(GetParam(), &pool_);
    m.use_device(Device::kCuda);
    const ForwardRun r = prefill_and_decode(m, prompt_for(m, GetParam()), random_prompt(6, m.config().vocab_size, 7));
    return std::vector<std::vector<float>>{r.logits, r.hidden, r.decode, r.decode_hidden};
  });
}

// Forwards of 9..16 rows all run as 16 (padding rows after the real ones, forward_graphs.h): one shape, so one
// eager run and one recording, then replays; and the padding changes no real row: a prompt's first n rows are
// the bits of the same rows in the unpadded 16-row forward.
TEST_P(CudaQwen4Exp, ForwardsOfNearbyRowCountsShareAGraphAndPaddingChangesNoRow) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  Qwen4ExpModel m(dir, &pool_);
  m.use_device(Device::kCuda);
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(16, V, 21);
  std::vector<float> whole(size_t(16 * V)), part(whole.size());
  {
    auto seq = m.new_sequence(16);
    run(m, *seq, prompt.data(), 16, whole.data(), nullptr);
  }
  const uint64_t before = m.one_off_forwards();
  for (int64_t n = 9; n <= 15; ++n) {
    auto seq = m.new_sequence(n);
    run(m, *seq, prompt.data(), n, part.data(), nullptr);
    ASSERT_EQ(0, std::memcmp(part.data(), whole.data(), size_t(n * V) * sizeof(float))) << n << " rows";
  }
  EXPECT_LE(m.one_off_forwards() - before, 1u) << "forwards of 9..15 rows ran as the 16-row shape, recorded once";
}

// Verify blocks of 8 rows (k = 7) of which the first 1..8 are kept, each rolled back to its kept rows before
// the next: with exactly 8 state slots (the CLI's k + 1), the shortest keep reads back the oldest slot the
// block left. Every kept row, and so every later one, is the bits of a full recompute.
TEST_P(CudaQwen4Exp, RejectedVerifyRowsRollBackWithoutATraceBitForBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  constexpr int64_t kRows = 8;
  Qwen4ExpModel m(dir, &pool_);
  m.use_device(Device::kCuda);
  MemoryOptions mem;
  mem.max_verify_rows = kRows;
  m.configure_memory(mem);
  const auto prompt = prompt_for(m, dir);
  const int64_t T = prompt.size(), V = m.config().vocab_size;
  const int64_t N = kRows * (kRows + 1) / 2 + 1;  // the kept rows of keeps 1..8, then one decode step
  const std::vector<int32_t> next = random_prompt(N, V, 8), junk = random_prompt(kRows, V, 9);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), next.begin(), next.end());
  std::vector<float> full(size_t((T + N) * V));
  {
    auto seq = m.new_sequence(T + N);
    run(m, *seq, all.data(), T + N, full.data(), nullptr);
  }
  auto seq = m.new_sequence(T + N + kRows);
  std::vector<float> out(size_t(std::max(T, kRows) * V));
  run(m, *seq, prompt.data(), T, out.data(), nullptr);
  int64_t i = 0;
  for (int64_t keep = 1; keep <= kRows; ++keep) {
    // The kept rows are the sequence's own tokens; the rejected ones differ from them (junk + 1 mod V if equal).
    std::vector<int32_t> block(next.begin() + i, next.begin() + i + keep);
    for (int64_t r = keep; r < kRows; ++r) {
      const int32_t j = junk[size_t(r)];
      block.push_back(j == next[size_t(i + r)] ? (j + 1) % int32_t(V) : j);
    }
    run(m, *seq, block.data(), kRows, out.data(), nullptr);
    for (int64_t r = 0; r < keep; ++r)
      ASSERT_EQ(0, std::memcmp(out.data() + r * V, full.data() + (T + i + r) * V, size_t(V) * sizeof(float)))
          << "position " << T + i + r << ": row " << r << " of a block keeping " << keep;
    seq->rollback(T + i + keep);
    ASSERT_EQ(seq->length(), T + i + keep);
    i += keep;
  }
  ASSERT_EQ(i + 1, N);
  run(m, *seq, &next[size_t(i)], 1, out.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(out.data(), full.data() + (T + i) * V, size_t(V) * sizeof(float)))
      << "the decode step after the last rollback";
}

// Greedy speculation on the GPU: the target's tokens exactly, for k = 1..7, each k on a model whose sequences
// keep k + 1 state slots (as the CLI sizes them), so that every rejection rolls the recurrent state back within
// the tightest ring. The plain run's ids are the device's argmax; a second plain run with logprobs takes the
// host's argmax of the whole rows. On the fixtures (random MTP layers, whose drafts are seldom right) a second
// run per k forces drafts right except at every third position, for partial acceptance; the bundled model's
// trained layers get partial acceptance of their own.
TEST_P(CudaQwen4Exp, GreedySpeculationEqualsPlainGreedyForKOneToSeven) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  MemoryOptions one_slot;  // plain decoding verifies one row: one state slot, as the CLI gives it
  one_slot.max_verify_rows = 1;
  const auto plain_model = load_on_gpu(dir, &pool_, one_slot);
  const ModelFacts& f = plain_model->facts();
  if (f.num_mtp_layers == 0) GTEST_SKIP() << "no MTP layers";
  const int N = int(2 * f.sparse_budget + 4);
  SamplingParams sp;
  sp.max_tokens = N;
  std::vector<std::vector<int32_t>> prompts, refs;
  for (int p = 0; p < 4; ++p) {
    prompts.push_back(random_prompt(1 + p * (f.sparse_budget + 3), f.vocab_size, 40 + p));
    SpecOptions plain;
    plain.enabled = false;
    const auto ref = Generator(*plain_model).generate(prompts.back(), sp, plain);
    ASSERT_EQ(int(ref.ids.size()), N) << ref.finish_reason << " " << ref.error;
    SamplingParams whole_rows = sp;
    whole_rows.logprobs = 0;
    ASSERT_EQ(Generator(*plain_model).generate(prompts.back(), whole_rows, plain).ids, ref.ids)
        << "prompt length " << prompts.back().size();
    refs.push_back(ref.ids);
  }
  const bool forced = dir != kBundled;
  int64_t drafts = 0, accepted = 0, forced_drafted = 0, forced_accepted = 0;
  for (int k = 1; k <= 7; ++k) {
    MemoryOptions mem;
    mem.max_verify_rows = k + 1;
    const auto model = load_on_gpu(dir, &pool_, mem);
    for (size_t p = 0; p < prompts.size(); ++p) {
      const auto& ref = refs[p];
      SpecOptions so;
      so.num_speculative_tokens = k;
      const auto got = Generator(*model).generate(prompts[p], sp, so);
      ASSERT_EQ(got.ids, ref) << "prompt length " << prompts[p].size() << " k " << k << ": " << got.error;
      drafts += got.stats.num_draft_tokens;
      accepted += got.stats.num_accepted_tokens;
      if (!forced) continue;
      const int64_t n = prompts[p].size();
      so.draft_hook = [&ref, n, V = f.vocab_size](int64_t pos, int, int32_t d) -> int32_t {
        const int64_t i = pos - n;  // index into the generated ids
        if (i < 0 || i >= int64_t(ref.size())) return d;
        return pos % 3 == 0 ? (ref[size_t(i)] + 1) % int32_t(V) : ref[size_t(i)];
      };
      const auto hooked = Generator(*model).generate(prompts[p], sp, so);
      ASSERT_EQ(hooked.ids, ref) << "forced drafts, prompt length " << n << " k " << k << ": " << hooked.error;
      forced_drafted += hooked.stats.num_draft_tokens;
      forced_accepted += hooked.stats.num_accepted_tokens;
    }
  }
  EXPECT_GT(drafts, 0);
  if (forced) {
    EXPECT_GT(forced_accepted, 0) << "some forced drafts were accepted";
    EXPECT_LT(forced_accepted, forced_drafted) << "and some rejected";
  } else {
    EXPECT_GT(accepted, 0) << "the trained MTP layers' drafts were accepted at times";
    EXPECT_LT(accepted, drafts) << "and rejected at times";
  }
}

// n sequences decoding together (greedy and sampled, speculating with k 0..4, prompts of many lengths, within
// and past the QSA budget) give each one's tokens, draft counts and logprobs bit for bit as it alone, for n up
// to 64; greedy ones without logprobs (argmax ids from the device) share the forwards with ones that read whole
// rows. The memory holds all 64 at once (state slots and pages), and all n are seen decoding at once.
TEST_P(CudaQwen4Exp, SequencesDecodedTogetherMatchEachAloneUpToSixtyFour) {
  NEXTN_SKIP_WITHOUT_CUDA();
  constexpr int kMax = 64, kTokens = 12, kMaxK = 4;
  const auto model = load_model(GetParam(), &pool_);
  model->use_device(Device::kCuda);
  const ModelFacts& f = model->facts();
  const int64_t longest_prompt = 2 * f.sparse_budget + 9;
  MemoryOptions mem;
  mem.max_verify_rows = kMaxK + 1;
  // (an engine sequence reserves prompt + max_tokens + k_max + 2 positions)
  mem.kv_cache_bytes = model->memory_bytes_for(kMax, longest_prompt + kTokens + kMaxK + 2, mem.page_tokens);
  model->configure_memory(mem);
  auto request = [&](int i) {
    Request r;
    r.prompt = random_prompt(1 + (i * 7) % longest_prompt, f.vocab_size, 500 + i);
    r.params.max_tokens = kTokens;
    r.params.logprobs = i % 4 == 2 ? -1 : 1;  // greedy without logprobs: its rows come back as argmax ids
    if (i % 3 == 1) {
      r.params.temperature = 0.8f;
      r.params.seed = 900 + i;
    }
    const int k = f.num_mtp_layers > 0 ? i % (kMaxK + 1) : 0;
    r.spec.enabled = k > 0;
    r.spec.num_speculative_tokens = std::max(k, 1);
    return r;
  };
  std::vector<GenerationResult> alone;
  for (int i = 0; i < kMax; ++i) {
    Engine e(*model);
    e.submit(request(i));
    e.run();
    alone.push_back(std::move(e.take_finished().at(0).second));
    ASSERT_EQ(alone.back().finish_reason, "length") << "request " << i << ": " << alone.back().error;
    ASSERT_EQ(alone.back().ids.size(), size_t(kTokens)) << "request " << i;
  }
  for (int n : {2, 7, 64}) {
    Engine engine(*model, EngineOptions{kMax});
    for (int i = 0; i < n; ++i) engine.submit(request(i));
    size_t together = 0;
    while (!engine.idle()) {
      engine.step();
      together = std::max(together, engine.active());
    }
    EXPECT_EQ(together, size_t(n)) << "the memory holds all " << n << " sequences at once";
    auto done = engine.take_finished();
    ASSERT_EQ(done.size(), size_t(n));
    for (auto& [id, res] : done) {
      ASSERT_EQ(res.ids, alone[id].ids) << n << " sequences, request " << id << ": " << res.error;
      // The drafts too (a fixed k): an MTP forward's padding rows change no real row.
      EXPECT_EQ(res.stats.num_draft_tokens, alone[id].stats.num_draft_tokens) << n << " sequences, request " << id;
      EXPECT_EQ(res.stats.num_accepted_tokens, alone[id].stats.num_accepted_tokens)
          << n << " sequences, request " << id;
      ASSERT_EQ(res.logprobs.size(), alone[id].logprobs.size());
      for (size_t t = 0; t < res.logprobs.size(); ++t)
        ASSERT_EQ(0, std::memcmp(&res.logprobs[t].logprob, &alone[id].logprobs[t].logprob, sizeof(float)))
            << n << " sequences, request " << id << " token " << t;
    }
  }
}

// The family runs on CUDA (the CLI's --device auto picks the GPU for it), and a model that already has
// sequences refuses to move, either way, and keeps running where it is: their memory lives on one device.
TEST_P(CudaQwen4Exp, RunsOnCudaAndRefusesToMoveWithSequences) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  auto expect_refusal = [&](Model& m, Device to, Device stays) {
    const int64_t V = m.facts().vocab_size;
    const std::vector<int32_t> prompt = random_prompt(5, V, 3);
    auto seq = m.new_sequence(int64_t(prompt.size()) + 1);
    try {
      m.use_device(to);
      ADD_FAILURE() << "expected an error moving a model with sequences";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sequences"), std::string::npos) << e.what();
    }
    EXPECT_EQ(m.device(), stays);
    std::vector<float> logits(size_t(prompt.size()) * size_t(V));
    run(m, *seq, prompt.data(), int64_t(prompt.size()), logits.data(), nullptr);
    const int32_t t = int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
    std::vector<float> one(static_cast<size_t>(V));
    run(m, *seq, &t, 1, one.data(), nullptr);
    EXPECT_EQ(seq->length(), int64_t(prompt.size()) + 1);
    EXPECT_TRUE(std::all_of(one.begin(), one.end(), [](float v) { return std::isfinite(v); }));
  };

  auto cpu = load_model(dir, &pool_);
  EXPECT_TRUE(cpu->runs_on(Device::kCuda));  // (--device auto takes the GPU)
  EXPECT_TRUE(cpu->runs_on(Device::kCpu));
  EXPECT_EQ(cpu->device(), Device::kCpu);
  expect_refusal(*cpu, Device::kCuda, Device::kCpu);

  auto gpu = load_model(dir, &pool_);
  gpu->use_device(Device::kCuda);
  EXPECT_EQ(gpu->device(), Device::kCuda);
  expect_refusal(*gpu, Device::kCpu, Device::kCuda);
}

// (no instantiation prefix: the tests are CudaQwen4Exp.<test>/<model>, selected by 'CudaQwen4Exp*')
TEST_P(CudaQwen4Exp, PreparedForwardsLeaveABatchNoOneOffWorkAndChangeNoBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  auto on_gpu = [&] {  // (memory: set by the check)
    auto m = load_model(GetParam(), &pool_);
    m->use_device(Device::kCuda);
    return m;
  };
  testing::check_prepared_forwards(*on_gpu(), *on_gpu());
}

INSTANTIATE_TEST_SUITE_P(, CudaQwen4Exp,
                         ::testing::Values(testing::qwen4_exp_fixture_dir("a_fp32"),
                                           testing::qwen4_exp_fixture_dir("b_fp32"),
                                           testing::qwen4_exp_fixture_dir("c_bf16"),
                                           testing::qwen4_exp_fixture_dir("d_fp8"), kBundled),
                         [](const auto& param_info) { return testing::fixture_test_name(param_info.param); });

}  // namespace
}  // namespace nextn
