#include "engine/k_tuner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace nextn {

namespace {
constexpr double kDecay = 0.8;  // round times, per round measured at that k: the last ~5 rounds dominate
// Acceptance, per draft tried at that position: the last ~50 tries. (With ~20, a run of rejections at
// a position accepted 60% of the time made k = 1 look slower than plain decoding often enough that the
// tuner sat at k = 0 for hundreds of rounds, drafting nothing that could correct it: 5.8% regret at 2000
// tokens in the "hard text" scenario of k_tuner_sim.h, 2.4% with 50.)
constexpr double kAcceptDecay = 0.98;
constexpr double kPriorTries = 2.0;
// Position 1 starts from this acceptance, as KTuner::kFirstPriorTries tries that age like the rounds' own
// (after ~50 real tries it has faded to a few percent): the first rounds' two or three drafts alone said 0% or
// 100%, and an unlucky start at 0 sent the climb back to plain decoding, where no draft is tried. (MTP heads'
// first drafts are accepted 60-90% of the time on their own model's text; k_tuner_sim.h's "drafts rarely
// accepted" scenario, at 20%, pays 0.2% for it at 128 tokens.)
constexpr double kFirstPrior = 0.65;
// A round time more than this factor above k's average so far counts as that far: on a shared machine one
// step in a few runs 2x slow (another tenant, an interrupt), and a 3-round probe must not let one such step
// decide between k (the average still follows a real slow-down, by this factor per round). A faster round
// counts as it is: nothing makes a step spuriously fast, and a re-measure must follow a k that got
// faster at once (plain decoding after its cold start).
constexpr double kOutlierFactor = 1.3;
// Once k has 3 or more of its last kRecentRounds raw round times, a round counts as at most kStallFactor
// times their median instead: a 2-vCPU VM stalls one round in six or seven to ~2x whatever its k, and each
// stall, at 1.3x of the average, still moved k's estimate by up to 6% and the rounds' spread (the noise
// margin) by as much, enough to hide the 15-20% a k > 0 gains there (k_tuner_sim.h's "2 vCPUs with
// stalls": regret 6.0% over 2000 tokens with the average's clamp alone, 4.5% with the median's). A median
// of the last five follows a real change of k's time after three of its rounds.
constexpr double kStallFactor = 1.1;
// Plain decoding keeps near-ties: speculation costs a little that no round's time shows (the MTP layers'
// catch-up over each new prompt's last positions, the verify rows of the steps that carry arriving
// prompts, which are not timed), and a 3-round probe cannot tell a 2% difference on a shared machine; so a
// k > 0 is best only when it beats k = 0 by this much (with 2%, the server kept k = 1 at 8-64 clients
// where it was 2-7% slower).
constexpr double kPlainMargin = 0.05;
// And by more than the measurements can tell apart: kNoiseZ standard errors of the difference between the
// two estimates, from the rounds' relative spread (shared by every k: it is the machine's, ~50 steps of
// memory, starting from kPriorNoise worth kPriorNoiseWeight steps) over each estimate's weight in steps. A
// 2-vCPU server's steps spread by 25-40% (its HTTP threads take the cores at random), and with the fixed
// 5% alone the tuner ran k = 1 for 70% of the rounds at 32 clients where it was no faster, losing 8%; a
// quiet machine's 2-5% spread leaves the fixed margin in charge. (The first climb's steps up take the
// noise term alone.)
constexpr double kNoiseZ = 1.0;
constexpr double kNoiseDecay = 0.98;
constexpr double kPriorNoise = 0.05;
constexpr double kPriorNoiseWeight = 2.0;
// The probe budget (see k_tuner.h): the share of each round's time it earns, the debt at which a probe
// stops, and the most it banks, both in plain tokens' time.
constexpr double kProbeAllowance = 0.005;
constexpr double kDebtTokens = 1.0;
constexpr double kBudgetCapTokens = 32.0;
// Arrivals are sporadic (one every few steps at 64 sequences): their cost per token is averaged over the last
// ~50 steps at k > 0 that had any.
constexpr double kArrivalDecay = 0.98;
// A re-measure of a k that has not run since its last probe starts its time average afresh but for this
// much of one observation (enough to keep the outlier clamp's anchor, 1% of a 3-round average): with the old average at full weight,
// a 3-round re-measure kept half of what came before, so plain decoding's cold-start rounds (its first
// steps run while the batch fills, 1.5-2x slower) decided between k for hundreds of steps.
constexpr double kStaleWeight = 0.05;
constexpr double kDriftDeadband = 0.03;  // see KTuner::drift
// What probing may cost a generation of known length (set_horizon): this share of the tokens it may still
// emit (P13 holds tuned decoding to >= 0.97x plain decoding, cold start included), and the least room a probe
// needs to start (its first round, with a catch-up of deferred positions, costs about this much where its
// drafts are never accepted: docs/performance.md, forty-third session).
constexpr double kHorizonShare = 0.02;
constexpr double kHorizonMinTokens = 0.5;
}

