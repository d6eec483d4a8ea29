// The engine runs many sequences together; each must come out exactly as it would alone: the same tokens
// (greedy, and sampled with the same seed) and bit-identical logprobs (so bit-identical logits), whatever else
// shares its forwards, whenever it was admitted, whatever its k — on the committed fixtures (1 and 2 MTP
// layers) and the bundled model. Also: rejected drafts leave no trace, and the KV pool bounds admission.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "models/registry.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::fixture_dir;

const std::string kBundled = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
  return p;
}

// Request i of 8: prompt lengths from 1 to past the sparse budget, k from 0 (plain) to 4, greedy (some with
// tuned k) and sampled with its own seed; every request asks for logprobs.
Request make_request(int i, const ModelFacts& f, int max_tokens) {
  Request r;
  const int64_t budget = std::max<int64_t>(f.sparse_budget, 1);
  const int64_t lengths[8] = {1, budget / 2, budget - 1, budget, budget + 1, budget + 7, 2 * budget + 3, 5};
  r.prompt = random_prompt(std::max<int64_t>(1, lengths[i % 8]), f.vocab_size, 100 + i);
  r.params.max_tokens = max_tokens;
  r.params.logprobs = 2;
  if (i % 3 == 1) {
    r.params.temperature = 0.8f;
    r.params.top_p = 0.95f;
    r.params.seed = 1000 + i;
  }
  const int k = i % 5;  // 0: plain decoding
  r.spec.enabled = k > 0;
  r.spec.num_speculative_tokens = std::max(k, 1);
  r.spec.tune_k = r.params.greedy() && i % 4 == 0 && k > 0;
  return r;
}

GenerationResult run_alone(Model& m, Request r) {
  Engine e(m);
  e.submit(std::move(r));
  e.run();
  auto done = e.take_finished();
  EXPECT_EQ(done.size(), 1u);
  return std::move(done.at(0).second);
}

void expect_same(const GenerationResult& got, const GenerationResult& want, const std::string& what) {
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what << ": " << got.error;
  ASSERT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t t = 0; t < got.logprobs.size(); ++t) {
    // bit for bit: the same logits row gave the same log-softmax
    EXPECT_EQ(std::memcmp(&got.logprobs[t].logprob, &want.logprobs[t].logprob, sizeof(float)), 0)
        << what << " token " << t << ": " << got.logprobs[t].logprob << " vs " << want.logprobs[t].logprob;
    EXPECT_EQ(got.logprobs[t].top, want.logprobs[t].top) << what << " token " << t;
  }
}

class CrossSequence : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = load_model(GetParam(), &pool_); }
  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
};

// 8 requests admitted at different steps (3 at once, then one every other step) run through one engine.
TEST_P(CrossSequence, EachSequenceIsExactlyAsAlone) {
  const ModelFacts& f = model_->facts();
  ASSERT_GE(f.num_mtp_layers, 1);
  const int max_tokens = 20;
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 8; ++i) alone.push_back(run_alone(*model_, make_request(i, f, max_tokens)));

  Engine engine(*model_);
  std::vector<int64_t> ids;
  int next = 0;
  size_t most_active = 0;
  for (int step = 0; next < 8 || !engine.idle(); ++step) {
    if (next < 3 || (next < 8 && step % 2 == 0)) ids.push_back(engine.submit(make_request(next++, f, max_tokens)));
    engine.step();
    most_active = std::max(most_active, engine.active());
  }
  EXPECT_GE(most_active, 4u) << "the sequences should overlap";
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 8u);
  int64_t drafted = 0;
  for (auto& [id, res] : done) {
    expect_same(res, alone[id], GetParam() + " request " + std::to_string(id));
    drafted += res.stats.num_draft_tokens;
    // The draft rounds ran with the others' (their MTP forwards batched): a fixed k drafts exactly as alone.
    if (!make_request(int(id), f, max_tokens).spec.tune_k) {
      EXPECT_EQ(res.stats.num_draft_tokens, alone[id].stats.num_draft_tokens) << "request " << id;
      EXPECT_EQ(res.stats.num_accepted_tokens, alone[id].stats.num_accepted_tokens) << "request " << id;
    }
  }
  EXPECT_GT(drafted, 0) << "speculation ran";
}

