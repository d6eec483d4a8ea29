#include "engine/sequence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/finite.h"

namespace nextn {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Sequence::Sequence(Model& model, Request request)
    : model_(model), request_(std::move(request)), V_(model.facts().vocab_size), H_(model.facts().hidden_width),
      sampler_(V_, request_.params) {
  const SamplingParams& params = request_.params;
  SpecOptions& spec = request_.spec;
  params.validate();
  spec.validate();
  const std::vector<int32_t>& prompt = request_.prompt;
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= V_) throw Error("generate: prompt token " + std::to_string(t) + " outside the vocabulary");
  speculate_ = spec.enabled && model.facts().num_mtp_layers > 0;
  k_max_ = speculate_ ? spec.num_speculative_tokens : 0;
  tuned_ = speculate_ && spec.tune_k && (params.greedy() || !params.reproducible);
  if (request_.format.constrained()) {
    const OutputFormat& f = request_.format;
    if (!f.vocab || f.vocab->size() != V_)
      throw Error("generate: structured output needs the model's vocabulary of " + std::to_string(V_) + " tokens");
    constraint_ = std::make_unique<structured::OutputConstraint>(f.matcher, f.vocab, params.stop_token_ids);
  }
  // Greedy without bias, penalties, logprobs, relaxed acceptance or an output format reads nothing of a target
  // row but its argmax.
  argmax_only_ = sampler_.raw_argmax_decides() && !constraint_ && params.logprobs < 0 && !spec.relaxed;
  k_cur_ = k_max_;
  const int64_t n = int64_t(prompt.size());
  // Prompt and output share the model's context (as OpenAI-style servers count it): a longer prompt is an
  // error, a max_tokens past the context is cut to what is left, so no cache outgrows the context.
  const int64_t context = model.facts().context;
  if (n > context)
    throw Error("generate: the prompt has " + std::to_string(n) + " tokens, more than the model's context of " +
                std::to_string(context) + " (max_position_embeddings)");
  max_tokens_ = std::min<int64_t>(params.max_tokens, context - n);
  if (max_tokens_ < params.max_tokens)
    std::fprintf(stderr, "nextn: note: max_tokens %lld is more than the context leaves (%lld of %lld after the prompt's "
                 "%lld tokens): generating at most %lld tokens\n", (long long)params.max_tokens,
                 (long long)(context - n), (long long)context, (long long)n, (long long)max_tokens_);
  // The last position a forward reads is n + max_tokens - 2 (the last token is emitted, never fed back); the
  // slack past it is for the verify and draft rows of a round.
  capacity_ = std::min<int64_t>(n + max_tokens_ + k_max_ + 2, context);
  res_.stats.prompt_tokens = n;
  if (max_tokens_ == 0) finish("length");
}

void Sequence::admit(std::unique_ptr<SequenceState> state) {
  state_ = std::move(state);
  if (speculate_) {
    DraftOptions o;
    o.k_max = k_max_;
    o.merge_catch_up = !request_.spec.unmerged_catch_up_for_tests;
    drafter_ = model_.new_draft_session(*state_, o);
  }
  history_.reset(V_, request_.prompt);
  seq_ = request_.prompt;
  seq_.reserve(capacity_);
  q_.resize((k_max_ + 1) * V_);
  p_.resize(V_);
  resid_.resize(V_);
  drafts_.resize(k_max_ + 1);
  verify_tokens_.resize(k_max_ + 1);
  argmax_.resize(k_max_ + 1);
  if (tuned_) rounds_at_k_.assign(k_max_ + 1, 0);
  t_admit_ = Clock::now();
  phase_ = Phase::kPrefill;
}

void Sequence::finish(const char* reason) {
  if (res_.finish_reason.empty()) res_.finish_reason = reason;
  phase_ = Phase::kFinished;
}

void Sequence::fail(const std::string& message) {
  take_back_after(published_);  // (a step's tokens decided before the error never reached the callback)
  res_.finish_reason = "error";
  res_.error = message;
  phase_ = Phase::kFinished;
}

void Sequence::cancel() {
  if (!finished()) finish("abort");
}

void Sequence::release_memory() {
  if (drafter_) res_.stats.draft_forwards = drafter_->forwards();
  drafter_.reset();
  state_.reset();
}

