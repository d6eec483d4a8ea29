// HY V4 on the CUDA backend (models/hy_v4/cuda_blocks.*) against the CPU backend and transformers: logits,
// hidden states and MTP draft logits within the fixtures' tolerance (fp32 compute on both: max|Δ| <= 1e-4 ·
// max|ref|, identical argmax), and the GPU's own exactness: decode steps bit-identical to a full recompute,
// greedy speculation equal to plain greedy for k = 1..7, and each of many sequences decoded together
// bit-identical to it alone. Without a usable GPU every test reports itself skipped, with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"

#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "models/hy_v4/cuda_blocks.h"
#include "models/hy_v4/routing.h"
#include "models/registry.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_test_util.h"
#include "prepared_forwards_check.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::compare;

const std::string kBundled = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(size_t(std::max<int64_t>(len, 1)));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
  return p;
}

std::unique_ptr<Model> load_on_gpu(const std::string& dir, ThreadPool* pool) {
  auto m = load_model(dir, pool);
  m->use_device(Device::kCuda);
  return m;
}

// Logits (all rows) and hidden states of a prompt's prefill, then of `steps` decode steps.
struct ForwardRun {
  std::vector<float> logits, hidden, decode;
};
ForwardRun prefill_and_decode(HYV4Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& next) {
  const int64_t T = prompt.size(), N = next.size(), V = m.config().vocab_size, H = m.config().hidden_size;
  ForwardRun r;
  r.logits.resize(size_t(T * V));
  r.hidden.resize(size_t(T * H));
  r.decode.resize(size_t(N * V));
  KVCache cache = m.new_cache(T + N);
  m.forward(prompt.data(), T, cache, r.logits.data(), r.hidden.data());
  for (int64_t i = 0; i < N; ++i) m.forward(&next[i], 1, cache, r.decode.data() + i * V, nullptr);
  return r;
}

class CudaHYV4 : public ::testing::TestWithParam<std::string> {
 protected:
  ThreadPool pool_{2};
};

bool has_reference(const std::string& dir) {
  return std::filesystem::exists(dir + "/reference.safetensors") && testing::Reference(dir).has("input_ids");
}

// The prompt: the fixture's recorded one where there is a reference, else random, past the sparse budget.
std::vector<int32_t> prompt_for(const HYV4Model& m, const std::string& dir) {
  if (has_reference(dir)) return testing::Reference(dir).ids("input_ids");
  return random_prompt(3 * m.config().index_topk + 5, m.config().vocab_size, 11);
}

TEST_P(CudaHYV4, LogitsHiddenAndDraftLogitsMatchTheCpuBackend) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  HYV4Model cpu(dir, &pool_), gpu(dir, &pool_);
  gpu.use_device(Device::kCuda);
  const auto prompt = prompt_for(cpu, dir);
  const int64_t T = prompt.size(), V = cpu.config().vocab_size, H = cpu.config().hidden_size;
  ASSERT_GT(T, cpu.config().index_topk) << "the prompt must be longer than index_topk so DSA drops keys";
  const std::vector<int32_t> next = random_prompt(8, V, 5);
  const ForwardRun c = prefill_and_decode(cpu, prompt, next), g = prefill_and_decode(gpu, prompt, next);

  const auto dl = compare(g.logits.data(), c.logits.data(), T, V);
  EXPECT_LE(dl.rel(), 1e-4) << "prompt logits max|Δ| " << dl.max_abs << " max|ref| " << dl.max_ref;
  EXPECT_EQ(dl.argmax_mismatches, 0) << "first at row " << dl.first_mismatch_row;
  const auto dh = compare(g.hidden.data(), c.hidden.data(), T, H);
  EXPECT_LE(dh.rel(), 1e-4) << "hidden max|Δ| " << dh.max_abs;
  const auto dd = compare(g.decode.data(), c.decode.data(), next.size(), V);
  EXPECT_LE(dd.rel(), 1e-4) << "decode logits max|Δ| " << dd.max_abs;
  EXPECT_EQ(dd.argmax_mismatches, 0);

  if (cpu.num_mtp_layers() > 0) {
    std::vector<float> cd(size_t((T - 1) * V)), gd(cd.size());
    cpu.prompt_draft_logits(prompt.data(), T, c.hidden.data(), cd.data());
    gpu.prompt_draft_logits(prompt.data(), T, c.hidden.data(), gd.data());  // (the same h_prev for both)
    const auto d = compare(gd.data(), cd.data(), T - 1, V);
    EXPECT_LE(d.rel(), 1e-4) << "draft logits max|Δ| " << d.max_abs;
    EXPECT_EQ(d.argmax_mismatches, 0);
  }
  if (has_reference(dir)) {
    testing::Reference ref(dir);
    const std::string exact = ref.has("logits_f32up") ? "logits_f32up" : "logits";
    if (ref.has(exact)) {
      const auto r = ref.f32(exact);
      const auto d = compare(g.logits.data(), r.data(), T, V);
      EXPECT_LE(d.rel(), 1e-4) << "against transformers: max|Δ| " << d.max_abs;
      EXPECT_EQ(d.argmax_mismatches, 0);
    }
  }
}