// Greedy requests without logprobs get their target rows' argmax from the model instead of the rows
// (BatchSegment::argmax). Sharing forwards with twins that read whole rows (the same requests asking for
// logprobs), each gives its twin's tokens and drafts.
TEST_P(CrossSequence, GreedyRowsReadAsArgmaxGiveTheTokensOfWholeRows) {
  const ModelFacts& f = model_->facts();
  Engine engine(*model_);
  std::map<int64_t, int64_t> twin_of;  // argmax-only request id -> its twin's
  for (int i : {0, 2, 3, 5, 6, 8}) {  // make_request's greedy ones: plain, fixed k and tuned k
    Request argmax_only = make_request(i, f, 16), twin = argmax_only;
    argmax_only.params.logprobs = -1;
    const int64_t a = engine.submit(std::move(argmax_only));
    twin_of[a] = engine.submit(std::move(twin));
  }
  engine.run();
  std::map<int64_t, GenerationResult> done;
  for (auto& [id, res] : engine.take_finished()) done[id] = std::move(res);
  ASSERT_EQ(done.size(), 2 * twin_of.size());
  for (const auto& [a, t] : twin_of) {
    const GenerationResult &got = done.at(a), &want = done.at(t);
    EXPECT_EQ(got.finish_reason, want.finish_reason) << "request " << a << ": " << got.error;
    EXPECT_TRUE(got.logprobs.empty());
    EXPECT_EQ(got.ids, want.ids) << "request " << a;
    EXPECT_EQ(got.stats.num_draft_tokens, want.stats.num_draft_tokens) << "request " << a;
    EXPECT_EQ(got.stats.num_accepted_tokens, want.stats.num_accepted_tokens) << "request " << a;
  }
}

// The sequences' decisions from their rows (sampling, acceptance, logprobs) run on the host pool's threads
// when they are worth it (Engine::decide_all); forced there, 10 requests that share their forwards (greedy and
// sampled, plain and speculative, all asking for logprobs) each give what they give alone, bit for bit.
TEST_P(CrossSequence, DecisionsOnTheHostThreadsGiveWhatEachGivesAlone) {
  const ModelFacts& f = model_->facts();
  ASSERT_NE(model_->host_pool(), nullptr);
  const int max_tokens = 12;
  EngineOptions options;
  options.split_decisions_for_tests = true;
  Engine engine(*model_, options);
  for (int i = 0; i < 10; ++i) engine.submit(make_request(i, f, max_tokens));
  engine.run();
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 10u);
  for (auto& [id, res] : done)
    expect_same(res, run_alone(*model_, make_request(int(id), f, max_tokens)), "request " + std::to_string(id));
}

INSTANTIATE_TEST_SUITE_P(Models, CrossSequence,
                         ::testing::Values(fixture_dir("a_fp32"), fixture_dir("b_fp32"), fixture_dir("c_bf16"),
                                           std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4_fp8/fp8_bf16_mtp",
                                           kBundled, testing::qwen4_exp_fixture_dir("a_fp32"),
                                           testing::qwen4_exp_fixture_dir("b_fp32"),
                                           testing::qwen4_exp_fixture_dir("c_bf16"),
                                           testing::qwen4_exp_fixture_dir("d_fp8"),
                                           std::string(NEXTN_SOURCE_DIR) + "/models/nextn-qwen4exp-tiny"),
                         [](const auto& param_info) { return testing::fixture_test_name(param_info.param); });