KTuner::KTuner(int k_max, int probe_rounds, int reprobe_interval, double first_prior_tries)
    : k_max_(k_max),
      probe_rounds_(probe_rounds),
      reprobe_interval_(reprobe_interval),
      interval_(reprobe_interval),
      horizon_(std::numeric_limits<double>::infinity()) {
  if (k_max < 0 || probe_rounds < 1 || reprobe_interval < 1 || !(first_prior_tries >= 0))
    throw Error("KTuner: needs k_max >= 0, probe_rounds >= 1, reprobe_interval >= 1, first_prior_tries >= 0");
  seconds_.assign(k_max + 1, 0.0);
  weight_.assign(k_max + 1, 0.0);
  accepted_.assign(k_max, 0.0);
  tried_.assign(k_max, 0.0);
  rounds_.assign(k_max + 1, 0);
  recent_.assign(size_t(k_max) + 1, Recent{});
  plain_at_.assign(k_max + 1, 0.0);
  set_aside_.assign(size_t(k_max) + 1, 0);
  if (k_max > 0) {  // the prior of position 1: tries that age like the rounds' own
    accepted_[0] = kFirstPrior * first_prior_tries;
    tried_[0] = first_prior_tries;
  }
}

double KTuner::expected_tokens(int k) const {
  double tokens = 1.0, reach = 1.0, rate = 1.0;  // (an untried position counts as accepted)
  for (int i = 1; i <= k; ++i) {
    // Position i > 1 is tried only when every draft before it was accepted, so early on a rate rests on
    // a try or two: it starts from the rate before it (rates fall with the position), worth kPriorTries
    // tries, instead of being taken as 0 or 1 from one draw (and then never measured again).
    const double prior = i == 1 ? 0.0 : kPriorTries;
    if (tried_[i - 1] + prior > 0) rate = (accepted_[i - 1] + prior * rate) / (tried_[i - 1] + prior);
    reach *= rate;
    tokens += reach;
  }
  return tokens;
}

double KTuner::seconds_per_token(int k) const {
  if (k < 0 || k > k_max_ || weight_[k] <= 0) return 0.0;
  const double arrivals = k > 0 && arrival_tokens_ > 0 ? arrival_seconds_ / arrival_tokens_ : 0.0;
  return seconds_[k] / weight_[k] * drift(k) / expected_tokens(k) + arrivals;
}

// A k > 0 was last measured when plain rounds took plain_at_[k]; rounds of every k slow down together as the
// contexts grow (the indexer reads every key), so once plain rounds are slower its time is carried forward at
// the ratio it had to plain decoding then. (Compared as they were, a k = 1 probed early looked 6-17% cheaper
// than it ran later in a generation at 64 GPU sequences.) Not when plain rounds got faster: that is mostly
// their cold start ending (the first plain rounds run 1.5-2x slow), which says nothing of a k measured warm;
// nor within kDriftDeadband, where a jittery plain average alone would tilt every k > 0 (with none, the
// simulation's hard text, whose k = 1 wins by 15%, lost up to 1.3 more points of regret).
double KTuner::drift(int k) const {
  if (k == 0 || plain_at_[k] <= 0 || weight_[0] <= 0) return 1.0;
  return std::max(1.0, seconds_[0] / weight_[0] / plain_at_[k] - kDriftDeadband);
}

