#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"
#include "core/profile.h"
#include "core/threadpool.h"

namespace nextn {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The engine's own host work between forwards (NEXTN_PROFILE=1): starting and ending draft rounds, and each
// sequence's use of its rows (sampling, acceptance, streaming), which grows with the sequences of a step.
const profile::Section kDraftBookkeeping = profile::section("engine: draft rounds");
const profile::Section kRowsBookkeeping = profile::section("engine: rows' results");

}  // namespace

Engine::Engine(Model& model, EngineOptions options) : model_(model), options_(options) {
  if (options_.max_sequences < 1) throw Error("engine: max_sequences must be >= 1");
  if (options_.max_prompt_rows_per_step < 1) throw Error("engine: max_prompt_rows_per_step must be >= 1");
}

Engine::~Engine() = default;

int64_t Engine::submit(Request request) {
  auto seq = std::make_unique<Sequence>(model_, std::move(request));
  if (!seq->finished() && !model_.could_ever_admit(seq->capacity(), seq->drafting()))
    throw Error("the request needs " + std::to_string(seq->capacity()) + " positions of KV cache (prompt " +
                std::to_string(seq->prompt_tokens()) + " + max_tokens + draft rows), more than the whole pool holds (" +
                model_.memory_summary() + "): raise --kv-cache-mb or lower max_tokens");
  const int64_t id = next_id_++;
  waiting_.push_back({id, std::move(seq)});
  return id;
}

// First come, first served: a request that does not fit yet waits (and so do the ones behind it, so that a
// long request is not starved by short ones).
void Engine::admit() {
  while (!waiting_.empty() && active_.size() < size_t(options_.max_sequences)) {
    Entry& e = waiting_.front();
    if (!e.seq->finished()) {
      if (!model_.can_admit(e.seq->capacity(), e.seq->drafting())) break;
      try {
        e.seq->admit(model_.new_sequence(e.seq->capacity()));
      } catch (const Error& err) {
        e.seq->fail(err.what());
      }
    }
    active_.push_back(std::move(e));
    waiting_.pop_front();
  }
}