// A sequence whose every draft is rejected for 50 rounds, interleaved with others that speculate, rolls its
// target state back each round: its logits afterwards are bit for bit those of a sequence that never drafted.
TEST(EngineRollback, FiftyRejectedRoundsLeaveNoTrace) {
  for (const std::string& dir : {fixture_dir("b_fp32"), kBundled, testing::qwen4_exp_fixture_dir("a_fp32"),
                                 testing::qwen4_exp_fixture_dir("b_fp32")}) {
    ThreadPool pool(2);
    auto model = load_model(dir, &pool);
    const ModelFacts& f = model->facts();
    Request plain;
    plain.prompt = random_prompt(f.sparse_budget + 3, f.vocab_size, 5);
    plain.params.max_tokens = 52;
    plain.params.logprobs = 3;
    plain.spec.enabled = false;
    const GenerationResult ref = run_alone(*model, plain);
    ASSERT_EQ(ref.ids.size(), 52u);

    Request rejected = plain;
    rejected.spec.enabled = true;
    rejected.spec.num_speculative_tokens = 3;
    const int64_t n = int64_t(plain.prompt.size());
    // the drafted token for absolute position pos is replaced by one the target will not choose
    rejected.spec.draft_hook = [&ref, n, V = f.vocab_size](int64_t pos, int, int32_t) {
      return static_cast<int32_t>((ref.ids[pos - n] + 1) % V);
    };
    Engine engine(*model);
    const int64_t id = engine.submit(rejected);
    for (int i = 0; i < 3; ++i) engine.submit(make_request(i * 2, f, 40));
    engine.run();
    bool found = false;
    for (auto& [rid, res] : engine.take_finished()) {
      if (rid != id) continue;
      found = true;
      EXPECT_EQ(res.stats.num_drafts, 50) << dir;  // 51 rounds after the first token; the last has no room to draft
      EXPECT_EQ(res.stats.num_accepted_tokens, 0) << dir;
      expect_same(res, ref, dir + " all drafts rejected");
    }
    EXPECT_TRUE(found);
  }
}

// The KV pool is fixed: requests that do not fit wait for pages and then run exactly as alone; one that could
// never fit is refused at submit with a message that says so; pages come back when sequences finish.
TEST(EngineMemory, RequestsWaitForPagesAndTooLargeOnesAreRefused) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  const ModelFacts& f = model->facts();
  // room for two sequences of (prompt 12 + 16 tokens + k + 2) positions in pages of 16
  auto request = [&](int i) {
    Request r;
    r.prompt = random_prompt(12, f.vocab_size, 40 + i);
    r.params.max_tokens = 16;
    r.spec.num_speculative_tokens = 2;
    return r;
  };
  MemoryOptions mem;
  mem.page_tokens = 16;
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 5; ++i) alone.push_back(run_alone(*model, request(i)));
  auto small = load_model(fixture_dir("a_fp32"), &pool);
  // A pool that holds exactly two sequences: measured as 2 x the bytes of one (3 pages each).
  int64_t lo = 1, hi = int64_t(1) << 30;
  while (lo < hi) {  // the smallest pool that admits one sequence
    const int64_t mid = (lo + hi) / 2;
    auto m = load_model(fixture_dir("a_fp32"), nullptr);
    MemoryOptions o = mem;
    o.kv_cache_bytes = mid;
    m->configure_memory(o);
    if (m->could_ever_admit(Sequence(*m, request(0)).capacity(), true))
      hi = mid;
    else
      lo = mid + 1;
  }
  mem.kv_cache_bytes = 2 * lo;
  small->configure_memory(mem);
  Engine engine(*small);
  for (int i = 0; i < 5; ++i) engine.submit(request(i));
  size_t most_active = 0;
  while (!engine.idle()) {
    engine.step();
    most_active = std::max(most_active, engine.active());
  }
  EXPECT_EQ(most_active, 2u) << "the pool holds two sequences at a time";
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 5u);
  for (auto& [id, res] : done) expect_same(res, alone[id], "request " + std::to_string(id));
  EXPECT_TRUE(small->can_admit(Sequence(*small, request(0)).capacity(), true)) << "pages came back";

  Request huge = request(9);
  huge.params.max_tokens = 200;  // 12 + 200 + 4 positions: more than the pool of two 34-position sequences
  try {
    engine.submit(huge);
    FAIL() << "a request larger than the whole pool was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the whole pool holds"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--kv-cache-mb"), std::string::npos) << e.what();
  }
}

