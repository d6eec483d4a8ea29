// Picks the number of draft tokens k for each round of greedy speculative decoding from measured speed.
//
// Greedy output does not depend on k (every round emits the target's own tokens), so k is free to follow
// whatever is fastest on this machine, model and context: speculation pays only when a (k+1)-row verify plus k
// draft steps costs less than the tokens it yields, which varies with the hardware (bandwidth- versus
// compute-bound), the context length and the text. Each candidate k in 0..k_max (0 = plain decoding) is tried
// for a few rounds, climbing from k = 0 while a larger k is faster (looking one step past the first k that is
// not; k = 0 re-measured once after k = 1, its first rounds being the coldest), then the k with the lowest
// time per emitted token runs (plain decoding keeps near-ties: a k > 0 must beat it by 5% and by more than the
// rounds' measured spread can explain; a climb steps up only on such a gain), and a neighbour of it (or, when
// the best is 2 or more, k = 0 every third time)
// is re-measured every `reprobe_interval` rounds (twice as long after each re-measure that changed nothing, up
// to 8x, unless plain decoding is the best: its rounds try no draft, so only re-measures can show that
// drafting pays again) so that the choice follows the context as it grows; a re-measure all but replaces its
// k's old time, which is stale by then (meanwhile it is carried at the ratio it had to plain decoding, once
// plain rounds have slowed down with the contexts). Time per token at k is estimated as (seconds per round
// at k) / (tokens a round at k yields), two things measured apart: a round's time barely varies, but its tokens swing from 1
// to k+1. So the tokens come from the acceptance rate of each draft position given the ones before it, pooled
// over every round that drafted that far (whatever its k: position i's draft does not depend on how many
// follow it), instead of from the few rounds run at k itself (position 1 from a prior of 65%, worth 4 tries,
// so that the first rejections do not send the climb back to plain decoding). Both are decaying averages, so
// that they follow the text; a round time far above its k's last few rounds' median counts as 1.1x of it (1.3x
// of k's average until three are known): one stalled step must neither decide a probe nor inflate the rounds'
// spread that margins are made of. Probes are paid from a budget measured against plain decoding, so that a
// short generation that has not finished probing never pays more than a few percent for them: each round adds
// 0.5% of its time, and a round at k > 0 adds what it gained on plain decoding (the time its tokens take at k
// = 0's measured rate, minus its own time, one-off catch-ups included; negative when it lost). A probe of a k
// > 0 starts only while the budget is not negative, and stops early once its rounds put it a plain token's
// time in debt (its own catch-up, spent whatever follows, does not stop it). Gains bank up to kBudgetCapTokens
// plain tokens (k_tuner.cpp), so a long-lived server's tuner cannot spend hours of old gains on probes that
// lose.
//
// A generation's length bounds what its probes may cost (set_horizon: the tokens its sequences may still
// emit): a probe of k > 0 starts only while kHorizonShare of that horizon, plus the budget, leaves room for
// half a plain token, and stops (k then set aside until it is probed again) once what it has cost, one-offs
// included, passes that: a 32-token generation whose drafts are never accepted pays ~2% for learning it,
// where a probe's catch-up and three rounds cost it 4%, and one of 16 tokens probes nothing.
//
// Classes of larger batches know less and probe at a higher price (a catch-up step at 32 CPU sequences costs
// 1.6 plain ones), but a round at k costs relatively more the larger the batch: its k + 1 verify rows and
// draft steps share fewer weight reads with the other sequences' rows. So what a smaller batch measured
// bounds a larger one's cost from below (round_cost_floor), and a k that cannot beat plain decoding even at
// that cost, given this class's own acceptance, is not probed (set_round_cost_floor): at 32 server clients
// the re-measures of k = 1 that the 8-15 sequence class already found losing cost 0.4-1.7% of the run.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace nextn {

class KTuner {
 public:
  // first_prior_tries: how many tries the prior acceptance of draft position 1 (k_tuner.cpp) is worth;
  // 0 takes the rates from the rounds alone (tests of the pooling arithmetic).
  static constexpr double kFirstPriorTries = 4.0;
  explicit KTuner(int k_max, int probe_rounds = 3, int reprobe_interval = 32,
                  double first_prior_tries = kFirstPriorTries);