void KTuner::record_arrival_overhead(double seconds, double tokens) {
  if (!(seconds >= 0) || !(tokens > 0)) return;
  arrival_seconds_ = arrival_seconds_ * kArrivalDecay + seconds;
  arrival_tokens_ = arrival_tokens_ * kArrivalDecay + tokens;
}

double KTuner::noise() const {
  return std::sqrt((noise_sq_ + kPriorNoise * kPriorNoise * kPriorNoiseWeight) / (noise_weight_ + kPriorNoiseWeight));
}

double KTuner::noise_margin(int k, int j) const {
  return kNoiseZ * noise() * std::sqrt(1.0 / std::max(weight_[k], 1.0) + 1.0 / std::max(weight_[j], 1.0));
}

double KTuner::plain_margin(int k) const { return std::max(kPlainMargin, noise_margin(k, 0)); }

int KTuner::best() const {
  int b = -1;
  for (int k = 1; k <= k_max_; ++k)
    if (weight_[k] > 0 && !set_aside_[k] && (b < 0 || seconds_per_token(k) < seconds_per_token(b))) b = k;
  if (weight_[0] > 0 && (b < 0 || seconds_per_token(b) > (1.0 - plain_margin(b)) * seconds_per_token(0))) b = 0;
  if (b < 0 && std::any_of(set_aside_.begin(), set_aside_.end(), [](char c) { return c != 0; })) b = 0;
  return b < 0 ? k_max_ : b;
}

double KTuner::plain_seconds_per_token() const {
  if (weight_[0] <= 0) return 0.0;
  double s = seconds_[0] / weight_[0];
  if (rescale_k_ > 0) {  // seeded: k = 0's time is the neighbour's until its best k's is re-measured here
    if (weight_[rescale_k_] <= 0 || rescale_from_ <= 0) return 0.0;
    s *= seconds_[rescale_k_] / weight_[rescale_k_] / rescale_from_;
  }
  return s;
}

double KTuner::budget_tokens() const {
  const double b = plain_seconds_per_token();
  return b > 0 ? budget_ / b : 0.0;
}

bool KTuner::may_probe(int k) const {
  return k == 0 || (!hopeless(k) && (budget_ >= 0 || plain_seconds_per_token() <= 0) && horizon_allows());
}

bool KTuner::horizon_allows() const {
  if (!std::isfinite(horizon_)) return true;
  const double b = plain_seconds_per_token();
  const double banked = b > 0 ? budget_ / b : 0.0;
  return banked + kHorizonShare * horizon_ >= kHorizonMinTokens;
}

// A probe of k > 0 under a horizon ends, and k is set aside, once the budget is below the probe's floor. (Its
// estimate is not trusted then: one or two rounds leave position 1's acceptance near its prior, by which a k
// whose drafts all failed still looked faster than plain decoding.) No look ahead at the next round: a round
// that lost by a rejection says little of the next, and stopping on it cost the good texts of
// k_tuner_sim.h 2-5% at 32 tokens.
void KTuner::check_probe_floor() {
  if (probe_left_ <= 0 || probe_k_ <= 0 || budget_ >= probe_floor_) return;
  set_aside_[size_t(probe_k_)] = 1;
  end_probe();
}

double KTuner::round_cost_floor(int k) const {
  if (k < 1 || k > k_max_ || weight_[k] <= 0 || weight_[0] <= 0 || rescale_k_ >= 0 || plain_probe_after_rescale_)
    return 0.0;
  const double plain = seconds_[0] / weight_[0];  // (the arrivals' share left out: a lower bound)
  return seconds_[k] / weight_[k] * drift(k) / plain * (1.0 - noise_margin(k, 0));
}

// (With plain decoding best, k = 1 is the only k a climb or a re-measure goes to next.)
bool KTuner::needs_times() const { return probing() || best() > 0 || (k_max_ > 0 && !hopeless(1)); }

