// ShmGroup's collectives, with its ranks as threads of this process (each attached to the segment on its own, as
// a process would): the same answers as LocalGroup's in chunks of the slot's size, disagreements and aborts that
// release every rank, and a rank that never comes found by the liveness check instead of a hang.
#include "core/shm_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "core/error.h"

namespace nextn {
namespace {

// Runs fn(comm) on every rank of a new group of `ranks` (slots of `slot_bytes`), rank 0 on this thread; returns
// each rank's exception (null: none).
std::vector<std::exception_ptr> run_ranks(int ranks, int64_t slot_bytes, const std::function<void(Communicator&)>& fn) {
  auto g0 = ShmGroup::create(ranks, slot_bytes);
  std::vector<std::unique_ptr<ShmGroup>> others;
  for (int r = 1; r < ranks; ++r) others.push_back(ShmGroup::attach(g0->name(), r));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  auto body = [&](ShmGroup& g, int r) {
    try {
      fn(g.comm());
    } catch (...) {
      errors[size_t(r)] = std::current_exception();
      g.comm().abort();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < ranks; ++r) threads.emplace_back(body, std::ref(*others[size_t(r - 1)]), r);
  body(*g0, 0);
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(ShmGroup, CollectivesGiveLocalGroupsAnswersInChunksOfAnySize) {
  for (int64_t slot : {64, 4096}) {  // (64 bytes: every message below goes in many chunks)
    const auto errors = run_ranks(3, slot, [](Communicator& c) {
      std::vector<int32_t> mine(250), all(750);
      for (int i = 0; i < 250; ++i) mine[size_t(i)] = c.rank() * 1000 + i;
      c.all_gather(mine.data(), 1000, all.data());
      for (int q = 0; q < 3; ++q)
        for (int i = 0; i < 250; ++i) ASSERT_EQ(all[size_t(q * 250 + i)], q * 1000 + i);
      std::vector<char> text(300, char('a' + c.rank()));
      c.broadcast(text.data(), 300, 2);
      for (char ch : text) ASSERT_EQ(ch, 'c');
      // rank-order sums, the same bits on every rank
      float x[2] = {c.rank() == 0 ? 1e8f : 1.0f, float(c.rank())};
      std::vector<float> scratch;
      all_reduce_sum(c, x, 2, scratch);
      EXPECT_EQ(x[0], (1e8f + 1.0f) + 1.0f);
      EXPECT_EQ(x[1], 3.0f);
      c.all_gather(nullptr, 0, nullptr);  // (a zero-byte round)
      c.barrier();
    });
    for (const auto& e : errors) EXPECT_FALSE(e) << "slot " << slot;
  }
}

TEST(ShmGroup, RanksThatDisagreeOrAbortReleaseEveryRank) {
  auto errors = run_ranks(3, 64, [](Communicator& c) {
    std::vector<char> in(size_t(c.rank() == 1 ? 9 : 8)), out(64);
    c.all_gather(in.data(), int64_t(in.size()), out.data());
  });
  for (const auto& e : errors) EXPECT_TRUE(e);
  errors = run_ranks(2, 64, [](Communicator& c) {
    if (c.rank() == 1) throw Error("rank 1 gives up");  // (run_ranks aborts for it)
    c.barrier();
  });
  EXPECT_TRUE(errors[0]);
  EXPECT_TRUE(errors[1]);
}

TEST(ShmGroup, ARankThatNeverComesIsFoundByLivenessInsteadOfAHang) {
  auto g0 = ShmGroup::create(2, 64);
  auto g1 = ShmGroup::attach(g0->name(), 1);  // attached, then silent: as a process killed with SIGKILL
  std::atomic<int> checks{0};
  g0->set_liveness([&] { return ++checks < 3; });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(g0->comm().barrier(), Error);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(checks.load(), 3);
  EXPECT_LT(waited, 5.0);
  EXPECT_THROW(g1->comm().barrier(), Error);  // (the group stays poisoned)
  EXPECT_EQ(g0->first_failed(), -1);           // (nobody failed on its own)
}

TEST(ShmGroup, RefusesBadRankCountsAndForeignSegments) {
  EXPECT_THROW(ShmGroup::create(1), Error);
  EXPECT_THROW(ShmGroup::create(65), Error);
  auto g = ShmGroup::create(2, 64);
  EXPECT_THROW(ShmGroup::attach(g->name(), 2), Error);
  EXPECT_THROW(ShmGroup::attach(g->name(), 0), Error);
  EXPECT_THROW(ShmGroup::attach("/nextn-no-such-group", 1), Error);
}

}  // namespace
}  // namespace nextn
