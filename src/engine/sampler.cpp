#include "engine/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"

namespace nextn {

void SamplingParams::validate() const {
  auto bad = [](const std::string& field, const std::string& why) { throw Error("sampling: " + field + " " + why); };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature", "must be >= 0");
  if (top_k < 0) bad("top_k", "must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "must be in [0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) bad("repetition_penalty", "must be > 0");
  if (!std::isfinite(presence_penalty) || presence_penalty < -2.0f || presence_penalty > 2.0f)
    bad("presence_penalty", "must be in [-2, 2]");
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2.0f || frequency_penalty > 2.0f)
    bad("frequency_penalty", "must be in [-2, 2]");
  if (max_tokens < 0) bad("max_tokens", "must be >= 0");
  if (min_tokens < 0) bad("min_tokens", "must be >= 0");
  if (min_tokens > max_tokens) bad("min_tokens", "must be at most max_tokens (" + std::to_string(max_tokens) + ")");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) bad("logit_bias", "token id " + std::to_string(id) + " is negative");
    if (!(bias >= -100.0f && bias <= 100.0f))
      bad("logit_bias", "of token " + std::to_string(id) + " must be in [-100, 100]");
  }
}

void TokenHistory::reset(int64_t vocab, const std::vector<int32_t>& prompt) {
  output_length_ = 0;
  all_counts_.assign(vocab, 0);
  output_counts_.assign(vocab, 0);
  touched_.clear();
  for (int32_t t : prompt)
    if (t >= 0 && t < vocab) {
      if (all_counts_[t]++ == 0) touched_.push_back(t);
    }
}

void TokenHistory::push(int32_t t) {
  if (all_counts_[t]++ == 0) touched_.push_back(t);
  ++output_counts_[t];
  ++output_length_;
}

void TokenHistory::pop(int32_t t) {
  --output_length_;
  --output_counts_[t];
  if (--all_counts_[t] == 0) {
    auto it = std::find(touched_.rbegin(), touched_.rend(), t);
    if (it != touched_.rend()) touched_.erase(std::next(it).base());
  }
}