void KTuner::set_round_cost_floor(const std::vector<double>& floor) {
  cost_floor_.assign(floor.begin(), floor.begin() + std::min<std::ptrdiff_t>(floor.size(), k_max_ + 1));
}

// (A round at k also costs at least what a round at any smaller k costs: it drafts and verifies more.)
bool KTuner::hopeless(int k) const {
  double floor = 0;
  for (int j = 1; j <= std::min<int>(k, int(cost_floor_.size()) - 1); ++j) floor = std::max(floor, cost_floor_[j]);
  return k > 0 && floor >= (1.0 - kPlainMargin) * expected_tokens(k);
}

void KTuner::charge(int k, double seconds, int emitted, double weight) {
  const double b = plain_seconds_per_token();
  if (b <= 0) return;
  double gain = k > 0 ? b * emitted - seconds : 0.0;
  // A seeded class's plain time is its neighbour's, rescaled by how its best k changed, until it is measured
  // here; the ratio of that k to plain decoding changes with the batch (at 32 CPU sequences a k = 2 round
  // costs twice a plain one, at 16 far less), so the estimate can be far off: rated at 2.8x the plain time
  // measured next, a k = 2 re-measure banked 6 plain tokens of gains that the 32-sequence class then spent
  // on five k = 1 probes that lost. Gains wait for a plain time of this class; losses count at once.
  if (rescale_k_ > 0 || plain_probe_after_rescale_) gain = std::min(gain, 0.0);
  budget_ += weight * (kProbeAllowance * seconds + gain);
  budget_ = std::min(budget_, kBudgetCapTokens * b);
}

KTuner KTuner::seeded_from(const KTuner& other) {
  KTuner t = other;
  const int b = other.best();
  t.recent_.assign(t.recent_.size(), Recent{});  // (the neighbour's raw times: another batch's)
  t.rescale_k_ = b;
  t.rescale_from_ = other.weight_[b] > 0 ? other.seconds_[b] / other.weight_[b] : 0.0;
  t.seconds_[b] = t.weight_[b] = 0;
  // The other k's times are the neighbour's, rescaled: estimates, worth one observation each, so that
  // this class's own measurements replace them at once (carried at the neighbour's weight, a k = 0 time
  // rescaled by k = 1's change kept k = 1 for hundreds of steps at 32 sequences where it lost 10%).
  for (int j = 0; j <= t.k_max_; ++j)
    if (t.weight_[j] > 1.0) {
      t.seconds_[j] /= t.weight_[j];
      t.weight_[j] = 1.0;
    }
  t.plain_after_rescale_ = b != 0;
  t.climbed_ = true;
  t.start_probe(b);
  t.best_before_probe_ = -1;
  t.since_probe_ = 0;
  t.interval_ = t.reprobe_interval_;
  t.budget_ = 0;  // (the neighbour's was in its own batch's time per round)
  return t;
}