void Engine::retire_finished() {
  for (auto it = active_.begin(); it != active_.end();) {
    if (it->seq->finished()) {
      it->seq->release_memory();  // pages back to the pool before the next admission
      finished_.emplace_back(it->id, it->seq->take_result());
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::step() {
  admit();
  retire_finished();  // (requests with nothing to generate, and those that failed to admit)
  if (active_.empty()) return;
  ++steps_;
  const auto t0 = Clock::now();
  int64_t tuned_decoding = 0, tuned_prompts = 0, horizon = 0;
  for (const Entry& e : active_) {
    if (!e.seq->tuned()) continue;
    const bool decoding = e.seq->phase() == Sequence::Phase::kDecoding;
    tuned_decoding += decoding;
    tuned_prompts += e.seq->phase() == Sequence::Phase::kPrefill;
    if (decoding) horizon = std::max(horizon, e.seq->tokens_left());
  }
  KTuner* tuner = tuned_decoding > 0 ? &tuner_for(tuned_decoding) : nullptr;
  // (a server's long-lived classes see the horizon of the requests decoding now: what their probes may cost)
  if (tuner) tuner->set_horizon(double(horizon));
  const int k_batch = tuner ? tuner->next() : 0;
  // While plain decoding is what the tuner chose, arriving tuned prompts skip their MTP prefill (a forward
  // of its own per arrival, which plain rounds never use; caught up over the deferral window if the
  // sequence drafts later). While k > 0 runs, the arrivals' MTP prefill is charged to k > 0. Prompts that
  // arrive with nothing tuned decoding (a wave of requests sent together, as equal requests that finished
  // together are followed) skip it when the class they will decode in has settled on plain decoding: at
  // 32 server clients every wave paid the MTP layers over its 32 prompts that plain rounds then never used.
  const KTuner* arrivals_class =
      tuned_decoding == 0 && tuned_prompts > 0 ? existing_tuner_for(tuned_prompts) : nullptr;
  plain_now_ = tuner ? k_batch == 0 && !tuner->probing() : arrivals_class && arrivals_class->settled_on_plain();
  arrival_draft_seconds_ = arrival_draft_tokens_ = 0;
  const uint64_t one_offs = model_.one_off_forwards();

  draft_all(k_batch);
  // Gather every sequence's rows: decoding rounds first, then prompts (up to the step's prompt rows).
  segments_.clear();
  members_.clear();
  was_round_.clear();
  int64_t prompt_rows = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (Entry& e : active_) {
      Sequence& s = *e.seq;
      const bool decoding = s.phase() == Sequence::Phase::kDecoding;
      if (decoding != (pass == 0) || s.finished()) continue;
      if (!decoding) {
        const int64_t rows = s.prompt_tokens();
        if (prompt_rows > 0 && prompt_rows + rows > options_.max_prompt_rows_per_step) break;  // (the next step's)
        prompt_rows += rows;
      }
      try {
        segments_.push_back(decoding ? s.verify_segment() : s.prefill_segment());
        members_.push_back(&s);
        was_round_.push_back(decoding);
      } catch (const Error& err) {
        s.fail(err.what());
      }
    }
  }
  const size_t rounds = size_t(std::count(was_round_.begin(), was_round_.end(), char(1)));
  // One forward for the whole batch. Prompts that share it make its time no measure of the rounds, so a
  // tuned step with prompts is timed only when the tuner needs it: while it probes a k, or when no step was
  // timed for kMaxUnmeasured steps (under a steady stream of arrivals nearly every step has a prompt); then
  // the prompts run in a forward of their own. A second forward costs a pass over the weights and the
  // threads' hand-offs, which at 8 sequences cost plain decoding more than 10% when every arrival paid it.
  constexpr int64_t kMaxUnmeasured = 4;
  const bool prompts = rounds < members_.size();
  // The engine's first decoding step is no measure either: it runs with cold caches and first-touched KV
  // pages (on the bundled model, up to 3x the next steps), and, as the first probe of k = 0, it would make
  // plain decoding look slower than it is.
  // (Nor when no time could change the tuner's choice: at 32 server clients, where smaller batches had ruled
  // drafting out, every fifth step still ran its arrivals apart for a time nothing used.)
  const bool timed = tuner && rounds > 0 && decoded_ &&
                     (!prompts || tuner->probing() || (unmeasured_steps_ >= kMaxUnmeasured && tuner->needs_times()));
  decoded_ = decoded_ || rounds > 0;
  // And a step whose drafts or rounds' forward did one-off work (on the GPU: a shape's first run and its
  // graph recording, several times a replay) is none either: charged to a probe, it ended k = 1's probes
  // at 8-64 sequences in debt after two steps, and plain decoding kept the batch though k = 1 was faster.
  const bool split = timed && prompts;
  run_forward(0, split ? rounds : members_.size());
  const bool one_off = model_.one_off_forwards() != one_offs;
  double prefill_seconds = 0;
  if (split) {
    const auto t_prefill = Clock::now();
    run_forward(rounds, members_.size());
    prefill_seconds = seconds_since(t_prefill);
  }
  if (tuner) {
    const bool measured = timed && !one_off;
    unmeasured_steps_ = measured ? 0 : unmeasured_steps_ + 1;
    record_tuner(*tuner, timed ? seconds_since(t0) - prefill_seconds : -1.0, one_off);
    // (the arrivals' MTP prefill is a cost of the k > 0 this step ran; deferred under plain decoding)
    if (k_batch > 0) tuner->record_arrival_overhead(arrival_draft_seconds_, arrival_draft_tokens_);
  }
  retire_finished();
}

// Every decoding sequence's draft round, their MTP forwards batched (one pass over each MTP layer per step
// of the rounds, whatever the number of sequences).
void Engine::draft_all(int k_batch) {
  rounds_.clear();
  drafting_.clear();
  profile::Sections prof(kDraftBookkeeping);
  for (Entry& e : active_) {
    Sequence& s = *e.seq;
    if (s.phase() != Sequence::Phase::kDecoding) continue;
    try {
      if (DraftRound* r = s.start_draft(k_batch)) {
        rounds_.push_back(r);
        drafting_.push_back(&s);
      }
    } catch (const Error& err) {
      s.fail(err.what());
    }
  }
  prof.pause();
  model_.run_draft_rounds(rounds_.data(), rounds_.size());
  prof.next(kDraftBookkeeping);
  for (Sequence* s : drafting_) {
    try {
      s->finish_draft();
    } catch (const Error& err) {
      s->fail(err.what());
    }
  }
}

// The target forward over members_[begin, end) and what each of them does with its rows.
void Engine::run_forward(size_t begin, size_t end) {
  if (begin == end) return;
  const int64_t V = model_.facts().vocab_size, H = model_.facts().hidden_width;
  int64_t rows = 0, logit_rows = 0;
  for (size_t i = begin; i < end; ++i) {
    rows += segments_[i].rows;
    logit_rows += segments_[i].all_logits ? segments_[i].rows : 1;
  }
  if (int64_t(logits_.size()) < logit_rows * V) logits_.resize(logit_rows * V);
  if (int64_t(hidden_.size()) < rows * H) hidden_.resize(rows * H);
  const auto t_forward = Clock::now();
  try {
    model_.forward(segments_.data() + begin, end - begin, logits_.data(), hidden_.data());
  } catch (const Error& err) {
    for (size_t i = begin; i < end; ++i) members_[i]->fail(err.what());
    return;
  }
  const double forward_seconds = seconds_since(t_forward);
  const profile::Sections prof(kRowsBookkeeping);
  decide_all(begin, end);
  for (size_t i = begin; i < end; ++i) {
    Sequence& s = *members_[i];
    if (!decide_errors_[i].empty()) {
      s.fail(decide_errors_[i]);
      continue;
    }
    try {
      if (s.phase() == Sequence::Phase::kPrefill) {
        s.finish_prefill(row_hidden_[i], forward_seconds, plain_now_);
        if (s.tuned() && s.draft_prefill_seconds() > 0) {
          arrival_draft_seconds_ += s.draft_prefill_seconds();
          arrival_draft_tokens_ += double(s.max_tokens());
        }
      } else {
        s.finish_round(row_hidden_[i], forward_seconds);
      }
    } catch (const Error& err) {
      s.fail(err.what());
    }
  }
}

// Every member's decisions from its rows (Sequence::decide_*): on the host pool's threads when they sample
// enough rows to pay for the hand-off (at 64 sampled sequences and a 129k vocabulary ~40 ms a step on one
// core, against a GPU step of a few ms). Each touches its own sequence only, so the tokens are the same.
void Engine::decide_all(size_t begin, size_t end) {
  const int64_t V = model_.facts().vocab_size, H = model_.facts().hidden_width;
  row_logits_.resize(members_.size());
  row_hidden_.resize(members_.size());
  decide_errors_.resize(members_.size());
  const float* logits = logits_.data();
  const float* hidden = hidden_.data();
  int64_t work = 0, working = 0;
  for (size_t i = begin; i < end; ++i) {
    row_logits_[i] = logits;
    row_hidden_[i] = hidden;
    decide_errors_[i].clear();
    logits += (segments_[i].all_logits ? segments_[i].rows : 1) * V;
    hidden += segments_[i].rows * H;
    const int64_t w = members_[i]->decide_work();
    work += w;
    working += w > 0;
  }
  ThreadPool* pool = options_.split_decisions_for_tests ? model_.host_pool()
                     : working > 1 ? pool_for_work(model_.host_pool(), work * kSampledWorkPerLogit)
                                   : nullptr;
  parallel_for(pool, int64_t(end - begin), 1, [&](int64_t b, int64_t e, int) {
    for (size_t i = begin + size_t(b); i < begin + size_t(e); ++i) {
      Sequence& s = *members_[i];
      try {
        if (s.phase() == Sequence::Phase::kPrefill)
          s.decide_first_token(row_logits_[i]);
        else
          s.decide_round(row_logits_[i]);
      } catch (const Error& err) {
        decide_errors_[i] = err.what();
      }
    }
  });
}

// The best k depends on the batch: a verify of many sequences' k + 1 rows each costs more per row as the batch
// grows (MoE experts and attention stop being shared reads), so each batch size class (1, 2-3, 4-7, ...
// sequences) has a tuner of its own, created with the largest k a tuned sequence of the batch allows.
size_t Engine::tuner_bucket(int64_t tuned_sequences) {
  size_t bucket = 0;
  while (bucket + 1 < kTunerBuckets && (int64_t(2) << bucket) <= tuned_sequences) ++bucket;
  return bucket;
}

const KTuner* Engine::existing_tuner_for(int64_t tuned_sequences) const {
  const auto& t = tuners_[tuner_bucket(tuned_sequences)];
  return t ? &*t : nullptr;
}

KTuner& Engine::tuner_for(int64_t tuned_sequences) {
  const size_t bucket = tuner_bucket(tuned_sequences);
  if (!tuners_[bucket]) {
    int k_max = 0;
    for (const Entry& e : active_) k_max = std::max(k_max, e.seq->tuned() ? e.seq->k_max() : 0);
    // from the nearest class that has a tuner of the same k range, else a climb from k = 0
    const KTuner* neighbour = nullptr;
    for (size_t d = 1; d < kTunerBuckets && !neighbour; ++d)
      for (size_t b : {bucket - d, bucket + d})  // (bucket - d wraps past 0 to a huge index)
        if (!neighbour && b < kTunerBuckets && tuners_[b] && tuners_[b]->k_max() == k_max) neighbour = &*tuners_[b];
    if (neighbour)
      tuners_[bucket] = KTuner::seeded_from(*neighbour);
    else
      tuners_[bucket].emplace(k_max);
  }
  // What the smaller batches' rounds cost bounds this one's from below (k_tuner.h): the largest of their floors.
  KTuner& tuner = *tuners_[bucket];
  cost_floor_.assign(size_t(tuner.k_max()) + 1, 0.0);
  for (size_t b = 0; b < bucket; ++b)
    if (tuners_[b])
      for (int k = 1; k <= std::min(tuner.k_max(), tuners_[b]->k_max()); ++k)
        cost_floor_[k] = std::max(cost_floor_[k], tuners_[b]->round_cost_floor(k));
  tuner.set_round_cost_floor(cost_floor_);
  return tuner;
}

// The batch's k is judged by the step's time per decoding sequence (prompts' time excluded: a step with
// prompts is timed only when step() ran them apart) and by each tuned sequence's tokens: the tuner then
// minimizes the batch's time per token.
void Engine::record_tuner(KTuner& tuner, double step_seconds, bool one_off) {
  int64_t rounds = 0, tuned_rounds = 0;
  bool backlog = false;
  for (size_t i = 0; i < members_.size(); ++i) {
    const bool round = was_round_[i] && !members_[i]->failed();
    rounds += round;
    tuned_rounds += round && members_[i]->tuned();
    backlog = backlog || (round && members_[i]->tuned() && members_[i]->last_round().backlog);
  }
  if (rounds == 0) return;
  // A step with a catch-up of positions deferred by plain rounds (the first k > 0 step after k = 0 ones) is
  // no measure of its k either: its MTP forwards ran many rows a sequence, and taking the catch-up's share
  // out of the rounds' times took their ordinary catch-up with it (at 64 GPU sequences, 2 of a k = 1
  // probe's 3 measured steps were such, and k = 1 looked 5-8% cheaper than it runs). The budget pays it.
  const bool no_measure = one_off || backlog;
  const double weight = tuned_rounds > 0 ? 1.0 / double(tuned_rounds) : 1.0;  // the step is one observation
  for (size_t i = 0; i < members_.size(); ++i) {
    Sequence& s = *members_[i];
    if (!was_round_[i] || !s.tuned() || s.failed()) continue;
    const Sequence::RoundReport& r = s.last_round();
    ++s.rounds_at_k()[r.k_chosen];
    if (step_seconds < 0) continue;
    const double share = step_seconds / double(rounds);
    const auto& seam = s.spec().round_seconds_for_tests;
    if (no_measure && !seam) {
      tuner.record_one_off(r.k_chosen, share, r.emitted, r.drafts_judged, weight, /*warm_up=*/one_off);
      continue;
    }
    tuner.record(r.k_chosen, seam ? seam(r.k_chosen, r.emitted) : share, r.emitted, r.drafts_judged, weight);
  }
}

std::vector<Engine::TunerClass> Engine::tuner_classes() const {
  std::vector<TunerClass> out;
  for (size_t b = 0; b < kTunerBuckets; ++b) {
    if (!tuners_[b]) continue;
    TunerClass c;
    c.min_sequences = int64_t(1) << b;
    c.max_sequences = b + 1 < kTunerBuckets ? 2 * c.min_sequences - 1 : std::numeric_limits<int64_t>::max();
    for (int k = 0; k <= tuners_[b]->k_max(); ++k) c.seconds_per_token.push_back(tuners_[b]->seconds_per_token(k));
    c.rounds = tuners_[b]->rounds();
    c.best_k = tuners_[b]->best();
    c.noise = tuners_[b]->noise();
    c.budget_tokens = tuners_[b]->budget_tokens();
    for (int k = 0; k <= tuners_[b]->k_max(); ++k) c.hopeless.push_back(tuners_[b]->hopeless(k));
    out.push_back(std::move(c));
  }
  return out;
}

bool Engine::cancel(int64_t id) {
  auto end_entry = [&](auto& list, auto it) {
    it->seq->cancel();
    it->seq->release_memory();
    finished_.emplace_back(it->id, it->seq->take_result());
    list.erase(it);
    return true;
  };
  const auto has_id = [id](const Entry& e) { return e.id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), has_id); it != waiting_.end())
    return end_entry(waiting_, it);
  if (auto it = std::find_if(active_.begin(), active_.end(), has_id); it != active_.end())
    return end_entry(active_, it);
  return false;
}

void Engine::run() {
  while (!idle()) step();
}

std::vector<std::pair<int64_t, GenerationResult>> Engine::take_finished() {
  std::vector<std::pair<int64_t, GenerationResult>> out;
  out.swap(finished_);
  return out;
}

}  // namespace nextn
