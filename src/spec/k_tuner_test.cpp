#include "spec/k_tuner.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "core/error.h"

namespace nextn {
namespace {

// Runs `rounds` rounds against a synthetic machine: a round at k emits a random 1..k+1 tokens and costs
// cost(k, round) seconds per emitted token.
std::vector<int64_t> drive(KTuner& t, int rounds, const std::function<double(int, int64_t)>& cost, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    const int k = t.next();
    const int emitted = 1 + static_cast<int>(rng() % (k + 1));
    t.record(k, cost(k, r) * emitted, emitted);
  }
  return t.rounds();
}

TEST(KTuner, ClimbsToTheFastestAndStaysThere) {
  KTuner t(4, 3, 32);
  std::mt19937 noise(1);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  const double per_token[] = {1.0, 0.8, 0.6, 0.7, 0.9};  // k = 2 is fastest
  const auto rounds = drive(t, 400, [&](int k, int64_t) { return per_token[k] * jitter(noise); }, 2);
  for (int k = 0; k <= 3; ++k) EXPECT_GE(rounds[k], 3) << "k " << k << " was never measured";
  // k = 3 is slower than k = 2: the climb looks at k = 4 once (its probe rounds) and stops; 4 is no
  // neighbour of 2, so it is never re-measured.
  EXPECT_EQ(rounds[4], 3);
  EXPECT_EQ(t.best(), 2);
  EXPECT_GT(rounds[2], 300);  // probes of the neighbours aside
}

// A dip at k = 2 (the bundled model: layer 1's catch-up for one extra draft) does not stop the climb.
TEST(KTuner, ClimbsPastADip) {
  KTuner t(4, 3, 32);
  const double per_token[] = {1.0, 0.8, 0.85, 0.6, 0.7};  // k = 3 is fastest, k = 2 worse than 1
  const auto rounds = drive(t, 300, [&](int k, int64_t) { return per_token[k]; }, 5);
  EXPECT_EQ(t.best(), 3);
  EXPECT_GT(rounds[3], 200);
}

TEST(KTuner, SpendsLittleOnDraftsThatAreNeverAccepted) {
  KTuner t(4, 3, 32);
  // Every draft rejected: a round at k emits one token and costs 1 + 0.4 k.
  for (int r = 0; r < 200; ++r) {
    const int k = t.next();
    t.record(k, 1.0 + 0.4 * k, 1);
  }
  EXPECT_EQ(t.best(), 0);
  EXPECT_EQ(t.rounds()[2] + t.rounds()[3] + t.rounds()[4], 0);
  // The climb's probe, then re-measures 32, 64, 128 rounds apart.
  EXPECT_LE(t.rounds()[1], 3 + 3 * 3);
}

TEST(KTuner, FollowsACostThatChangesWithTheContext) {
  KTuner t(3, 3, 16);
  // Speculation pays at first (k = 3 best), then the context grows and plain decoding becomes best.
  const auto cost = [](int k, int64_t r) {
    const double early[] = {1.0, 0.8, 0.7, 0.6}, late[] = {1.0, 1.1, 1.2, 1.3};
    return r < 200 ? early[k] : late[k];
  };
  int64_t round = 0;
  const auto by_round = [&](int k, int64_t) { return cost(k, round++); };
  drive(t, 200, by_round, 3);
  EXPECT_EQ(t.best(), 3);
  drive(t, 400, by_round, 4);
  EXPECT_EQ(t.best(), 0);
}

TEST(KTuner, IgnoresEmptyRoundsAndRejectsBadSettings) {
  KTuner t(2);
  const int k = t.next();
  t.record(k, 1.0, 0);  // nothing emitted: not a measurement
  EXPECT_EQ(t.rounds()[k], 0);
  EXPECT_EQ(t.seconds_per_token(k), 0.0);
  EXPECT_THROW(KTuner(-1), Error);
  EXPECT_THROW(KTuner(2, 0), Error);
  EXPECT_THROW(KTuner(2, 1, 0), Error);
}

}  // namespace
}  // namespace nextn