int KTuner::next() {
  if (probe_left_ > 0) return probe_k_;
  // First climb from k = 0 while a larger k beats every smaller one, looking one step past a k that does
  // not (time per token can dip: with two MTP layers, k = 2 pays for layer 1's catch-up with a single
  // extra draft, and k = 3 is faster again); where drafts are rarely accepted, k = 1 is already slower
  // than plain decoding and the climb stops there, never measuring the costly large k (they remain
  // reachable later as neighbours of the best).
  if (!climbed_) {
    int top = -1;
    while (top < k_max_ && rounds_[top + 1] > 0) ++top;
    auto improves = [&](int k) {  // k >= 1 measured faster than every smaller k, by more than the noise
      if (k < 1 || set_aside_[size_t(k)]) return false;
      for (int j = 0; j < k; ++j)
        if (seconds_per_token(k) >= (1.0 - noise_margin(k, j)) * seconds_per_token(j)) return false;
      return true;
    };
    // Plain decoding was measured first, in the generation's coldest rounds (caches and pages still warming up:
    // on the bundled Qwen4-Exp model 20% slower than later), so k = 1's time is compared with a fresh one
    // before the climb goes on; plain rounds cost nothing against plain decoding.
    if (top == 1 && !plain_rechecked_) {
      plain_rechecked_ = true;
      start_probe(0);
      return 0;
    }
    if (top < 0 || (top < k_max_ && (top == 0 || improves(top) || improves(top - 1)))) {
      if (!may_probe(top + 1)) return best();  // the climb goes on once the budget allows
      start_probe(top + 1);
      return probe_k_;
    }
    climbed_ = true;
  }
  const int b = best();
  if (++since_probe_ >= interval_) {
    // Re-measures cycle over the best's neighbours and, once the best is 2 or more, plain decoding itself:
    // every other choice is judged against k = 0's time, which must not go stale while the context and the
    // batch change (it is no neighbour then).
    const int turn = (reprobe_turn_ + 1) % (b >= 2 ? 3 : 2);
    int n = turn == 2 ? 0 : turn == 1 ? b + 1 : b - 1;
    if (n < 0 || n > k_max_) n = turn == 1 ? b - 1 : b + 1;
    if (n >= 0 && n <= k_max_ && !may_probe(n)) {
      since_probe_ = interval_;  // due: it runs once the budget allows
      return b;
    }
    since_probe_ = 0;
    reprobe_turn_ = turn;
    if (n >= 0 && n <= k_max_) {
      start_probe(n);
      best_before_probe_ = b;
      return n;
    }
  }
  return b;
}

bool KTuner::valid_round(int k, double seconds, int emitted, double weight) const {
  return k >= 0 && k <= k_max_ && emitted > 0 && seconds >= 0 && weight > 0 && weight <= 1;
}

void KTuner::record(int k, double seconds, int emitted, bool drafts_judged, double weight) {
  if (!valid_round(k, seconds, emitted, weight)) return;
  if (k > 0 && weight_[0] > 0) {  // (the k's average so far, carried to today's plain time first)
    seconds_[k] *= drift(k);
    plain_at_[k] = seconds_[0] / weight_[0];
  }
  const double spent = seconds;  // (the budget pays the whole round, an outlier too; the median keeps it raw)
  const double decay = std::pow(kDecay, weight);
  if (weight_[k] > 0) {
    const double mean = seconds_[k] / weight_[k];
    const double typical = recent_median(k);
    seconds = std::min(seconds, typical > 0 ? typical * kStallFactor : mean * kOutlierFactor);
    const double noise_decay = std::pow(kNoiseDecay, weight);
    const double deviation = seconds / mean - 1.0;
    noise_sq_ = noise_sq_ * noise_decay + weight * deviation * deviation;
    noise_weight_ = noise_weight_ * noise_decay + weight;
  }
  seconds_[k] = seconds_[k] * decay + weight * seconds;
  weight_[k] = weight_[k] * decay + weight;
  learn_acceptance(k, emitted, drafts_judged, weight);
  ++rounds_[k];
  remember_round(k, spent, weight);
  charge(k, spent, emitted, weight);
  if (probe_left_ <= 0 || k != probe_k_) return;
  check_probe_floor();
  if (probe_left_ <= 0) return;
  probe_left_ -= weight;
  // The probe's one-off steps (record_one_off) are spent whatever follows: only what its measured rounds
  // lose may stop it (stopped after a one-off step, a probe leaves a k judged by one step's drafts).
  const double b = plain_seconds_per_token();
  const bool in_debt = k > 0 && b > 0 && budget_ + probe_overhead_ < -kDebtTokens * b;
  // (a remainder left by rounding 1/n weights counts as done)
  if (probe_left_ <= 1e-6 || in_debt) end_probe();
}

// emitted - 1 drafts were accepted: positions up to there were, the next (if drafted) was not.
void KTuner::learn_acceptance(int k, int emitted, bool drafts_judged, double weight) {
  if (!drafts_judged) return;
  const double accept_decay = std::pow(kAcceptDecay, weight);
  const int accepted = std::min(k, emitted - 1);
  for (int i = 1; i <= std::min(k, accepted + 1); ++i) {
    tried_[i - 1] = tried_[i - 1] * accept_decay + weight;
    accepted_[i - 1] = accepted_[i - 1] * accept_decay + (i <= accepted ? weight : 0.0);
  }
}

