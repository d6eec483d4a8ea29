#include "core/threadpool.h"

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"

namespace nextn {
namespace {

TEST(ThreadPool, EveryIndexCoveredExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 32, 100, 1000, 1001}) {
      for (int64_t grain : {1, 7, 16, 1000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        const int chunks = ThreadPool::chunk_count(n, grain, threads);
        std::vector<std::atomic<int64_t>> begins(static_cast<size_t>(std::max(chunks, 1)));
        std::vector<std::atomic<int64_t>> ends(static_cast<size_t>(std::max(chunks, 1)));
        std::atomic<int> calls{0};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int ti) {
          ASSERT_GE(ti, 0);
          ASSERT_LT(ti, chunks);
          begins[static_cast<size_t>(ti)] = b;
          ends[static_cast<size_t>(ti)] = e;
          calls++;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << "threads=" << threads << " n=" << n << " i=" << i;
        ASSERT_EQ(calls.load(), chunks) << "threads=" << threads << " n=" << n << " grain=" << grain;
        // The partition is the documented one: contiguous, in order, each chunk >= grain when split.
        for (int i = 0; i < chunks; ++i) {
          const auto [b, e] = ThreadPool::chunk_range(n, chunks, i);
          EXPECT_EQ(begins[static_cast<size_t>(i)].load(), b);
          EXPECT_EQ(ends[static_cast<size_t>(i)].load(), e);
          if (chunks > 1) {
            EXPECT_GE(e - b, grain);
          }
        }
        EXPECT_LE(chunks, threads);
      }
    }
  }
}

TEST(ThreadPool, FreeFunctionSerialFallback) {
  for (int64_t n : {1, 10, 1000}) {
    int calls = 0;
    parallel_for(nullptr, n, 16, [&](int64_t b, int64_t e, int ti) {
      ++calls;
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, n);
      EXPECT_EQ(ti, 0);
    });
    EXPECT_EQ(calls, 1);
  }
  ThreadPool one(1);
  int calls = 0;
  parallel_for(&one, 1000, 1, [&](int64_t, int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 1);
  ThreadPool three(3);
  calls = 0;
  parallel_for(&three, 20, 16, [&](int64_t, int64_t, int) { ++calls; });  // n too small to split
  EXPECT_EQ(calls, 1);
  std::atomic<int64_t> sum{0};
  parallel_for(&three, 1000, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  int none = 0;
  parallel_for(&three, 0, 1, [&](int64_t, int64_t, int) { ++none; });
  EXPECT_EQ(none, 0);
}

TEST(ThreadPool, PropagatesExceptions) {
  ThreadPool pool(4);
  // From a worker's chunk.
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t, int) {
                                   if (b > 0) throw std::runtime_error("worker failed");
                                 }),
               std::runtime_error);
  // From the caller's own chunk, with the message intact; the other chunks still ran.
  std::atomic<int> done{0};
  try {
    pool.parallel_for(100, 1, [&](int64_t, int64_t, int ti) {
      if (ti == 0) throw Error("caller failed");
      done++;
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "caller failed");
  }
  EXPECT_EQ(done.load(), 3);
  // Via the free function, and the pool stays usable afterwards.
  EXPECT_THROW(parallel_for(&pool, 100, 1, [](int64_t, int64_t, int) { throw std::logic_error("all"); }),
               std::logic_error);
  std::atomic<int64_t> count{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e, int) { count += e - b; });
  EXPECT_EQ(count.load(), 100);
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> count{0};
  pool.parallel_for(30, 1, [&](int64_t b, int64_t e, int) {
    pool.parallel_for(e - b, 1, [&](int64_t b2, int64_t e2, int) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 30);
}

// Publication and wake-up under stress: more threads than cores, jobs needing 2..8 of them (idle workers
// wake late into newer jobs), and pauses long enough for the workers to fall asleep between some calls.
TEST(ThreadPool, OversubscribedWithSleepsAndChangingWidths) {
  ThreadPool pool(8);
  std::vector<std::atomic<int64_t>> v(64);
  int64_t expect = 0;
  for (int it = 0; it < 4000; ++it) {
    if (it % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    const int64_t n = 2 + it % 63, grain = 1 + it % 9;
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    expect += n;
  }
  int64_t total = 0;
  for (auto& c : v) total += c.load();
  EXPECT_EQ(total, expect);
}

TEST(ThreadPool, ManyBackToBackCalls) {
  ThreadPool pool(3);
  std::vector<int64_t> v(48, 0);
  for (int it = 0; it < 3000; ++it) {
    const int64_t n = 1 + it % 48;
    pool.parallel_for(n, 1 + it % 5, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)]++;
    });
  }
  int64_t total = 0;
  for (int64_t c : v) total += c;
  int64_t expect = 0;
  for (int it = 0; it < 3000; ++it) expect += 1 + it % 48;
  EXPECT_EQ(total, expect);
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