GenerationResult Sequence::take_result() {
  SpecStats& st = res_.stats;
  if (t_decode_ != Clock::time_point{}) st.decode_seconds = seconds_between(t_decode_, Clock::now());
  if (drafter_) st.draft_forwards = drafter_->forwards();
  if (tuned_) st.rounds_at_k = rounds_at_k_;
  if (res_.finish_reason.empty()) res_.finish_reason = "length";
  return std::move(res_);
}

void Sequence::emit(int32_t t, const float* raw_logits) {
  const SamplingParams& params = request_.params;
  seq_.push_back(t);
  history_.push(t);
  res_.ids.push_back(t);
  ++res_.stats.num_generated;
  bool complete = false;
  if (constraint_) {
    if (!constraint_->advance(t)) throw Error("internal: structured output refused an emitted token");
    complete = constraint_->finished();
  }
  if (params.logprobs >= 0) res_.logprobs.push_back(token_logprob(raw_logits, V_, t, params.logprobs));
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), t) != params.stop_token_ids.end()) {
    stop_ = true;
    res_.finish_reason = "stop";
  }
  if (complete && !stop_) {  // the output is whole (a JSON value closed): nothing may follow
    stop_ = true;
    res_.finish_reason = "stop";
  }
  if (!stop_ && int64_t(res_.ids.size()) >= max_tokens_) {
    stop_ = true;
    res_.finish_reason = "length";
  }
}

// The tokens decided since the last call, to the request's callback in order (the server's text stream and
// its stop strings). A callback that says stop ends the output at its token: what was decided after it is
// taken back, as though the round had stopped there.
void Sequence::publish() {
  const SamplingParams& params = request_.params;
  if (!request_.on_token) published_ = res_.ids.size();
  for (; published_ < res_.ids.size(); ++published_) {
    const TokenLogprob* logprob = params.logprobs >= 0 ? &res_.logprobs[published_] : nullptr;
    if (request_.on_token(res_.ids[published_], logprob)) continue;
    take_back_after(++published_);
    stop_ = true;
    res_.finish_reason = "stop";
  }
}

// Forgets the emitted tokens after the first `kept` (the sequence stops: its caches and drafter are not used
// again, nor its output format's matcher).
void Sequence::take_back_after(size_t kept) {
  while (res_.ids.size() > kept) {
    history_.pop(res_.ids.back());
    seq_.pop_back();
    res_.ids.pop_back();
    if (!res_.logprobs.empty()) res_.logprobs.pop_back();
    --res_.stats.num_generated;
  }
}

// NaN or inf in a row of logits (a non-finite weight, or one that overflows) would be sampled as token 0 or as
// garbage: generation stops at the first such row the sampler is about to read, naming the forward.
Error Sequence::non_finite_target(int64_t pos) {
  return Error("generate: the target forward at position " + std::to_string(pos) +
               " produced non-finite logits (NaN or inf); check the checkpoint with `nextn inspect --scan`");
}

void Sequence::require_finite_target(const float* raw, int64_t pos) const {
  if (!all_finite(raw, V_)) throw non_finite_target(pos);
}

// Target choice for one row of raw logits (bias, and penalties from the current history).
void Sequence::target_dist(const float* raw, float* probs) {
  std::copy(raw, raw + V_, resid_.data());
  if (constraint_) constraint_->mask(resid_.data());
  sampler_.adjust_logits(resid_.data(), history_);
  sampler_.distribution(resid_.data(), probs);
}

int32_t Sequence::draw(const float* probs) {
  return request_.params.greedy() ? Sampler::argmax(probs, V_) : sampler_.sample(probs);
}

// The target's token for one row of raw logits: target_dist's choice, drawn. Greedy without penalties is
// the raw row's argmax (no copy, no one-hot distribution: at 64 sequences those passes over the vocabulary
// were a tenth of a GPU step).
int32_t Sequence::target_token(const float* raw) {
  if (sampler_.raw_argmax_decides()) {
    if (!constraint_) return Sampler::argmax(raw, V_);
    std::copy(raw, raw + V_, resid_.data());  // (an output format: the argmax of the allowed logits)
    constraint_->mask(resid_.data());
    return Sampler::argmax(resid_.data(), V_);
  }
  target_dist(raw, p_.data());
  return draw(p_.data());
}