void KTuner::record_one_off(int k, double seconds, int emitted, bool drafts_judged, double weight, bool warm_up) {
  if (!valid_round(k, seconds, emitted, weight)) return;
  learn_acceptance(k, emitted, drafts_judged, weight);  // (its time is no measure, its drafts are)
  ++rounds_[k];
  const double before = budget_;
  charge(k, seconds, emitted, weight);
  if (probe_left_ <= 0 || k != probe_k_) return;
  probe_overhead_ += before - budget_;
  if (warm_up)
    probe_floor_ -= before - budget_;
  else
    check_probe_floor();
}

// (A batch's step records its n rounds at weight 1/n with one time: the time is kept once per step.)
void KTuner::remember_round(int k, double seconds, double weight) {
  Recent& r = recent_[size_t(k)];
  r.pending += weight;
  if (r.pending < 1.0 - 1e-6) return;
  r.pending = 0;
  r.seconds[size_t(r.next)] = seconds;
  r.next = (r.next + 1) % kRecentRounds;
  r.count = std::min(r.count + 1, kRecentRounds);
}

double KTuner::recent_median(int k) const {
  const Recent& r = recent_[size_t(k)];
  if (r.count < 3) return 0.0;
  std::array<double, kRecentRounds> v = r.seconds;
  std::nth_element(v.begin(), v.begin() + r.count / 2, v.begin() + r.count);
  return v[size_t(r.count / 2)];
}

void KTuner::start_probe(int k) {
  probe_k_ = k;
  probe_left_ = probe_rounds_;
  set_aside_[size_t(k)] = 0;
  const double b = plain_seconds_per_token();
  // (gains banked before it are its to spend: the floor is below no budget, not below this one)
  probe_floor_ = k > 0 && std::isfinite(horizon_) && b > 0 ? -kHorizonShare * horizon_ * b
                                                           : -std::numeric_limits<double>::infinity();
  if (weight_[k] > kStaleWeight) {
    seconds_[k] *= kStaleWeight / weight_[k];
    weight_[k] = kStaleWeight;
  }
}

void KTuner::end_probe() {
  const int k = probe_k_;
  probe_left_ = 0;
  probe_overhead_ = 0;
  if (k == rescale_k_) {
    const double now = seconds_[k] / weight_[k];
    if (rescale_from_ > 0)
      for (int j = 0; j <= k_max_; ++j) {
        if (j != k) seconds_[j] *= now / rescale_from_;
        plain_at_[j] *= now / rescale_from_;  // (k's own too: its rounds were compared with the old plain)
      }
    rescale_k_ = -1;
    if (plain_after_rescale_) {  // then k = 0 itself, which every other k is judged against
      plain_after_rescale_ = false;
      plain_probe_after_rescale_ = true;
      start_probe(0);
      return;
    }
  }
  if (k == 0 && plain_probe_after_rescale_) {
    // The k > 0 were last measured against the neighbour's plain time rescaled, not against this class's:
    // they are carried forward from the plain time measured now (anchored to the estimate, a k = 1
    // re-measured at 1.08x plain decoding was not carried as plain rounds slowed down 15% with the
    // contexts, looked faster than them, and ran for 45 steps at 32 CPU sequences where it lost 15%).
    plain_probe_after_rescale_ = false;
    for (int j = 1; j <= k_max_; ++j)
      if (plain_at_[j] > 0) plain_at_[j] = seconds_[0] / weight_[0];
  }
  if (best_before_probe_ >= 0) {
    // A re-measure that changed nothing: wait twice as long for the next (up to 8x); else back to 1x. Not
    // while plain decoding is best: its rounds try no draft, so only these probes can show that drafting
    // pays again (the probe budget, not the interval, keeps them cheap where it does not).
    interval_ = best() == best_before_probe_ && best_before_probe_ != 0 ? std::min(2 * interval_, 8 * reprobe_interval_)
                                                                       : reprobe_interval_;
    best_before_probe_ = -1;
  }
}

}  // namespace nextn
