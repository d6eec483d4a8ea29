// The decode hot path does not touch the heap: after a warm-up, target steps (1 row and k+1 rows), MTP
// draft steps and the lm_head allocate nothing, on one thread or several. Counted by replacing the global
// operator new for this test program (every other test runs through it too; it only counts).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "core/threadpool.h"
#include "models/hy_v4/model.h"
#include "models/qwen4_exp/model.h"
#include "models/registry.h"
#include "engine/generator.h"
#include "test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_news{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's buffer uses one): left to the runtime, they would allocate with
// its allocator (under AddressSanitizer, its own operator new) while the delete above frees with free().
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return operator new(n, a);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept { return operator new(n, a, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace nextn {
namespace {

const std::string kBundled = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";

// Heap allocations made by fn.
template <class F>
int64_t news_during(const F& fn) {
  g_news.store(0);
  g_counting.store(true);
  fn();
  g_counting.store(false);
  return g_news.load();
}

void check_steps_do_not_allocate(const std::string& dir, int threads, int64_t min_parallel_work) {
  ThreadPool pool(threads);
  HYV4Model m(dir, &pool);
  m.cpu_tuning().min_parallel_work = min_parallel_work;
  const auto& c = m.config();
  const int64_t V = c.vocab_size, H = c.hidden_size;
  const int64_t n = 3 * c.index_topk / 2 + 5;  // past index_topk: the sparse path runs
  std::vector<int32_t> prompt(n);
  for (int64_t i = 0; i < n; ++i) prompt[i] = int32_t(3 + (i * 7919) % (V - 3));
  const int64_t cap = n + 64;
  KVCache cache = m.new_cache(cap);
  KVCache dcache = m.new_draft_cache(cap);
  std::vector<float> logits(8 * V), hidden(std::max<int64_t>(n, 8) * H), dh(n * H);
  m.forward(prompt.data(), n, cache, logits.data(), hidden.data(), false);
  m.draft_forward(0, prompt.data() + 1, hidden.data(), n - 1, 0, dcache, nullptr, dh.data());
  int32_t toks[8];
  for (int i = 0; i < 8; ++i) toks[i] = int32_t(3 + (i * 31 + 5) % (V - 3));
  auto round = [&](int rows) {  // a verify step of `rows` rows, rolled back, then draft work
    m.forward(toks, rows, cache, logits.data(), hidden.data(), true);
    cache.truncate(n);
    m.draft_forward(0, toks, hidden.data(), 1, n - 1, dcache, nullptr, dh.data());
    m.lm_head(dh.data(), 1, logits.data());
    dcache.truncate(n - 1);
  };
  for (int rows : {1, 2, 4, 8}) round(rows);  // warm-up: workspaces and per-thread buffers reach size
  for (int rows : {1, 4, 8, 2}) EXPECT_EQ(news_during([&] { round(rows); }), 0) << dir << " rows " << rows;
}

TEST(DecodeHotPath, BundledModelStepsDoNotAllocate) {
  check_steps_do_not_allocate(kBundled, 1, int64_t(1) << 20);
  check_steps_do_not_allocate(kBundled, 2, int64_t(1) << 20);
  check_steps_do_not_allocate(kBundled, 3, 0);  // every threaded path of the model
}

// A whole speculative generation: allocations do not grow with the number of tokens (only the result
// vectors grow, geometrically), greedy with tuned k and sampling with fixed k.
TEST(DecodeHotPath, GenerationAllocationsDoNotGrowWithLength) {
  ThreadPool pool(2);
  HYV4Model m(kBundled, &pool);
  const std::vector<int32_t> prompt = {1, 29, 87, 130, 42, 7, 300, 19, 64, 5};
  for (bool sample : {false, true}) {
    auto news_for = [&](int tokens) {
      SamplingParams sp;
      sp.max_tokens = tokens;
      if (sample) {
        sp.temperature = 0.8f;
        sp.top_p = 0.9f;
        sp.seed = 3;
      }
      SpecOptions so;
      so.num_speculative_tokens = 3;
      so.tune_k = !sample;
      Generator gen(m);
      return news_during([&] { gen.generate(prompt, sp, so); });
    };
    // (48 tokens: long enough that the tuner probes speculation, as it does not in a generation of 16)
    news_for(48);  // warm-up
    const int64_t short_run = news_for(48), long_run = news_for(400);
    EXPECT_LE(long_run - short_run, 24) << (sample ? "sampling" : "greedy") << ": " << short_run << " allocations for "
                                        << "48 tokens, " << long_run << " for 400";
  }
}

TEST(DecodeHotPath, FixtureStepsDoNotAllocate) {
  for (const char* f : {"a_fp32", "b_fp32", "c_bf16"}) check_steps_do_not_allocate(testing::fixture_dir(f), 3, 0);
}

// Tensor parallel: rank 0's command, every rank's forward and their collectives allocate nothing once warm
// (the rank threads count too: operator new is the process's).
TEST(DecodeHotPath, TensorParallelStepsDoNotAllocate) {
  ThreadPool pool(2);
  const auto m = load_model(testing::fixture_dir("a_fp32"), &pool, 3);
  const int64_t V = m->facts().vocab_size, H = m->facts().hidden_width;
  const int64_t n = 3 * m->facts().sparse_budget / 2 + 5;
  std::vector<int32_t> prompt(n);
  for (int64_t i = 0; i < n; ++i) prompt[i] = int32_t(3 + (i * 7919) % (V - 3));
  auto seq = m->new_sequence(n + 16);
  std::vector<float> logits(8 * V), hidden(std::max<int64_t>(n, 8) * H);
  const BatchSegment pre{seq.get(), prompt.data(), n, false};
  m->forward(&pre, 1, logits.data(), hidden.data());
  int32_t toks[8], argmax[8];
  for (int i = 0; i < 8; ++i) toks[i] = int32_t(3 + (i * 31 + 5) % (V - 3));
  auto round = [&](int rows) {
    const BatchSegment seg{seq.get(), toks, rows, true, rows % 2 ? argmax : nullptr};
    m->forward(&seg, 1, logits.data(), hidden.data());
    seq->rollback(n);
  };
  for (int rows : {1, 2, 4, 8}) round(rows);
  for (int rows : {1, 4, 8, 2}) EXPECT_EQ(news_during([&] { round(rows); }), 0) << "rows " << rows;
}

// Qwen4-Exp through the Model interface: verify steps of 1..8 rows rolled back by state slot, MTP draft rows
// and the draft head allocate nothing once warm, on several threads.
TEST(DecodeHotPath, Qwen4ExpStepsDoNotAllocate) {
  for (const char* f : {"a_fp32", "b_fp32"}) {
    const std::string dir = testing::qwen4_exp_fixture_dir(f);
    ThreadPool pool(3);
    Qwen4ExpModel m(dir, &pool);
    const int64_t V = m.facts().vocab_size, CH = m.facts().hidden_width;
    const int64_t n = 3 * m.config().indexer_budget + 5;  // past the QSA budget: blocks are dropped
    std::vector<int32_t> prompt(n);
    for (int64_t i = 0; i < n; ++i) prompt[i] = int32_t(3 + (i * 7919) % (V - 3));
    auto seq = m.new_sequence(n + 64);
    KVCache dcache = m.new_shared_draft_cache(n + 64);
    std::vector<float> logits(8 * V), hidden(std::max<int64_t>(n, 8) * CH), dh(n * CH);
    const BatchSegment pre{seq.get(), prompt.data(), n, false};
    m.forward(&pre, 1, logits.data(), hidden.data());
    m.draft_forward(0, prompt.data() + 1, hidden.data(), n - 1, 0, dcache, nullptr, dh.data());
    int32_t toks[8];
    for (int i = 0; i < 8; ++i) toks[i] = int32_t(3 + (i * 31 + 5) % (V - 3));
    std::vector<int32_t> selection;
    auto round = [&](int rows) {
      const BatchSegment seg{seq.get(), toks, rows, true};
      m.forward(&seg, 1, logits.data(), hidden.data());
      seq->rollback(n);
      m.draft_forward(0, toks, hidden.data(), 1, n - 1, dcache, nullptr, dh.data(), nullptr, &selection);
      m.draft_logits_rows(dh.data(), 1, logits.data(), nullptr, 0);
      dcache.truncate(n - 1);
    };
    for (int rows : {1, 2, 4, 8}) round(rows);
    for (int rows : {1, 4, 8, 2}) EXPECT_EQ(news_during([&] { round(rows); }), 0) << dir << " rows " << rows;
  }
}

}  // namespace
}  // namespace nextn