  // A tuner for a new batch size class, started from a neighbouring class's (`other`): its acceptance rates
  // and its times, instead of a climb from k = 0 whose probes a burst of requests would pay for. It first
  // re-measures other's best k, and scales the other k's times by how that one's changed (a round's time
  // per sequence moves with the batch, but the ratios between the k move slowly), then measures plain
  // decoding itself: until then no gain is banked (the rescaled plain time can be far off), and from then
  // the k > 0 are carried forward from that measured plain time.
  static KTuner seeded_from(const KTuner& other);

  // The most tokens the generations decoding now may still emit (see above); +inf (the default): unbounded,
  // as a server's class whose requests come and go.
  void set_horizon(double tokens) { horizon_ = tokens > 0 ? tokens : 0.0; }
  int next();                                   // k for the coming round
  bool probing() const { return probe_left_ > 0; }  // the coming round (re)measures a k
  // Plain decoding is what the coming rounds run: no probe under way, k = 0 the best, and the first climb
  // over or waiting for a probe of k = 1 the budget does not allow (a later re-measure may still draft).
  bool settled_on_plain() const { return !probing() && best() == 0 && (climbed_ || k_max_ == 0 || !may_probe(1)); }
  // What the round at k cost and yielded. drafts_judged: false when the round stopped early (end of
  // output) or drafted fewer than k, so that its tokens say nothing about the acceptance of the positions.
  // weight: the round's share of one observation. A batch of n sequences records n rounds per step at
  // weight 1/n: they share the step's one measured time, so the averages' memory and the probes' length
  // are counted in steps, whatever the batch (at weight 1, a batch of 64 would forget everything but the
  // last step, and a probe would last a single step).
  void record(int k, double seconds, int emitted, bool drafts_judged = true, double weight = 1.0);
  // What speculation costs a batch outside its rounds' times: the MTP layers' pass over each prompt that
  // arrives while k > 0 runs (the engine defers it while plain decoding runs). seconds: this step's, for
  // arrivals that may generate `tokens` tokens in all; each arrival's pass is paid for by its own tokens, so
  // a decaying average of seconds per token is added to every k > 0's time per token (no round's time shows
  // that cost, which only speculation pays). (Spread over the step's own rounds, a burst of prompts that
  // arrived while one sequence decoded made k > 0 look 4.5x slower than plain decoding in the 1-sequence
  // class of a server, for good: those prompts decode in larger batches, and the class saw few steps after.)
  void record_arrival_overhead(double seconds, double tokens);
  // A round of a step that did one-off work (a GPU backend's first run of a shape, its graph recording, a
  // catch-up of positions deferred by plain rounds): its time is no measure of k, but what it cost is paid
  // from the probe budget (it does not stop a probe in debt, but counts against a horizon's share, see
  // above); its drafts count as any.
  // warm_up: the step ran a backend's first run of a shape (a GPU graph recorded), which the process pays
  // once whatever k comes next: a probe's horizon limit leaves it out (a catch-up of deferred positions counts).
  void record_one_off(int k, double seconds, int emitted, bool drafts_judged = true, double weight = 1.0,
                      bool warm_up = false);
  int best() const;  // the k with the lowest time per token so far (k = 0 keeps near-ties)
  int k_max() const { return k_max_; }
  double seconds_per_token(int k) const;        // 0 when k was never measured
  const std::vector<int64_t>& rounds() const { return rounds_; }  // rounds run at each k
  // The probe budget in plain tokens' time (see above); 0 until k = 0 was measured.
  double budget_tokens() const;
  double noise() const;  // the rounds' relative spread (standard deviation / mean) of late
  // A lower bound on a round's time at k in plain rounds' time (1 + what drafting and verifying k add),
  // from this class's own measurements: the measured ratio less its noise margin; 0 when k or this class's
  // own plain time is not measured.
  double round_cost_floor(int k) const;
  // What a larger batch's round at k costs at least (from smaller classes' round_cost_floor; 0: unknown),
  // per k in 0..k_max. A k > 0 whose floor leaves it no chance to beat plain decoding by the margin with
  // this class's expected tokens is not probed, neither by the climb nor by re-measures.
  void set_round_cost_floor(const std::vector<double>& floor);
  bool hopeless(int k) const;  // see set_round_cost_floor
  // Whether its rounds' times can still change a choice: not while plain decoding is best, nothing is probed
  // and k = 1 is hopeless (then the engine need not run a step's arriving prompts apart to time its rounds).
  bool needs_times() const;