// The target's token for logit row i of this sequence's rows in the last forward (at position pos), after
// checking the row is finite: from the model's argmax when that is all the row was asked for.
int32_t Sequence::target_token_at(const float* logits, int i, int64_t pos) {
  if (argmax_only_) {
    if (argmax_[i] < 0) throw non_finite_target(pos);
    return argmax_[i];
  }
  const float* raw = logits + int64_t(i) * V_;
  require_finite_target(raw, pos);
  return target_token(raw);
}

BatchSegment Sequence::prefill_segment() {
  return BatchSegment{state_.get(), request_.prompt.data(), int64_t(request_.prompt.size()), /*all_logits=*/false,
                      argmax_only_ ? argmax_.data() : nullptr};
}

// Host work of the next decide_* (sequence.h): a vocabulary-wide pass or more for each row read whole.
int64_t Sequence::decide_work() const {
  if (argmax_only_) return 0;
  return (phase_ == Phase::kPrefill ? 1 : drafted_ + 1) * V_;
}

void Sequence::decide_first_token(const float* last_logits) {
  t_results_ = Clock::now();
  ++res_.stats.target_forwards;
  const int64_t n = int64_t(request_.prompt.size());
  emit(target_token_at(last_logits, 0, n - 1), last_logits);
}

// The first token to the callback, then (speculation) the MTP layers over the prompt, so that decoding starts
// with every draft layer caught up (unless deferred, see sequence.h). Both count as prefill time.
void Sequence::finish_prefill(const float* hidden, double forward_seconds, bool defer_draft_prefill) {
  SpecStats& st = res_.stats;
  const int64_t n = int64_t(request_.prompt.size());
  publish();
  if (speculate_ && !stop_) {
    drafter_->push_verified(hidden, n);
    if (!(defer_draft_prefill && tuned_)) {
      const auto t_draft = Clock::now();
      drafter_->catch_up_prompt(seq_, k_max_);
      draft_prefill_seconds_ = seconds_between(t_draft, Clock::now());
    }
  }
  st.prefill_seconds = forward_seconds + seconds_between(t_results_, Clock::now());
  t_decode_ = Clock::now();
  if (stop_)
    finish("length");
  else
    phase_ = Phase::kDecoding;
}

// ---- a round ----------------------------------------------------------------------------------------------

DraftRound* Sequence::start_draft(int k_tuned) {
  const SpecOptions& spec = request_.spec;
  m_ = int64_t(seq_.size()) - 1;  // seq_[m] is the newest token; the target has seen [0, m)
  report_ = RoundReport{};
  const int k_chosen = spec.k_schedule_for_tests ? std::clamp(spec.k_schedule_for_tests(rounds_), 0, k_max_)
                       : tuned_                  ? std::clamp(k_tuned, 0, k_max_)
                                                 : k_cur_;
  ++rounds_;
  int k = k_chosen;
  if (speculate_ && spec.adaptive && k_cur_ == 0 && ++since_probe_ >= spec.adaptive_probe_interval) {
    k = 1;  // probe
    since_probe_ = 0;
  }
  // Never draft past max_tokens: the round emits at most k+1 tokens.
  k = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(k, max_tokens_ - int64_t(res_.ids.size()) - 1)));
  report_.k_chosen = k_chosen;
  report_.k = k;
  drafted_ = 0;
  pick_seconds_ = 0;
  if (!speculate_) return nullptr;
  if (constraint_) constraint_->begin_draft();
  // A catch-up longer than one round's own rows (positions deferred by k = 0 rounds) is a one-off; the tuner
  // does not charge it to this round's k.
  backlog_rows_ = drafter_->pending_rows() > k_max_ + 1 ? drafter_->pending_rows() : 0;
  round_.reset();  // (a round left over from a step that threw: its frame is the arena the new one takes)
  round_ = drafter_->round(seq_, k, *this);
  return &round_;
}