// On the GPU as on the CPU: prefill, then one token at a time, gives the bits of one forward over all of it.
TEST_P(CudaHYV4, DecodeStepsEqualAFullRecomputeBitForBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = GetParam();
  HYV4Model m(dir, &pool_);
  m.use_device(Device::kCuda);
  const auto prompt = prompt_for(m, dir);
  const std::vector<int32_t> next = random_prompt(12, m.config().vocab_size, 6);
  const int64_t T = prompt.size(), N = next.size(), V = m.config().vocab_size;
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), next.begin(), next.end());
  KVCache full_cache = m.new_cache(T + N);
  std::vector<float> full(size_t((T + N) * V));
  m.forward(all.data(), T + N, full_cache, full.data(), nullptr);
  const ForwardRun r = prefill_and_decode(m, prompt, next);
  EXPECT_EQ(0, std::memcmp(r.logits.data(), full.data(), size_t(T * V) * sizeof(float))) << "prefill";
  for (int64_t i = 0; i + 1 < N; ++i)
    ASSERT_EQ(0, std::memcmp(r.decode.data() + i * V, full.data() + (T + i) * V, size_t(V) * sizeof(float)))
        << "decode step " << i;
}

// Greedy speculation on the GPU: the target's tokens exactly, for k = 1..7 (and the device's argmax ids are
// the host's argmax of the whole rows).
TEST_P(CudaHYV4, GreedySpeculationEqualsPlainGreedyForKOneToSeven) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const auto model = load_on_gpu(GetParam(), &pool_);
  const ModelFacts& f = model->facts();
  if (f.num_mtp_layers == 0) GTEST_SKIP() << "no MTP layers";
  const int N = int(2 * f.sparse_budget + 4);
  int64_t drafts = 0, accepted = 0;
  for (int p = 0; p < 4; ++p) {
    const auto prompt = random_prompt(1 + p * (f.sparse_budget + 3), f.vocab_size, 40 + p);
    SamplingParams sp;
    sp.max_tokens = N;
    SpecOptions plain;
    plain.enabled = false;
    const auto ref = Generator(*model).generate(prompt, sp, plain);  // (argmax ids from the device)
    ASSERT_EQ(int(ref.ids.size()), N);
    SamplingParams whole_rows = sp;  // logprobs: the rows come back whole, the host takes their argmax
    whole_rows.logprobs = 0;
    ASSERT_EQ(Generator(*model).generate(prompt, whole_rows, plain).ids, ref.ids) << "prompt length " << prompt.size();
    for (int k = 1; k <= 7; ++k) {
      SpecOptions so;
      so.num_speculative_tokens = k;
      const auto got = Generator(*model).generate(prompt, sp, so);
      ASSERT_EQ(got.ids, ref.ids) << "prompt length " << prompt.size() << " k " << k;
      drafts += got.stats.num_drafts;
      accepted += got.stats.num_accepted_tokens;
    }
  }
  EXPECT_GT(drafts, 0);
  // (the fixtures' random MTP layers never guess right; the bundled model's trained ones do)
  if (GetParam() == kBundled) {
    EXPECT_GT(accepted, 0) << "some drafts were accepted";
  }
}