 private:
  int k_max_, probe_rounds_, reprobe_interval_;
  double expected_tokens(int k) const;  // 1 + Σ_j Π_{i<=j} accept rate of position i, j <= k
  double plain_seconds_per_token() const;  // k = 0's, scaled as a pending rescale will (0: not measured)
  bool may_probe(int k) const;  // the budget allows starting a probe of k
  double noise_margin(int k, int j) const;  // the share by which k's and j's times may differ by chance
  double plain_margin(int k) const;  // how much faster than plain decoding k must look to be best
  bool valid_round(int k, double seconds, int emitted, double weight) const;  // (NaN seconds: not valid)
  void start_probe(int k);  // (re)measure k next: its old time average kept at a fraction of a round
  void end_probe();
  void charge(int k, double seconds, int emitted, double weight);  // the round's part of the budget
  void learn_acceptance(int k, int emitted, bool drafts_judged, double weight);
  // The last kRecentRounds raw times of each k's rounds (a batch's: its steps), whose median anchors the clamp
  // of a stalled round (k_tuner.cpp).
  static constexpr int kRecentRounds = 5;
  struct Recent {
    std::array<double, kRecentRounds> seconds{};
    int count = 0, next = 0;
    double pending = 0;  // the weight of the current step's rounds so far
  };
  void remember_round(int k, double seconds, double weight);
  double recent_median(int k) const;  // 0 until 3 times are kept
  std::vector<Recent> recent_;
  std::vector<double> seconds_, weight_;  // decaying sums per k: round seconds, rounds
  std::vector<double> plain_at_;          // per k > 0: plain's mean round time when it was last measured
  double drift(int k) const;              // how much slower plain rounds are than at plain_at_[k] (>= 1)
  std::vector<double> accepted_, tried_;  // decaying sums per draft position i (index i - 1)
  std::vector<int64_t> rounds_;
  int interval_;                       // rounds between re-measures: doubles while they change nothing
  int probe_k_ = -1;                   // a k being (re)measured,
  double probe_left_ = 0;              // and its rounds (weights) to go
  int best_before_probe_ = -1;         // the best k when the current re-measure began
  bool climbed_ = false;               // the first climb from k = 0 is over
  bool plain_rechecked_ = false;       // the climb re-measured k = 0 after k = 1
  int64_t since_probe_ = 0;
  int reprobe_turn_ = 0;     // which re-measure is next: the neighbour below (0), above (1), or k = 0 (2)
  int rescale_k_ = -1;       // seeded: the k re-measured first, and its time per round before
  double rescale_from_ = 0;
  bool plain_after_rescale_ = false;  // seeded: measure k = 0 right after the re-measure of the best,
  bool plain_probe_after_rescale_ = false;  // and that measure is running (see end_probe)
  std::vector<double> cost_floor_;  // see set_round_cost_floor (empty: none)
  double budget_ = 0;        // seconds (per round, as the round times), see the header comment
  double arrival_seconds_ = 0, arrival_tokens_ = 0;  // decaying sums, see record_arrival_overhead
  double probe_overhead_ = 0;  // the current probe's one-off catch-ups (they do not stop it)
  double noise_sq_ = 0, noise_weight_ = 0;  // decaying sums: squared relative deviations, rounds (see noise())
  double horizon_;             // see set_horizon
  double probe_floor_ = 0;     // the budget a probe of k > 0 may not go below (seconds; -inf: no horizon)
  std::vector<char> set_aside_;  // per k: its probe stopped at the horizon's limit; not best until re-probed
  bool horizon_allows() const;       // (may_probe's part)
  void check_probe_floor();          // ends the probe, k set aside, once the budget is below probe_floor_
};

}  // namespace nextn