void Sequence::finish_draft() {
  if (!round_.valid()) return;
  for (int s = drafted_ - 1; s >= 0; --s) history_.pop(drafts_[s]);
  const std::exception_ptr error = round_.error();
  round_.reset();
  if (error) std::rethrow_exception(error);
  const double catch_seconds = drafter_->round_catch_up_seconds();
  SpecStats& st = res_.stats;
  st.catch_up_seconds += catch_seconds;
  st.draft_seconds += drafter_->round_draft_seconds() + pick_seconds_;
  // A k = 0 round is not charged for the catch-up its position may cost later: at most the drafter's
  // window of positions is ever caught up, once, when drafting resumes, and the tuner's probe budget pays
  // that. (Charging every plain round for it made plain decoding look ~10% dearer than it is at 32-64
  // sequences, and the server's tuner kept k = 1 where it lost.)
  report_.backlog = backlog_rows_ > 0 && catch_seconds > 0;
}

// Draft step s: its raw logits -> the draft distribution q (bias and penalties as the target applies them) ->
// the draft token.
int32_t Sequence::pick(int s, float* raw) {
  const auto t0 = Clock::now();
  if (!greedy_draft()) return take_draft(s, draft_from_distribution(s, raw), t0);
  if (constraint_) constraint_->mask_draft(raw);
  return take_draft(s, Sampler::argmax(raw, V_), t0);
}

// Greedy acceptance reads the draft token only (never q): without bias, penalties or test hooks, the row's
// argmax (of its allowed tokens, under an output format) decides and q is not built.
bool Sequence::greedy_draft() const {
  const SpecOptions& spec = request_.spec;
  return sampler_.raw_argmax_decides() && !spec.draft_dist_hook && !spec.draft_hook;
}

// The model may hand over the id alone where the raw row's argmax decides (no output format to mask it).
bool Sequence::picks_argmax() const { return greedy_draft() && !constraint_; }

// A pick touches this sequence's state only, unless a test's hook sees it.
bool Sequence::picks_alone() const { return !request_.spec.draft_dist_hook && !request_.spec.draft_hook; }

int32_t Sequence::pick_id(int s, int32_t argmax) { return take_draft(s, argmax, Clock::now()); }

int32_t Sequence::take_draft(int s, int32_t d, Clock::time_point t0) {
  drafts_[s] = d;
  history_.push(d);  // (popped when the round ends)
  if (constraint_) constraint_->advance_draft(d);
  ++drafted_;
  pick_seconds_ += seconds_between(t0, Clock::now());
  return d;
}

// Draft step s's distribution q (kept for acceptance) from its raw logits, and the token drawn from it.
int32_t Sequence::draft_from_distribution(int s, float* raw) {
  const SpecOptions& spec = request_.spec;
  float* qs = q_.data() + int64_t(s) * V_;
  if (constraint_) constraint_->mask_draft(raw);
  sampler_.adjust_logits(raw, history_);
  sampler_.distribution(raw, qs);
  if (spec.draft_dist_hook) {
    std::vector<int32_t> ctx = seq_;
    ctx.insert(ctx.end(), drafts_.begin(), drafts_.begin() + s);
    spec.draft_dist_hook(ctx, qs);
  }
  int32_t d = draw(qs);
  if (spec.draft_hook) {  // test seam: replace the drafted token (greedy only)
    d = spec.draft_hook(int64_t(seq_.size()) + s, s, d);
    std::fill(qs, qs + V_, 0.0f);
    qs[d] = 1.0f;
  }
  if (!spec.use_draft_probs) {  // one-hot q at the drafted token
    std::fill(qs, qs + V_, 0.0f);
    qs[d] = 1.0f;
  }
  return d;
}

BatchSegment Sequence::verify_segment() {
  verify_tokens_[0] = seq_[m_];
  for (int s = 0; s < drafted_; ++s) verify_tokens_[s + 1] = drafts_[s];
  return BatchSegment{state_.get(), verify_tokens_.data(), drafted_ + 1, /*all_logits=*/true,
                      argmax_only_ ? argmax_.data() : nullptr};
}