// Model::memory_bytes_for(N, capacity): a pool of that size admits N drafting sequences at once (with
// Qwen4-Exp's recurrent state beside the pages), and not one more when the pages are the bound.
TEST(EngineMemory, MemoryBytesForHoldsThatManySequencesAtOnce) {
  for (const std::string& dir : {fixture_dir("a_fp32"), testing::qwen4_exp_fixture_dir("a_fp32")}) {
    for (int64_t n : {1, 7, 64}) {
      auto m = load_model(dir, nullptr);
      MemoryOptions mem;
      mem.kv_cache_bytes = m->memory_bytes_for(n, 100, mem.page_tokens);
      m->configure_memory(mem);
      std::vector<std::unique_ptr<SequenceState>> live;
      std::vector<std::unique_ptr<DraftSession>> drafts;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(m->can_admit(100, true)) << dir << ": sequence " << i << " of " << n;
        live.push_back(m->new_sequence(100));
        drafts.push_back(m->new_draft_session(*live.back(), DraftOptions{}));
      }
      EXPECT_GT(m->kv_usage(), 0.0) << dir;
    }
  }
}

// A client that goes away (the server's disconnect): cancelling a running and a waiting request frees their
// pages at once, their results say "abort" with the tokens so far, and the others are untouched.
TEST(EngineCancel, CancelledRequestsFreeTheirPagesAndLeaveTheOthersExact) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  const ModelFacts& f = model->facts();
  auto request = [&](int i) {
    Request r;
    r.prompt = random_prompt(10 + i, f.vocab_size, 70 + i);
    r.params.max_tokens = 24;
    r.params.logprobs = 1;
    r.spec.num_speculative_tokens = 2;
    return r;
  };
  const GenerationResult alone0 = run_alone(*model, request(0)), alone2 = run_alone(*model, request(2));
  const int64_t capacity = Sequence(*model, request(0)).capacity();
  Engine engine(*model, EngineOptions{2});  // two at once: request 3 waits
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(engine.submit(request(i)));
  for (int s = 0; s < 3; ++s) engine.step();
  ASSERT_EQ(engine.active(), 2u);
  EXPECT_TRUE(engine.cancel(ids[1]));  // running
  EXPECT_TRUE(engine.cancel(ids[3]));  // waiting
  EXPECT_FALSE(engine.cancel(ids[3])) << "a request ends once";
  EXPECT_FALSE(engine.cancel(12345));
  EXPECT_EQ(engine.active(), 1u);
  EXPECT_EQ(engine.waiting(), 1u);
  auto cancelled = engine.take_finished();
  ASSERT_EQ(cancelled.size(), 2u);
  for (auto& [id, res] : cancelled) {
    EXPECT_EQ(res.finish_reason, "abort") << id;
    EXPECT_LT(res.ids.size(), 24u) << id;
  }
  EXPECT_EQ(cancelled[1].second.ids.size(), 0u) << "the waiting request never ran";
  engine.run();
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 2u);
  for (auto& [id, res] : done) expect_same(res, id == ids[0] ? alone0 : alone2, "request " + std::to_string(id));
  EXPECT_EQ(model->kv_usage(), 0.0) << "every page is back";
  EXPECT_TRUE(model->can_admit(capacity, true));
}

