// PLE's hashed n-gram ids, shared by the backends: the rows of the n-gram table that one position of a token
// history selects (one per n-gram head), as transformers' Qwen4-Exp hashes them.
#pragma once
#include <algorithm>
#include <cstdint>

#include "models/qwen4_exp/config.h"
#include "models/qwen4_exp/model.h"

namespace nextn {

// ids[head] for the (n - 1) · heads_per_ngram heads at position `pos`; token(t) is the history's token at t.
// The n-gram resets at the start and at an eos: a token s back that crosses either is eos.
template <class TokenAt>
void ple_ngram_ids(const Qwen4ExpConfig& c, const PleWeights& p, int64_t pos, TokenAt token, int64_t* ids) {
  const int n = c.ngram_size, hpn = c.heads_per_ngram;
  const int64_t eos = c.eos_id();
  int64_t shifted[Qwen4ExpLimits::kNgram];
  shifted[0] = token(pos);
  for (int sh = 1; sh < n; ++sh) {
    const int64_t src = pos - sh;
    bool valid = src >= 0;
    for (int64_t t = std::max<int64_t>(src, 0); valid && t < pos; ++t) valid = token(t) != eos;
    shifted[sh] = valid ? token(src) : eos;
  }
  for (int g = 2; g <= n; ++g) {
    int64_t mixed = shifted[0] * p.multipliers[0];
    for (int s = 1; s < g; ++s) mixed ^= shifted[s] * p.multipliers[s];
    for (int hh = 0; hh < hpn; ++hh) {
      const int head = (g - 2) * hpn + hh;
      ids[head] = mixed % p.head_sizes[head] + p.head_offsets[head];
    }
  }
}

}  // namespace nextn