// Acceptance over the verify rows' logits [drafted + 1, V]: the accepted drafts, then the correction at the
// first rejection or the bonus token after the last draft.
void Sequence::decide_round(const float* logits) {
  t_results_ = Clock::now();
  ++res_.stats.target_forwards;
  const SamplingParams& params = request_.params;
  const SpecOptions& spec = request_.spec;
  int accepted = 0;
  for (int i = 0; i < drafted_ && !stop_; ++i) {
    const float* raw = logits + int64_t(i) * V_;  // (not written when argmax_only_)
    const int32_t d = drafts_[i];
    bool ok;
    int32_t greedy = -1;  // (greedy: the target's token)
    if (params.greedy()) {
      greedy = target_token_at(logits, i, m_ + i);
      ok = greedy == d;
    } else {
      require_finite_target(raw, m_ + i);
      target_dist(raw, p_.data());
      const float qd = q_[int64_t(i) * V_ + d];
      ok = qd > 0 && sampler_.uniform() < std::min(1.0f, p_[d] / qd);
    }
    if (spec.broken_accept_all_for_tests) ok = true;
    if (!ok && spec.relaxed) {
      // Lossy opt-in: d within the target's top-N and close to its best probability (T = 1).
      std::copy(raw, raw + V_, resid_.data());
      if (constraint_) constraint_->mask(resid_.data());
      sampler_.adjust_logits(resid_.data(), history_);
      float mx = -INFINITY;
      for (int64_t v = 0; v < V_; ++v) mx = std::max(mx, resid_[v]);
      double z = 0;
      for (int64_t v = 0; v < V_; ++v) z += std::exp(double(resid_[v]) - mx);
      int rank = 0;
      for (int64_t v = 0; v < V_; ++v) rank += resid_[v] > resid_[d];
      const double pd = std::exp(double(resid_[d]) - mx) / z, ptop = 1.0 / z;
      ok = rank < spec.relaxed_top_n && pd >= ptop - spec.relaxed_delta;
    }
    if (!ok) {
      // Correction: the target's token (greedy), or a draw from normalize(max(p - q, 0)).
      int32_t t;
      if (params.greedy()) {
        t = greedy;
      } else {
        const float* qs = q_.data() + int64_t(i) * V_;
        double z = 0;
        for (int64_t v = 0; v < V_; ++v) {
          resid_[v] = std::max(p_[v] - qs[v], 0.0f);
          z += resid_[v];
        }
        if (z <= 0) {
          t = sampler_.sample(p_.data());
        } else {
          for (int64_t v = 0; v < V_; ++v) resid_[v] = static_cast<float>(resid_[v] / z);
          t = sampler_.sample(resid_.data());
        }
      }
      emit(t, raw);
      break;
    }
    ++accepted;
    emit(d, raw);
  }
  if (!stop_ && accepted == drafted_) {  // bonus token from the last row
    emit(target_token_at(logits, drafted_, m_ + drafted_), logits + int64_t(drafted_) * V_);
  }
  if (drafted_ > 0) res_.stats.add_round(drafted_, accepted);
  update_adaptive_k(drafted_, accepted);
  accepted_ = accepted;
}

void Sequence::finish_round(const float* hidden, double forward_seconds) {
  SpecStats& st = res_.stats;
  if (speculate_) st.verify_seconds += forward_seconds;
  const size_t emitted_before = published_;
  publish();
  const int emitted = static_cast<int>(res_.ids.size() - emitted_before);
  // Keep the target state for positions m..m+accepted; their hidden states feed the next draft round.
  const int64_t kept = std::min<int64_t>(accepted_ + 1, drafted_ + 1);
  state_->rollback(m_ + kept);
  if (speculate_) drafter_->push_verified(hidden, kept);
  if (!stop_ && int64_t(seq_.size()) != m_ + kept + 1) throw Error("internal: sequence and cache out of step");
  report_.emitted = emitted;
  report_.drafts_judged = report_.k == report_.k_chosen && drafted_ == report_.k && !stop_;
  if (stop_) finish("length");
}

void Sequence::update_adaptive_k(int drafted, int accepted) {
  const SpecOptions& spec = request_.spec;
  if (!speculate_ || !spec.adaptive || drafted == 0) return;
  window_.emplace_back(drafted, accepted);
  if (int(window_.size()) > spec.adaptive_window) window_.erase(window_.begin());
  int64_t dsum = 0, asum = 0;
  for (auto [dd, aa] : window_) dsum += dd, asum += aa;
  const double rate = double(asum) / double(dsum);
  if (int(window_.size()) >= std::min(spec.adaptive_window, 2)) {
    if (rate < spec.adaptive_threshold && k_cur_ > 0) {
      --k_cur_;
      window_.clear();
    } else if (rate >= spec.adaptive_threshold && k_cur_ < k_max_ && accepted == drafted) {
      ++k_cur_;
    }
  }
}

}  // namespace nextn
