// A GPU backend's prepared forwards (Model::prepare_forwards), checked the same way for each family: forwards
// prepared before the first request (every padded row count of a batch of 8 sequences at k = 2, the target's
// forward and each MTP layer's three kinds) leave the batch's steps no one-off work (no shape's first run, no
// recording), also after a burst of prompts longer than any step (their forward runs in buffers of its own),
// and their graphs give the bits of a model that recorded its shapes as they came.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "models/common/forward_graphs.h"
#include "models/model.h"

namespace nextn::testing {

// `prepared` and `lazy`: the same checkpoint, loaded and on the GPU, without sequences or memory settings.
inline void check_prepared_forwards(Model& prepared, Model& lazy) {
  const ModelFacts& f = prepared.facts();
  const int k = f.num_mtp_layers > 0 ? 2 : 0;
  constexpr int kSequences = 8, kTokens = 12, kBurst = 20;
  constexpr int64_t kPositions = 32;  // (prompts of 1-2 tokens + 12 + k + 2; the burst's 15 + 12 + 2)
  for (Model* m : {&prepared, &lazy}) {
    MemoryOptions memory;
    memory.kv_cache_bytes = m->memory_bytes_for(kBurst + kSequences, kPositions, memory.page_tokens);
    m->configure_memory(memory);
  }
  const int64_t rows = kSequences * forward_rows_per_sequence(k);
  EXPECT_EQ(prepared.prepare_forwards(rows, kPositions),
            int64_t(padded_row_counts(rows).size()) * (1 + 3 * f.num_mtp_layers));
  auto prompt = [&](int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = int32_t(3 + rng() % uint64_t(f.vocab_size - 3));
    return p;
  };
  auto run = [&](Model& m) {
    Engine engine(m, EngineOptions{kSequences});
    for (int i = 0; i < kSequences; ++i) {
      Request r;
      r.prompt = prompt(1 + i % 2, 700 + i);  // (the prefill's 12 rows are a prepared shape)
      r.params.max_tokens = kTokens;
      r.spec.enabled = k > 0;
      r.spec.num_speculative_tokens = std::max(k, 1);
      engine.submit(std::move(r));
    }
    const uint64_t before = m.one_off_forwards();
    engine.run();
    auto done = engine.take_finished();
    std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return std::make_pair(std::move(done), m.one_off_forwards() - before);
  };
  const auto [got, one_offs] = run(prepared);
  EXPECT_EQ(one_offs, 0u) << "every forward of the batch replayed a prepared graph";
  {  // a burst of 20 prompts of 15 tokens: a 300-row prefill, then plain decode steps of 20 rows
    Engine burst(prepared, EngineOptions{kBurst});
    for (int i = 0; i < kBurst; ++i) {
      Request r;
      r.prompt = prompt(15, 800 + i);
      r.params.max_tokens = kTokens;
      r.spec.enabled = false;
      burst.submit(std::move(r));
    }
    burst.run();
    ASSERT_EQ(burst.take_finished().size(), size_t(kBurst));
  }
  const auto [again, one_offs_again] = run(prepared);
  EXPECT_EQ(one_offs_again, 0u) << "the burst's long prefill left the steps' graphs in place";
  const auto [want, lazy_one_offs] = run(lazy);
  EXPECT_GT(lazy_one_offs, 0u) << "(without preparing, the batch's first forwards run eagerly)";
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(again.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(int(got[i].second.ids.size()), kTokens) << "request " << i << ": " << got[i].second.error;
    EXPECT_EQ(got[i].second.ids, want[i].second.ids) << "request " << i;
    EXPECT_EQ(again[i].second.ids, want[i].second.ids) << "request " << i << " after the burst";
    EXPECT_EQ(got[i].second.stats.num_accepted_tokens, want[i].second.stats.num_accepted_tokens) << "request " << i;
  }
}

}  // namespace nextn::testing