Sampler::Sampler(int64_t vocab, const SamplingParams& params)
    : vocab_(vocab), params_(params), rng_(params.seed), order_(vocab), order_scratch_(vocab) {
  params_.validate();
  for (const auto& entry : params_.logit_bias)
    if (const int32_t id = entry.first; id >= vocab)
      throw Error("sampling: logit_bias: token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(vocab) + " tokens");
}

bool Sampler::has_penalties() const {
  const SamplingParams& p = params_;
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

bool Sampler::adjusts_logits() const {
  const SamplingParams& p = params_;
  return !p.logit_bias.empty() || (p.min_tokens > 0 && !p.stop_token_ids.empty()) || has_penalties();
}

void Sampler::adjust_logits(float* logits, const TokenHistory& h) const {
  const SamplingParams& p = params_;
  for (const auto& [id, bias] : p.logit_bias) logits[id] += bias;
  if (h.output_length() < p.min_tokens)
    for (int32_t id : p.stop_token_ids)
      if (id >= 0 && id < vocab_) logits[id] = -INFINITY;
  if (!has_penalties()) return;
  for (int32_t t : h.touched()) {
    float& l = logits[t];
    if (p.repetition_penalty != 1.0f && h.seen(t)) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    const int32_t c = h.output_count(t);
    if (c > 0) l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
  }
}

int32_t Sampler::argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

void Sampler::softmax_at_temperature(const float* logits, float* probs) const {
  const int64_t V = vocab_;
  // softmax(logits / T) in double for the normalizer, stored as float; exp and the sum vectorized (ops): the
  // library's exp one token at a time took 0.5 ms of a row at a 129k vocabulary.
  const float inv_t = 1.0f / params_.temperature;
  const float lmax = ops::max_value(logits, V);
  const float mx = lmax * inv_t;  // (rounding is monotone: the largest scaled logit is the largest logit scaled)
  double z = 0;
  if (!std::isfinite(mx)) {
    // logits / T overflowed (a tiny T): the scaled maximum is +-inf and the formula below would give nan
    // everywhere. Shifting by the largest logit before scaling cannot overflow: (l - max) / T is <= 0,
    // so the argmax keeps weight exp(0) = 1 and every other token exp(-large) = 0, the limit T -> 0.
    for (int64_t i = 0; i < V; ++i) probs[i] = logits[i] == lmax ? 1.0f : std::exp((logits[i] - lmax) * inv_t);
    for (int64_t i = 0; i < V; ++i) z += probs[i];
  } else {
    z = ops::exp_scaled_sum(logits, V, inv_t, mx, probs);
  }
  for (int64_t i = 0; i < V; ++i) probs[i] = static_cast<float>(probs[i] / z);
}

namespace {
// A probability's bits without the sign: for values >= 0, ordered as the values are.
uint32_t magnitude_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

// Token `id` (< 2^id_bits) of probability p as a key whose ascending order is the cut's: descending p, ties
// by ascending id.
uint64_t order_key(float p, int32_t id, int id_bits) {
  return uint64_t(~magnitude_bits(p) & 0x7fffffffu) << id_bits | uint32_t(id);
}

// Ascending sort of keys[0, n) by bytes, least significant first (scratch: n more), skipping the bytes every
// key shares: a nucleus of tens of thousands of tokens (a flat row under top-p) sorts in a few passes.
void radix_sort(uint64_t* keys, uint64_t* scratch, int64_t n) {
  if (n < 256) {
    std::sort(keys, keys + n);
    return;
  }
  uint64_t differ = 0;  // the bits in which some key differs from the first
  for (int64_t i = 1; i < n; ++i) differ |= keys[i] ^ keys[0];
  uint64_t *from = keys, *to = scratch;
  std::array<uint32_t, 256> count;
  for (int shift = 0; shift < 64 && (differ >> shift) != 0; shift += 8) {
    if (((differ >> shift) & 255) == 0) continue;  // (a byte every key shares: the order stays)
    count.fill(0);
    for (int64_t i = 0; i < n; ++i) ++count[(from[i] >> shift) & 255];
    uint32_t at = 0;
    for (uint32_t& c : count) at += std::exchange(c, at);
    for (int64_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & 255]++] = from[i];
    std::swap(from, to);
  }
  if (from != keys) std::copy(from, from + n, keys);
}
}  // namespace

// The top-k / top-p cut as defined over the whole vocabulary sorted by descending probability (ties by
// ascending id): the first min(top_k, V) tokens, and of those the shortest prefix whose mass (summed in that
// order, in double) reaches top_p, the crossing token kept. Sorting all V tokens cost 17 ms a row at a
// 129k vocabulary; only the head of that order can be kept, so only tokens at or above a threshold are
// sorted: the threshold is lowered one binary exponent of probability at a time until the tokens above it
// hold top_k of them or top_p of the mass, and the prefix rule then runs over them exactly as over the whole
// order (all of them precede every token below the threshold). Should rounding leave the rule undecided
// inside them, the threshold drops further; with every token that has mass in, what follows has none.
void Sampler::truncate_top_k_top_p(float* probs) {
  const int64_t V = vocab_;
  const SamplingParams& p = params_;
  const int64_t limit = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;  // (the prefix rule's bound)
  const int id_bits = std::max(1, int(std::bit_width(uint64_t(V - 1))));
  const uint64_t id_mask = (uint64_t(1) << id_bits) - 1;
  // Per binary exponent of probability (the float's exponent field; 0: subnormals): tokens and their mass.
  std::fill(exponent_count_.begin(), exponent_count_.end(), 0);
  std::fill(exponent_mass_.begin(), exponent_mass_.end(), 0.0f);
  for (int64_t i = 0; i < V; ++i) {
    const uint32_t e = magnitude_bits(probs[i]) >> 23;
    ++exponent_count_[e];
    exponent_mass_[e] += probs[i];
  }
  int64_t count = 0;
  float mass = 0.0f;
  int lowest = 256;  // the candidates' lowest exponent
  while (lowest > 0 && count < limit && mass < p.top_p) {
    --lowest;
    count += exponent_count_[size_t(lowest)];
    mass += exponent_mass_[size_t(lowest)];
  }
  for (;; --lowest) {
    // Candidates: every token with mass whose exponent is >= lowest, in the full order's head.
    const uint32_t floor_bits = lowest > 0 ? uint32_t(lowest) << 23 : 1u;  // (exponent 0: the smallest subnormal)
    int64_t n_cand = 0;
    for (int64_t i = 0; i < V; ++i)
      if (magnitude_bits(probs[i]) >= floor_bits) order_[size_t(n_cand++)] = order_key(probs[i], int32_t(i), id_bits);
    // (past the first `limit` nothing is kept: those are only partitioned off, not sorted)
    const int64_t sorted = std::min(limit, n_cand);
    if (sorted < n_cand) std::nth_element(order_.begin(), order_.begin() + sorted, order_.begin() + n_cand);
    if (p.top_p < 1.0f) radix_sort(order_.data(), order_scratch_.data(), sorted);
    const bool all_with_mass = lowest == 0;
    int64_t keep = -1;  // decided inside the candidates: how many of them are kept
    if (p.top_p < 1.0f) {
      double cum = 0;
      int64_t n = 0;
      for (; n < sorted; ++n) {
        cum += probs[order_[size_t(n)] & id_mask];
        if (cum >= p.top_p) {
          keep = n + 1;
          break;
        }
      }
      if (keep < 0 && (n == limit || all_with_mass)) keep = n;  // (the rule ran to its bound, or only zeros follow)
    } else if (limit <= n_cand || all_with_mass) {
      keep = sorted;
    }
    if (keep < 0) continue;
    for (int64_t i = keep; i < n_cand; ++i) probs[order_[size_t(i)] & id_mask] = 0.0f;
    for (int64_t i = 0; i < V; ++i)
      if (magnitude_bits(probs[i]) < floor_bits) probs[i] = 0.0f;
    return;
  }
}

void Sampler::distribution(const float* logits, float* probs) {
  const int64_t V = vocab_;
  const SamplingParams& p = params_;
  if (p.greedy()) {
    std::fill(probs, probs + V, 0.0f);
    probs[argmax(logits, V)] = 1.0f;
    return;
  }
  softmax_at_temperature(logits, probs);

  if ((p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f) truncate_top_k_top_p(probs);
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * ops::max_value(probs, V);
    for (int64_t i = 0; i < V; ++i)
      if (probs[i] < floor) probs[i] = 0.0f;
  }
  const double s = ops::sum_as_double(probs, V);
  for (int64_t i = 0; i < V; ++i) probs[i] = static_cast<float>(probs[i] / s);
}

float Sampler::uniform() {
  // 24 random bits -> [0, 1) exactly representable in float
  return static_cast<float>(rng_() >> 40) * (1.0f / 16777216.0f);
}

int32_t Sampler::sample(const float* probs) {
  const double u = static_cast<double>(uniform());
  double cum = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < vocab_; ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last >= 0 ? last : 0;  // rounding: the last token with mass
}

}  // namespace nextn