// A step's forward takes prompts up to max_prompt_rows_per_step rows, in arrival order (the first whatever
// its length); the rest prefill in later steps, and every request still comes out as it would alone.
TEST(EngineBatching, PromptsPastTheStepsRowBudgetWaitForTheNextStep) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  const ModelFacts& f = model->facts();
  const int64_t lengths[4] = {6, 6, 12, 3};
  std::vector<int64_t> first_token_step(4, -1);
  int64_t step = 0;
  auto request = [&](int i, bool watched) {
    Request r;
    r.prompt = random_prompt(lengths[i], f.vocab_size, 90 + i);
    r.params.max_tokens = 6;
    r.params.logprobs = 1;
    r.spec.num_speculative_tokens = 2;
    if (watched)
      r.on_token = [&first_token_step, &step, i](int32_t, const TokenLogprob*) {
        if (first_token_step[size_t(i)] < 0) first_token_step[size_t(i)] = step;
        return true;
      };
    return r;
  };
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 4; ++i) alone.push_back(run_alone(*model, request(i, false)));
  EngineOptions options;
  options.max_prompt_rows_per_step = 10;
  Engine engine(*model, options);
  for (int i = 0; i < 4; ++i) engine.submit(request(i, true));
  for (; !engine.idle(); ++step) engine.step();
  // step 0: prompt 0 (6 rows; 6 + 6 > 10); step 1: prompt 1 (12 more would pass 10); step 2: prompt 2
  // alone though longer than the budget, and prompt 3 waits behind it (arrival order); step 3: prompt 3
  EXPECT_EQ(first_token_step, (std::vector<int64_t>{0, 1, 2, 3}));
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 4u);
  for (auto& [id, res] : done) expect_same(res, alone[size_t(id)], "request " + std::to_string(id));
  EXPECT_THROW(Engine(*model, EngineOptions{4, 0}), Error);
}

// A token callback that says stop (the server's stop strings) ends the output at its token, also inside a
// round that accepted drafts past it: the tokens after it are taken back, from the result, its logprobs and its
// count, and the callback never sees them. Greedy and sampled, plain and speculative, alone and in a batch.
TEST(EngineCallbacks, ACallbackThatSaysStopEndsTheOutputAtItsToken) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  const ModelFacts& f = model->facts();
  auto request = [&](int i) {
    Request r;
    r.prompt = random_prompt(9, f.vocab_size, 70 + i);
    r.params.max_tokens = 16;
    r.params.logprobs = 1;
    if (i % 2 == 1) {
      r.params.temperature = 0.9f;
      r.params.seed = 5 + i;
    }
    r.spec.enabled = i >= 2;
    r.spec.num_speculative_tokens = 3;
    r.spec.tune_k = false;
    r.spec.broken_accept_all_for_tests = i >= 2;  // (every draft accepted: rounds emit 4 tokens past the stop)
    return r;
  };
  for (const bool batched : {false, true}) {
    Engine engine(*model);
    std::vector<std::vector<int32_t>> seen(4);
    std::vector<GenerationResult> free_runs;
    for (int i = 0; i < 4; ++i) {
      free_runs.push_back(run_alone(*model, request(i)));
      ASSERT_GE(free_runs.back().ids.size(), 8u);
      Request r = request(i);
      r.on_token = [&seen, i](int32_t t, const TokenLogprob* lp) {
        EXPECT_NE(lp, nullptr);
        seen[size_t(i)].push_back(t);
        return seen[size_t(i)].size() < size_t(5 + i);  // stop at token 5 + i
      };
      engine.submit(std::move(r));
      if (!batched) engine.run();
    }
    engine.run();
    auto done = engine.take_finished();
    ASSERT_EQ(done.size(), 4u);
    for (auto& [id, res] : done) {
      const size_t n = size_t(5 + id);
      const std::string what = (batched ? "batched request " : "request ") + std::to_string(id);
      EXPECT_EQ(res.finish_reason, "stop") << what << ": " << res.error;
      const std::vector<int32_t> want(free_runs[size_t(id)].ids.begin(), free_runs[size_t(id)].ids.begin() + n);
      EXPECT_EQ(res.ids, want) << what;
      EXPECT_EQ(seen[size_t(id)], want) << what << ": the callback saw nothing past its stop";
      EXPECT_EQ(res.logprobs.size(), n) << what;
      EXPECT_EQ(res.stats.num_generated, int64_t(n)) << what;
    }
  }
}

