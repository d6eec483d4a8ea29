#include "core/threadpool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nextn {
namespace {

TEST(ThreadPool, ChunksCoverTheRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 5, 16, 1000}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    pool.parallel_for(n, 2, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "n " << n << " i " << i;
  }
}

TEST(ThreadPool, RethrowsAChunksException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t, int) {
                                   if (b > 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  int64_t covered = 0;  // the pool still works afterwards
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e, int i) {
    if (i == 0) covered += e - b;
  });
  EXPECT_GT(covered, 0);
}

// While the worker sleeps, products are kept on the caller until their work adds up to kWakeWork; one at
// least that large wakes it at once.
TEST(ThreadPool, WakesASleepingWorkerOnlyOnceTheKeptWorkPaysForIt) {
  ThreadPool pool(2);
  pool.parallel_for(2, 1, [](int64_t, int64_t, int) {});
  // The worker falls asleep after spinning ~200 us with nothing to do; worth_waking(0) turns false then.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pool.worth_waking(0)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the idle worker never went to sleep";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int64_t W = ThreadPool::kWakeWork;
  EXPECT_FALSE(pool.worth_waking(W / 2));
  EXPECT_FALSE(pool.worth_waking(W / 4));
  EXPECT_TRUE(pool.worth_waking(W / 4));  // the kept work reaches kWakeWork
  EXPECT_FALSE(pool.worth_waking(W / 2));  // (the account starts again)
  EXPECT_TRUE(pool.worth_waking(W));       // a large product alone
}

}  // namespace
}  // namespace nextn
