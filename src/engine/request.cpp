#include "engine/request.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "core/error.h"
#include "ops/ops.h"

namespace nextn {

// The alternatives are picked in one pass, each token compared with the n-th best so far (no [V] index and
// sort: half a megabyte and 0.2 ms a token at a 129k vocabulary).
TokenLogprob token_logprob(const float* logits, int64_t V, int32_t token, int top_n) {
  const float mx = ops::max_value(logits, V);
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += std::exp(double(logits[i]) - mx);
  const float lz = static_cast<float>(std::log(z)) + mx;
  TokenLogprob lp{token, logits[token] - lz, {}};
  const size_t n = size_t(std::clamp<int64_t>(top_n, 0, V));
  if (n == 0) return lp;
  std::vector<std::pair<int32_t, float>>& top = lp.top;  // (id, logit) in order, then logprobs
  top.reserve(n);
  float worst = -INFINITY;  // the n-th best logit once n are in
  for (int64_t i = 0; i < V; ++i) {
    const float l = logits[i];
    if (top.size() == n && !(l > worst)) continue;  // (ties go to the lower id, already in)
    if (top.size() == n) top.pop_back();
    auto at = top.end();
    while (at != top.begin() && !(std::prev(at)->second >= l)) --at;
    top.insert(at, {int32_t(i), l});
    if (top.size() == n) worst = top.back().second;
  }
  for (auto& [id, v] : top) v -= lz;
  return lp;
}

void SpecOptions::validate() const {
  if (num_speculative_tokens < 1 || num_speculative_tokens > 8)
    throw Error("speculative: num_speculative_tokens must be in 1..8, got " + std::to_string(num_speculative_tokens));
  if (relaxed && (relaxed_top_n < 1 || !(relaxed_delta >= 0.0f)))
    throw Error("speculative: relaxed acceptance needs top_n >= 1 and delta >= 0");
  if (adaptive && (adaptive_window < 1 || adaptive_probe_interval < 1 || !(adaptive_threshold >= 0.0f)))
    throw Error("speculative: adaptive needs window >= 1, probe interval >= 1, threshold >= 0");
  if (adaptive && tune_k) throw Error("speculative: choose either adaptive k or tuned k, not both");
}

std::string SpecStats::rounds_at_k_text() const {
  std::string out;
  for (size_t k = 0; k < rounds_at_k.size(); ++k) {
    out += ' ';
    out += std::to_string(k);
    out += ':';
    out += std::to_string(rounds_at_k[k]);
  }
  return out;
}

SpecStats::DecodeShares SpecStats::decode_shares() const {
  if (!(decode_seconds > 0)) return {0, 0, 0, 0};
  const double d = decode_seconds;
  return {verify_seconds / d, catch_up_seconds / d, draft_seconds / d,
          (d - verify_seconds - catch_up_seconds - draft_seconds) / d};
}

std::string SpecStats::round_split_text() const {
  const DecodeShares s = decode_shares();
  char buf[160];
  std::snprintf(buf, sizeof buf, "verify %.1f%%, MTP catch-up %.1f%%, draft steps %.1f%%, other %.1f%%",
                100 * s.verify, 100 * s.catch_up, 100 * s.draft, 100 * s.other);
  return buf;
}

double SpecStats::mean_acceptance_length() const {
  return num_drafts ? 1.0 + double(num_accepted_tokens) / double(num_drafts) : 1.0;
}

std::vector<double> SpecStats::per_position_acceptance() const {
  std::vector<double> r;
  for (int64_t a : accepted_per_position) r.push_back(num_drafts ? double(a) / double(num_drafts) : 0.0);
  return r;
}

double SpecStats::tokens_per_second() const {
  // decode speed: tokens after the first (which prefill produces) over the time after it
  return decode_seconds > 0 && num_generated > 1 ? double(num_generated - 1) / decode_seconds : 0.0;
}

std::string broken_drafts_warning(int64_t draft_tokens, int64_t accepted_tokens) {
  if (draft_tokens < kBrokenDraftsMinTokens || accepted_tokens * 100 >= draft_tokens) return "";
  char buf[480];
  std::snprintf(buf, sizeof buf,
                "nextn: warning: the MTP layers' drafts were accepted %lld of %lld times (%.1f%%): their weights look "
                "untrained, missing or misread (a checkpoint exported without its trained MTP layers?), and "
                "speculation cannot pay with them; the output is the target's either way. `nextn inspect` lists "
                "the MTP tensors it loaded, `nextn logits --draft` gives MTP layer 0's logits to compare with "
                "transformers', --no-speculate decodes without drafts",
                (long long)accepted_tokens, (long long)draft_tokens,
                100.0 * double(accepted_tokens) / double(draft_tokens));
  return buf;
}

void SpecStats::add_round(int drafted, int accepted) {
  ++num_drafts;
  num_draft_tokens += drafted;
  num_accepted_tokens += accepted;
  if (accepted_per_position.size() < size_t(drafted)) accepted_per_position.resize(drafted, 0);
  for (int i = 0; i < accepted; ++i) ++accepted_per_position[i];
}

}  // namespace nextn
