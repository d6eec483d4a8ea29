#include "core/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace nextn {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(LocalGroup, AllGatherPutsEachRanksBytesInRankOrder) {
  for (int n : {1, 2, 3, 4}) {
    LocalGroup group(n);
    std::vector<std::vector<int32_t>> got(static_cast<size_t>(n));
    group.run([&](Communicator& c) {
      const int32_t mine[3] = {c.rank() * 10, c.rank() * 10 + 1, c.rank() * 10 + 2};
      std::vector<int32_t> all(size_t(3 * c.size()));
      c.all_gather(mine, sizeof mine, all.data());
      got[size_t(c.rank())] = all;
    });
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (int i = 0; i < 3; ++i) EXPECT_EQ(got[size_t(r)][size_t(3 * q + i)], q * 10 + i) << n << " ranks";
  }
}

// Rank r holds partials whose sum depends on the order they are added in: every rank must get the rank-order
// sum, bit for bit the same.
TEST(LocalGroup, AllReduceSumAddsInRankOrderOnEveryRank) {
  const float part[4] = {1e8f, 1.0f, -1e8f, 3.5f};
  const float expected = ((part[0] + part[1]) + part[2]) + part[3];
  ASSERT_NE(bits(expected), bits(part[0] + (part[1] + (part[2] + part[3]))));  // (the order shows)
  LocalGroup group(4);
  std::vector<float> got(4);
  group.run([&](Communicator& c) {
    std::vector<float> scratch;
    float v[2] = {part[c.rank()], float(c.rank())};
    all_reduce_sum(c, v, 2, scratch);
    got[size_t(c.rank())] = v[0];
    EXPECT_EQ(v[1], 6.0f);
  });
  for (float g : got) EXPECT_EQ(bits(g), bits(expected));
}

// A row reduced alone and with other rows beside it (a decode step, a verify of several rows) gets the same bits.
TEST(LocalGroup, AReducedRowDoesNotDependOnTheRowsBesideIt) {
  LocalGroup group(3);
  group.run([&](Communicator& c) {
    std::vector<float> scratch;
    std::vector<float> alone(64), batch(5 * 64);
    for (int i = 0; i < 64; ++i) alone[size_t(i)] = 0.1f * float(i + 1) * float(c.rank() * 7 + 1) - 3.0f;
    for (int row = 0; row < 5; ++row)
      for (int i = 0; i < 64; ++i)
        batch[size_t(row * 64 + i)] = row == 2 ? alone[size_t(i)] : float(row * 100 + i) * float(c.rank() + 1);
    all_reduce_sum(c, alone.data(), 64, scratch);
    all_reduce_sum(c, batch.data(), 5 * 64, scratch);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(bits(batch[size_t(2 * 64 + i)]), bits(alone[size_t(i)])) << i;
  });
}

TEST(LocalGroup, BroadcastGivesEveryRankTheRootsBytes) {
  LocalGroup group(3);
  group.run([&](Communicator& c) {
    int64_t plan[2] = {c.rank() == 1 ? 42 : -1, c.rank() == 1 ? 7 : -1};
    c.broadcast(plan, sizeof plan, 1);
    EXPECT_EQ(plan[0], 42);
    EXPECT_EQ(plan[1], 7);
  });
}

// Vocabulary-parallel greedy: the largest logit over the ranks' shards, ties to the lower token id.
TEST(LocalGroup, GlobalArgmaxTakesTheLargestValueTiesToTheLowerId) {
  LocalGroup group(4);
  group.run([&](Communicator& c) {
    const RankBest mine[4] = {{2.0f, 10}, {5.0f, 1300}, {5.0f, 2100}, {-1.0f, 3001}};
    const RankBest best = global_argmax(c, mine[c.rank()]);
    EXPECT_EQ(best.value, 5.0f);
    EXPECT_EQ(best.id, 1300);
  });
}

TEST(LocalGroup, GlobalArgmaxRowsAnswersEveryRowInOneGatherAndMinusOneForANonFiniteRow) {
  LocalGroup group(3);
  group.run([&](Communicator& c) {
    // best[row][rank]. Row 0: rank 1's wins; row 1: a tie of ranks 0 and 2 goes to the lower id (rank 2's);
    // row 2: rank 2's part holds a NaN, so the row's answer is -1 whatever the others found.
    const RankBest best[3][3] = {{{1.0f, 3}, {5.0f, 9}, {2.0f, 12}},
                                 {{4.0f, 4}, {3.0f, 8}, {4.0f, 1}},
                                 {{-2.0f, 7}, {4.0f, 18}, {0.0f, -1}}};
    std::vector<RankBest> row_best(3);
    for (int i = 0; i < 3; ++i) row_best[size_t(i)] = best[i][c.rank()];
    std::vector<RankBest> scratch;
    int32_t out[3] = {99, 99, 99};
    global_argmax_rows(c, row_best.data(), 3, out, scratch);
    EXPECT_EQ(out[0], 9);
    EXPECT_EQ(out[1], 1);
    EXPECT_EQ(out[2], -1);
  });
}

TEST(LocalGroup, RanksThatDisagreeOnASizeAllFailInsteadOfHanging) {
  LocalGroup group(3);
  int errors = 0;
  std::mutex mu;
  EXPECT_THROW(group.run([&](Communicator& c) {
    std::vector<float> in(size_t(c.rank() == 2 ? 5 : 4)), out(32);
    try {
      c.all_gather(in.data(), int64_t(in.size() * sizeof(float)), out.data());
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
      const std::lock_guard<std::mutex> lock(mu);
      ++errors;
      throw;
    }
  }), Error);
  EXPECT_EQ(errors, 3);
}

// A rank that fails releases the ranks waiting for it in a collective; run rethrows the failing rank's error.
TEST(LocalGroup, AFailingRankReleasesTheOthersAndItsErrorComesBack) {
  LocalGroup group(4);
  try {
    group.run([&](Communicator& c) {
      if (c.rank() == 2) throw std::runtime_error("rank 2 is out of memory");
      c.barrier();
    });
    FAIL() << "run returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 2 is out of memory");
  }
  // The group works again afterwards.
  int sum = 0;
  std::mutex mu;
  group.run([&](Communicator& c) {
    c.barrier();
    const std::lock_guard<std::mutex> lock(mu);
    sum += c.rank();
  });
  EXPECT_EQ(sum, 6);
}

TEST(LocalGroup, RefusesAbsurdRankCountsAndBadRoots) {
  EXPECT_THROW(LocalGroup(0), Error);
  EXPECT_THROW(LocalGroup(100000), Error);
  LocalGroup group(2);
  EXPECT_THROW(group.run([](Communicator& c) {
    int v = 0;
    c.broadcast(&v, sizeof v, 2);
  }), Error);
}

}  // namespace
}  // namespace nextn