// Each batch size class the tuned requests ran in is reported with its bounds and the rounds it ran: 3 tuned
// greedy requests decode together in the 2-3 class, and as they finish, in smaller ones.
TEST(EngineTuner, ClassesSayWhichBatchSizesTheyHold) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  Engine engine(*model);
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.prompt = random_prompt(5, model->facts().vocab_size, 40 + i);
    r.params.max_tokens = 8;
    r.spec.num_speculative_tokens = 2;
    r.spec.tune_k = true;
    engine.submit(std::move(r));
  }
  while (!engine.idle()) engine.step();
  const auto classes = engine.tuner_classes();
  const auto holding = [&](int64_t n) {
    return std::find_if(classes.begin(), classes.end(), [n](const Engine::TunerClass& c) { return c.contains(n); });
  };
  const auto c3 = holding(3);
  ASSERT_NE(c3, classes.end());
  EXPECT_EQ(c3->min_sequences, 2);
  EXPECT_EQ(c3->max_sequences, 3);
  EXPECT_TRUE(c3->contains(2));
  EXPECT_FALSE(c3->contains(4));
  EXPECT_EQ(c3->seconds_per_token.size(), 3u);  // k = 0..2
  int64_t rounds = 0;
  for (int64_t r : c3->rounds) rounds += r;
  EXPECT_GT(rounds, 0);
}

// Requests sent together into an idle engine (a wave: equal requests that finished together are followed by
// the next ones at once) skip the MTP layers' pass over their prompts once the class they decode in has
// settled on plain decoding, as prompts arriving while the batch decodes plainly do; the output stays exact.
TEST(EngineTuner, AWaveOfPromptsSkipsItsMtpPrefillWhereItsClassSettledOnPlain) {
  ThreadPool pool(2);
  auto model = load_model(fixture_dir("a_fp32"), &pool);
  const ModelFacts& f = model->facts();
  ASSERT_GE(f.num_mtp_layers, 1);
  auto tuned = [&](uint64_t seed, int max_tokens) {
    Request r;
    r.prompt = random_prompt(6, f.vocab_size, seed);
    r.params.max_tokens = max_tokens;
    r.spec.num_speculative_tokens = 2;
    r.spec.tune_k = true;
    // (every drafting round costs ten plain tokens' time: plain decoding is the fastest k)
    r.spec.round_seconds_for_tests = [](int k, int emitted) { return k == 0 ? 1.0 * emitted : 10.0; };
    return r;
  };
  Engine engine(*model);
  std::map<int64_t, uint64_t> seed_of;
  auto run_wave = [&](uint64_t seed0, int max_tokens) {
    for (uint64_t seed = seed0; seed < seed0 + 3; ++seed) seed_of[engine.submit(tuned(seed, max_tokens))] = seed;
    while (!engine.idle()) engine.step();
    return engine.take_finished();
  };
  const auto first = run_wave(60, 64);
  ASSERT_EQ(first.size(), 3u);
  for (const auto& [id, res] : first) EXPECT_GE(res.stats.draft_forwards, 1) << "request " << id;  // (prefill)
  const auto classes = engine.tuner_classes();
  const auto c3 = std::find_if(classes.begin(), classes.end(), [](const auto& c) { return c.contains(3); });
  ASSERT_NE(c3, classes.end());
  ASSERT_EQ(c3->best_k, 0);
  const auto second = run_wave(70, 6);
  ASSERT_EQ(second.size(), 3u);
  for (const auto& [id, res] : second) {
    EXPECT_EQ(res.stats.draft_forwards, 0) << "request " << id;
    Request alone = tuned(seed_of.at(id), 6);
    alone.spec.enabled = false;
    EXPECT_EQ(res.ids, run_alone(*model, std::move(alone)).ids) << "request " << id;
  }
}

}  // namespace
}  // namespace nextn
