// One generation request and what it gives back: sampling and speculation options, the per-request
// metrics (vLLM's speculative decoding metrics plus where the time went) and the result.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace nextn {

namespace structured {
class Matcher;
class TokenVocab;
}  // namespace structured

// Structured output (engine/structured/): the generated text must match the matcher's grammar (a JSON
// Schema, or any JSON object), spelled with the vocabulary's tokens. Speculation keeps it exact: drafts and
// verify rows are masked alike. Null matcher: free text.
struct OutputFormat {
  std::shared_ptr<const structured::Matcher> matcher;
  std::shared_ptr<const structured::TokenVocab> vocab;
  bool constrained() const { return matcher != nullptr; }
};

struct SpecOptions {
  bool enabled = true;        // off, or no MTP layers: plain decoding
  int num_speculative_tokens = 3;  // k, 1..8
  bool use_draft_probs = true;     // false: treat the draft as one-hot q (still exact; lower acceptance)
  // Opt-in, LOSSY: also accept a draft token that is in the target's top `relaxed_top_n` and whose
  // probability is within `relaxed_delta` of the top token's (TensorRT-LLM's relaxed acceptance).
  bool relaxed = false;
  int relaxed_top_n = 3;
  float relaxed_delta = 0.1f;
  // Opt-in adaptive k: when the acceptance rate over the last `adaptive_window` rounds falls under
  // `adaptive_threshold`, k shrinks by one (down to 0 = no drafting); while k = 0, a probe round with
  // k = 1 runs every `adaptive_probe_interval` tokens; k grows back when the rate recovers.
  bool adaptive = false;
  float adaptive_threshold = 0.3f;
  int adaptive_window = 8;
  int adaptive_probe_interval = 16;
  // Greedy only: k for each round is chosen among 0..num_speculative_tokens by the measured time per
  // emitted token (KTuner); greedy output is the same for every k. Ignored when sampling, where k stays
  // fixed so that a seed reproduces the output. Not combined with `adaptive`.
  bool tune_k = false;
  // Test seam: replaces a tuned round's measured duration: (k, tokens emitted) -> seconds.
  std::function<double(int k, int emitted)> round_seconds_for_tests;

  // Test seam: the k of round `round` (0, 1, ...), in place of num_speculative_tokens (clamped to it).
  std::function<int(int64_t round)> k_schedule_for_tests;

  // Test seam: replaces the draft token for absolute position `pos`, drafted at step `step` (0-based) of its
  // round (q becomes one-hot at the result). Lets tests and bench's --oracle-acceptance drive exact, partial
  // and zero acceptance through the real verify / rollback path.
  std::function<int32_t(int64_t pos, int step, int32_t drafted)> draft_hook;
  // Test seam: run draft step 1 in a forward of its own instead of with layer 1's catch-up (the drafts
  // must be the same either way).
  bool unmerged_catch_up_for_tests = false;
  // Test seam: may rewrite the draft's processed distribution q[V] before the draft token is drawn from
  // it. `context` = prompt + emitted tokens + the drafts of this round so far. Exactness must hold for
  // any q, so tests use it to reach realistic acceptance rates with random-weight fixtures.
  std::function<void(const std::vector<int32_t>& context, float* q)> draft_dist_hook;
  // Test seam that BREAKS exactness: accept every draft. Used only to show the distribution tests have power.
  bool broken_accept_all_for_tests = false;

  void validate() const;
};

// vLLM's speculative decoding metrics.
struct SpecStats {
  int64_t num_drafts = 0;           // rounds that drafted
  int64_t num_draft_tokens = 0;     // tokens drafted
  int64_t num_accepted_tokens = 0;  // drafted tokens accepted
  std::vector<int64_t> accepted_per_position;  // [k]: rounds whose i-th draft token was accepted
  int64_t num_generated = 0;
  int64_t prompt_tokens = 0;
  int64_t target_forwards = 0, draft_forwards = 0;
  // prefill: the target over the prompt, the first token, and the MTP layers over the prompt (speculation
  // only; after the first token is out); decode: everything after.
  double prefill_seconds = 0, decode_seconds = 0;
  // Where decode time went (speculation only): the target's verify forwards, the MTP layers' catch-up on
  // verified positions, and the draft steps (MTP forwards past the catch-up, lm_head, picking the token).
  // The rest of decode_seconds is acceptance and bookkeeping.
  double verify_seconds = 0, catch_up_seconds = 0, draft_seconds = 0;
  std::vector<int64_t> rounds_at_k;  // tuned k: rounds run with each k (k = 0: plain steps); else empty
  std::string rounds_at_k_text() const;  // " 0:3 1:13 2:9" (empty when k was not tuned)
  // decode_seconds' shares: verify, catch-up, draft steps, other (all 0 before any decode).
  struct DecodeShares {
    double verify, catch_up, draft, other;
  };
  DecodeShares decode_shares() const;
  std::string round_split_text() const;  // "verify 82.1%, MTP catch-up 9.6%, draft steps 6.5%, other 1.8%"

  double mean_acceptance_length() const;  // 1 + accepted / drafts
  std::vector<double> per_position_acceptance() const;
  double tokens_per_second() const;       // decode: (generated - 1) / time after the first token
  void add_round(int drafted, int accepted);
};

// The drafts of MTP layers that cannot be working: fewer than 1% of at least kBrokenDraftsMinTokens drafted tokens
// accepted. Trained MTP layers are accepted tens of percent of the time even on text unlike their training or
// sampled hot; random or misread weights about once in the vocabulary's size. The commonest MTP failure in the
// field is weights dropped or garbled on the way to the engine, seen by users only as speculation that never
// pays: this names it. Returns the warning (one line, no newline), or "" when the drafts look like a trained
// layer's or are too few to tell.
inline constexpr int64_t kBrokenDraftsMinTokens = 64;
std::string broken_drafts_warning(int64_t draft_tokens, int64_t accepted_tokens);

struct TokenLogprob {
  int32_t token;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;
};
// log-softmax of a row of raw logits [V]: token's logprob and the top_n alternatives' (descending logit, ties
// by ascending id).
TokenLogprob token_logprob(const float* logits, int64_t V, int32_t token, int top_n);

struct GenerationResult {
  std::vector<int32_t> ids;  // generated tokens only
  std::vector<TokenLogprob> logprobs;  // when params.logprobs >= 0
  std::string finish_reason;  // "length" | "stop" | "error"
  std::string error;          // what went wrong, when finish_reason is "error"
  SpecStats stats;
};

// Called for each emitted token in order (streaming), with its logprobs when params.logprobs >= 0 (else null);
// returns false to stop (stop strings).
using TokenCallback = std::function<bool(int32_t token, const TokenLogprob* logprob)>;

// A request as the engine takes it.
struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  SpecOptions spec;
  TokenCallback on_token;
  OutputFormat format;
};

}  // namespace nextn