// A system that refuses threads part-way (a process or memory limit below the count asked for): the
// constructor joins the workers it started and throws, instead of hanging in the destruction of members
// the started workers still wait on. Run in a child process under an address-space limit that leaves
// room for a few thread stacks only; the alarm turns a hang into a failure.
void construct_pool_under_memory_limit(int threads) {
  alarm(30);
  pthread_attr_t attr;
  size_t stack = 0;
  pthread_attr_init(&attr);
  pthread_attr_getstacksize(&attr, &stack);
  pthread_attr_destroy(&attr);
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t now = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
  const rlim_t limit = now + 3 * (stack + (1 << 16)) + (4 << 20);  // three stacks and some heap
  const rlimit rl{limit, limit};
  if (now == 0 || setrlimit(RLIMIT_AS, &rl) != 0) {
    std::fprintf(stderr, "cannot set the address-space limit\n");
    std::_Exit(2);
  }
  try {
    ThreadPool pool(threads);
    std::fprintf(stderr, "all %d threads started\n", pool.size());
    std::_Exit(0);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(3);
  }
}

TEST(ThreadPoolDeathTest, ThreadsRefusedPartWayIsAnErrorNotAHang) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(construct_pool_under_memory_limit(64), ::testing::ExitedWithCode(3),
              "only [0-9]+ of 64 threads start.*--threads");
}

}  // namespace
// The split threshold grows with the thread count (hand-offs cost more with more threads): 32K work per
// doubling, and a set value sticks.
TEST(ThreadPool, SplitThresholdPerDoublingOfThreads) {
  if (std::getenv("NEXTN_MIN_PARALLEL_WORK")) GTEST_SKIP() << "NEXTN_MIN_PARALLEL_WORK overrides the default";
  const std::pair<int, int64_t> cases[] = {{1, 32 << 10}, {2, 32 << 10}, {3, 64 << 10}, {4, 64 << 10}, {16, 128 << 10}};
  for (const auto& [threads, want] : cases) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.min_parallel_work(), want) << threads << " threads";
  }
  ThreadPool pool(2);
  pool.set_min_parallel_work(0);
  EXPECT_EQ(pool.min_parallel_work(), 0);
}

}  // namespace nextn

namespace nextn {
namespace {

TEST(UsableCpus, ReadsCgroupQuotas) {
  EXPECT_EQ(cpus_from_cgroup_quota("200000 100000"), 2);
  EXPECT_EQ(cpus_from_cgroup_quota("150000 100000"), 2);  // 1.5 CPUs: two threads, one of them part-time
  EXPECT_EQ(cpus_from_cgroup_quota("50000 100000"), 1);
  EXPECT_EQ(cpus_from_cgroup_quota("max 100000"), 0);
  EXPECT_EQ(cpus_from_cgroup_quota("-1 100000"), 0);  // (cgroup v1: no quota)
  EXPECT_EQ(cpus_from_cgroup_quota(""), 0);
  EXPECT_EQ(cpus_from_cgroup_quota("12x 100000"), 0);
  EXPECT_EQ(cpus_from_cgroup_quota("100000 0"), 0);
}

// A process pinned to one CPU (taskset, a cpuset) gets a one-thread pool by default, not one per host CPU.
TEST(UsableCpus, FollowsTheAffinityMask) {
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  EXPECT_LE(usable_cpus(), CPU_COUNT(&before));
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int pinned = usable_cpus();
  const int pool = ThreadPool().size();
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(pinned, 1);
  EXPECT_EQ(pool, 1);
}

}  // namespace
}  // namespace nextn