// n sequences decoding together (greedy and sampled, speculating with k 0..4) give each one's tokens and
// logprobs bit for bit as it alone, for n up to 64; greedy ones without logprobs (argmax ids from the device)
// share the forwards with ones that read whole rows.
TEST_P(CudaHYV4, SequencesDecodedTogetherMatchEachAloneUpToSixtyFour) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const auto model = load_on_gpu(GetParam(), &pool_);
  const ModelFacts& f = model->facts();
  auto request = [&](int i) {
    Request r;
    r.prompt = random_prompt(1 + (i * 7) % (2 * f.sparse_budget + 9), f.vocab_size, 500 + i);
    r.params.max_tokens = 12;
    r.params.logprobs = i % 4 == 2 ? -1 : 1;  // greedy without logprobs: its rows come back as argmax ids
    if (i % 3 == 1) {
      r.params.temperature = 0.8f;
      r.params.seed = 900 + i;
    }
    const int k = f.num_mtp_layers > 0 ? i % 5 : 0;
    r.spec.enabled = k > 0;
    r.spec.num_speculative_tokens = std::max(k, 1);
    return r;
  };
  constexpr int kMax = 64;
  std::vector<GenerationResult> alone;
  for (int i = 0; i < kMax; ++i) {
    Engine e(*model);
    e.submit(request(i));
    e.run();
    alone.push_back(std::move(e.take_finished().at(0).second));
  }
  for (int n : {2, 7, 64}) {
    Engine engine(*model, EngineOptions{kMax});
    for (int i = 0; i < n; ++i) engine.submit(request(i));
    engine.run();
    auto done = engine.take_finished();
    ASSERT_EQ(done.size(), size_t(n));
    for (auto& [id, res] : done) {
      ASSERT_EQ(res.ids, alone[id].ids) << n << " sequences, request " << id << ": " << res.error;
      // The drafts too (a fixed k): an MTP forward's padding rows (cuda_blocks.cpp) change no real row.
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

// Kernel branches (cuda::branch_begin: the key path beside the query path, the shared expert beside the routed
// ones) change when kernels run, never a value: a prefill and decode steps (graph replays) with them give the
// bits of the same forwards without.
TEST_P(CudaHYV4, KernelBranchesChangeNoBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  cuda_test::expect_branches_change_no_bit([&] {  // prefill logits and hidden states, decode logits
    HYV4Model m(GetParam(), &pool_);
    m.use_device(Device::kCuda);
    const ForwardRun r = prefill_and_decode(m, prompt_for(m, GetParam()), random_prompt(6, m.config().vocab_size, 7));
    return std::vector<std::vector<float>>{r.logits, r.hidden, r.decode};
  });
}

TEST_P(CudaHYV4, PreparedForwardsLeaveABatchNoOneOffWorkAndChangeNoBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  testing::check_prepared_forwards(*load_on_gpu(GetParam(), &pool_), *load_on_gpu(GetParam(), &pool_));
}

INSTANTIATE_TEST_SUITE_P(Models, CudaHYV4,
                         ::testing::Values(testing::fixture_dir("a_fp32"), testing::fixture_dir("b_fp32"),
                                           testing::fixture_dir("c_bf16"),
                                           std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4_fp8/fp8_bf16_mtp",
                                           std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4_fp8/fp8_ue8m0",
                                           kBundled),
                         [](const auto& param_info) { return testing::fixture_test_name(param_info.param); });

// The router's decisions on the device are the host's (routing.h): the same experts, the same weights.
TEST(CudaDevice, MoeRoutingAndDispatchOnTheDeviceMatchTheHost) {
  NEXTN_SKIP_WITHOUT_CUDA();
  HYV4Config c;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  FfnWeights f;
  const int64_t S = 37, E = c.n_routed_experts, k = c.num_experts_per_tok;
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t e = 0; e < E; ++e) f.e_bias.push_back(0.1f * g(rng));
  std::vector<float> logits(size_t(S * E));
  for (float& v : logits) v = g(rng);
  std::vector<int32_t> ids(size_t(S * k));
  std::vector<float> w(size_t(S * k));
  route_tokens(c, f, logits.data(), S, ids.data(), w.data());
  cuda::DeviceBuffer dl(logits.size() * 4), db(f.e_bias.size() * 4), di(ids.size() * 4), dw(w.size() * 4);
  dl.upload(logits.data(), dl.bytes());
  db.upload(f.e_bias.data(), db.bytes());
  const cuda::MoeRouting r = moe_routing(c);
  cuda::moe_route(dl.f32(), db.f32(), S, r, static_cast<int32_t*>(di.get()), dw.f32());
  cuda::synchronize();
  std::vector<int32_t> gids(ids.size());
  std::vector<float> gw(w.size());
  di.download(gids.data(), di.bytes());
  dw.download(gw.data(), dw.bytes());
  EXPECT_EQ(gids, ids);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(gw[i], w[i], 1e-6 * (1 + std::fabs(w[i]))) << i;

  // and the grouping of those choices by expert (S·k = 148 choices: several 32-choice reads per expert),
  // experts ascending and each expert's choices in (token, slot) order
  std::vector<int32_t> first(size_t(E + 1), 0), token_of, row_of(ids.size(), -1);
  for (int64_t e = 0; e < E; ++e) {
    first[size_t(e)] = int32_t(token_of.size());
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == e) {
        row_of[i] = int32_t(token_of.size());
        token_of.push_back(int32_t(int64_t(i) / k));
      }
  }
  first[size_t(E)] = int32_t(token_of.size());
  cuda::DeviceBuffer dfirst(first.size() * 4), dtoken(token_of.size() * 4), drow(row_of.size() * 4);
  cuda::moe_dispatch(static_cast<const int32_t*>(di.get()), S, k, E, static_cast<int32_t*>(dfirst.get()),
                     static_cast<int32_t*>(dtoken.get()), static_cast<int32_t*>(drow.get()));
  cuda::synchronize();
  std::vector<int32_t> gfirst(first.size()), gtoken(token_of.size()), grow(row_of.size());
  dfirst.download(gfirst.data(), dfirst.bytes());
  dtoken.download(gtoken.data(), dtoken.bytes());
  drow.download(grow.data(), drow.bytes());
  EXPECT_EQ(gfirst, first);
  EXPECT_EQ(gtoken, token_of);
  EXPECT_EQ(grow, row_of);
}

}  // namespace
}  // namespace nextn
