// The one logits pipeline shared by plain and speculative decoding (drafts and verify rows alike, so that
// speculative sampling keeps the target's distribution):
//   logit bias -> min_tokens (stop ids banned) -> penalties (repetition over prompt+output; presence/frequency
//   over output) -> temperature -> top-k -> top-p -> min-p -> probabilities.
// temperature == 0 means greedy: the argmax of the penalized logits.
#pragma once
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace nextn {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  // Whether the seed must give the same output on every run (it was asked for): a sampled request's k then
  // stays fixed, since the draws a round consumes depend on it. Without (an API request with no seed), k is
  // tuned by measured speed as for greedy requests; the output is distributed as the target's either way.
  bool reproducible = true;
  float repetition_penalty = 1.0f;  // HF/vLLM: logit>0 -> /p, else *p, for tokens seen in prompt or output
  float presence_penalty = 0.0f;    // OpenAI: -= presence·[count>0], output tokens only
  float frequency_penalty = 0.0f;   // OpenAI: -= frequency·count, output tokens only
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (matched on detokenized text by the caller)
  int logprobs = -1;              // >= 0: report the chosen token's logprob and this many top alternatives
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the token's logit before everything else
  // (-100 all but bans a token, +100 all but forces it). Ids must be inside the vocabulary (Sampler checks).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's min_tokens: the stop ids cannot come before this many output tokens (their logits are -inf until
  // then), and stop strings apply from the min_tokens-th token on (TextStream).
  int min_tokens = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // Throws nextn::Error naming the field when a value is out of range.
  void validate() const;
};

// Token history the penalties look at: counts over prompt+output and over output only.
class TokenHistory {
 public:
  void reset(int64_t vocab, const std::vector<int32_t>& prompt);
  void push(int32_t token);  // an output token
  void pop(int32_t token);   // undo push (speculative rows)
  int32_t output_count(int32_t t) const { return output_counts_[t]; }
  int64_t output_length() const { return output_length_; }  // output tokens pushed and not popped
  bool seen(int32_t t) const { return all_counts_[t] > 0; }
  const std::vector<int32_t>& touched() const { return touched_; }  // tokens with nonzero counts (may repeat)

 private:
  std::vector<int32_t> all_counts_, output_counts_, touched_;
  int64_t output_length_ = 0;
};

class Sampler {
 public:
  Sampler(int64_t vocab, const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  int64_t vocab() const { return vocab_; }

  // Applies the logit bias, min_tokens' ban of the stop ids, then the penalties, in place (no-op when none is
  // set).
  void adjust_logits(float* logits, const TokenHistory& history) const;
  bool adjusts_logits() const;  // a logit bias, a min_tokens with stop ids or a penalty is set
  // Greedy without bias or penalties: the token is the raw logits' argmax (no copy, no distribution needed).
  bool raw_argmax_decides() const { return params_.greedy() && !adjusts_logits(); }
  // Penalized logits -> processed distribution probs[V] (temperature, top-k, top-p, min-p), sums to 1.
  // Greedy params give a one-hot distribution at the argmax.
  void distribution(const float* logits, float* probs);
  // Draws from probs with the sampler's RNG (one uniform draw).
  int32_t sample(const float* probs);
  float uniform();  // one draw in [0, 1)
  static int32_t argmax(const float* x, int64_t n);  // ties: lowest index

 private:
  bool has_penalties() const;  // repetition, presence or frequency
  // probs = softmax(logits / temperature); a temperature so small that logits / T overflows gives the
  // limit T -> 0 (all weight on the argmax, shared by tied maxima) instead of nan.
  void softmax_at_temperature(const float* logits, float* probs) const;
  void truncate_top_k_top_p(float* probs);  // zeroes what top-k and top-p leave out


  int64_t vocab_;
  SamplingParams params_;
  std::mt19937_64 rng_;
  // scratch [V] each: candidates as order keys (~probability bits << 32 | id: ascending = the cut's order)
  std::vector<uint64_t> order_, order_scratch_;
  std::array<int64_t, 256> exponent_count_{};  // scratch: tokens per probability exponent
  std::array<float, 256> exponent_mass_{};
};

}  // namespace nextn
