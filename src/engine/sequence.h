// One request's life in the engine, as a state machine the engine steps:
//
//   waiting --admit--> prefill --(prompt rows in a batch forward)--> decoding --(rounds)--> finished
//
// A decoding round is   draft  (the sequence's MTP drafter proposes k tokens)
//                    -> verify (its k+1 rows join the engine's one target forward for all sequences)
//                    -> accept (longest acceptable prefix + one target token; greedy: exact match,
//                               sampling: speculative sampling, so the output is the target's)
//                    -> rollback (the target state forgets rejected rows; the drafter gets the kept ones).
// Stop ids, max_tokens, logprobs and the per-request metrics live here, so every front-end shares them.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/structured/token_filter.h"
#include "models/model.h"

namespace nextn {

class Sequence final : private DraftPicker {
 public:
  enum class Phase { kWaiting, kPrefill, kDecoding, kFinished };

  // Validates the request against the model (throws nextn::Error for bad arguments, a prompt longer than
  // the context, ...). A max_tokens past the context is cut to what is left, with a note on stderr.
  Sequence(Model& model, Request request);

  Phase phase() const { return phase_; }
  bool finished() const { return phase_ == Phase::kFinished; }
  bool failed() const { return res_.finish_reason == "error"; }
  const SpecOptions& spec() const { return request_.spec; }
  bool drafting() const { return speculate_; }
  // Positions its memory must hold: prompt + max_tokens + the rows of one round.
  int64_t capacity() const { return capacity_; }
  int64_t max_tokens() const { return max_tokens_; }  // the most it generates (max_tokens, cut to the context)
  int64_t tokens_left() const { return max_tokens_ - int64_t(res_.ids.size()); }  // the most it may still emit
  int64_t prompt_tokens() const { return int64_t(request_.prompt.size()); }
  // Greedy with tuned k: the engine picks k for the whole batch.
  bool tuned() const { return tuned_; }
  int k_max() const { return k_max_; }

  // Takes its memory; the sequence then prefills in the next step.
  void admit(std::unique_ptr<SequenceState> state);

  // A forward's rows are finished in two parts. decide_* reads the rows' logits and makes every choice:
  // the tokens (sampling, speculative acceptance), their logprobs, the stop; it touches this sequence's own
  // state only, so the engine runs many sequences' at once on the host's threads. finish_* then does what
  // touches anything shared, in the engine's order: the request's token callback for each decided token, the
  // caches' rollback, the drafter. decide_work() is the host work decide_* will do (vocabulary-wide passes).
  int64_t decide_work() const;

  // Prefill: the prompt's rows (logits of the last only), then the first token from those logits and the
  // drafter's catch-up over the prompt. forward_seconds: what the shared forward took.
  BatchSegment prefill_segment();
  void decide_first_token(const float* last_logits);
  // defer_draft_prefill: the batch's tuner runs plain decoding now, so a tuned sequence leaves its prompt to
  // the MTP layers' deferral window (caught up, its newest positions only, when it first drafts) instead of
  // an MTP forward of its own that plain rounds would never use.
  void finish_prefill(const float* hidden, double forward_seconds, bool defer_draft_prefill = false);
  // What the MTP layers' pass over the prompt took in finish_prefill (0 when deferred or not speculating).
  double draft_prefill_seconds() const { return draft_prefill_seconds_; }

  // A decoding round. k_tuned: the batch's k for tuned sequences (ignored by the others). The draft round
  // (null: no drafting) runs with the batch's others (Model::run_draft_rounds); finish_draft throws its error.
  DraftRound* start_draft(int k_tuned);
  void finish_draft();
  BatchSegment verify_segment();
  void decide_round(const float* logits);  // the verify rows' logits [drafted + 1, V]
  void finish_round(const float* hidden, double forward_seconds);

  // What the last round tells the batch's k tuner.
  struct RoundReport {
    int k_chosen = 0, k = 0, emitted = 0;
    bool drafts_judged = false;
    bool backlog = false;  // ran a one-off catch-up of positions deferred by k = 0 rounds (not k's cost)
  };
  const RoundReport& last_round() const { return report_; }
  // Tuned rounds run at each k (filled by the engine; becomes stats.rounds_at_k).
  std::vector<int64_t>& rounds_at_k() { return rounds_at_k_; }

  // Ends the sequence with an error (finish_reason "error"); its memory is freed by the engine.
  void fail(const std::string& message);
  // Ends the sequence now, keeping what it has emitted (finish_reason "abort", as vLLM's): a client went away.
  void cancel();
  void release_memory();  // the KV pages go back to the pool at once
  GenerationResult take_result();

 private:
  using Clock = std::chrono::steady_clock;
  void emit(int32_t t, const float* raw_logits);
  void publish();
  void take_back_after(size_t kept);
  static Error non_finite_target(int64_t pos);
  void require_finite_target(const float* raw, int64_t pos) const;
  void target_dist(const float* raw, float* probs);
  int32_t draw(const float* probs);
  int32_t target_token(const float* raw);
  int32_t target_token_at(const float* logits, int i, int64_t pos);
  int32_t pick(int s, float* raw) override;
  bool picks_argmax() const override;
  bool picks_alone() const override;
  bool greedy_draft() const;
  int32_t pick_id(int s, int32_t argmax) override;
  int32_t take_draft(int s, int32_t d, Clock::time_point t0);
  int32_t draft_from_distribution(int s, float* raw);
  void update_adaptive_k(int drafted, int accepted);
  void finish(const char* reason);

  Model& model_;
  Request request_;
  const int64_t V_, H_;
  Phase phase_ = Phase::kWaiting;
  bool speculate_ = false, tuned_ = false, stop_ = false;
  bool argmax_only_ = false;  // its forwards' segments ask for the target rows' argmax only (BatchSegment)
  int k_max_ = 0;
  int64_t max_tokens_ = 0, capacity_ = 0;
  Sampler sampler_;
  TokenHistory history_;
  std::unique_ptr<SequenceState> state_;
  std::unique_ptr<DraftSession> drafter_;
  std::unique_ptr<structured::OutputConstraint> constraint_;  // structured output (request.h's OutputFormat)
  DraftRound round_;  // (after drafter_: destroyed first, its frame lives in the drafter's arena)
  int64_t backlog_rows_ = 0;
  double pick_seconds_ = 0;
  double draft_prefill_seconds_ = 0;  // see draft_prefill_seconds()
  GenerationResult res_;
  std::vector<int32_t> seq_;  // prompt + emitted tokens
  // One round's buffers, sized at admission (the decode loop does not allocate beyond the result vectors).
  std::vector<float> q_, p_, resid_;  // [(k_max + 1) · V] draft distributions, [V], [V]
  std::vector<int32_t> drafts_, verify_tokens_;
  std::vector<int32_t> argmax_;  // [k_max + 1] the model's argmax of this sequence's logit rows
  int64_t m_ = 0;  // this round's newest position: seq_[m_] is not yet run through the target
  int drafted_ = 0;
  int accepted_ = 0;        // the last round's accepted drafts (decide_round)
  size_t published_ = 0;    // res_.ids handed to the request's callback so far
  Clock::time_point t_results_;  // when this step's decide_* began
  int64_t rounds_ = 0;
  RoundReport report_;
  std::vector<int64_t> rounds_at_k_;
  // adaptive k
  int k_cur_ = 0;
  std::vector<std::pair<int, int>> window_;  // (drafted, accepted) of recent rounds
  int64_t since_probe_ = 0;
  Clock::time_point t_decode_, t_admit_;
};

}  // namespace nextn
