#include "models/hy_v4/routing.h"

#include <cmath>

#include "core/error.h"
#include "models/hy_v4/model.h"
#include "ops/ops.h"

namespace nextn {

void route_tokens(const HYV4Config& c, const FfnWeights& F, const float* logits, int64_t S, int32_t* ids,
                  float* weights) {
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, G = c.n_group, per = E / G;
  if (E > 1024) throw Error("n_routed_experts > 1024 is not supported");
  if (G > 256) throw Error("n_group > 256 is not supported");
  for (int64_t s = 0; s < S; ++s) {
    const float* logit = logits + s * E;
    float scores[1024], choice[1024];
    for (int64_t e = 0; e < E; ++e) {
      scores[e] = ops::sigmoid(logit[e]);
      choice[e] = scores[e] + F.e_bias[e];
    }
    if (G > 1) {
      float gscore[256];
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          if (choice[e] > b1) { b2 = b1; b1 = choice[e]; } else if (choice[e] > b2) b2 = choice[e];
        }
        gscore[g] = b1 + (per > 1 ? b2 : 0.0f);
      }
      int32_t keep[256];
      float tmp[256];
      const int64_t nk = ops::topk_ascending(gscore, G, c.topk_group, keep, tmp);
      bool kept[256] = {};
      for (int64_t i = 0; i < nk; ++i) kept[keep[i]] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!kept[e / per]) choice[e] = -INFINITY;
    }
    int32_t idx[1024];
    float tmp[1024];
    ops::topk_ascending(choice, E, k, idx, tmp);
    float* w = weights + s * k;
    int32_t* id = ids + s * k;
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      id[i] = idx[i];
      w[i] = scores[idx[i]];
      sum += w[i];
    }
    for (int64_t i = 0; i < k; ++i) {
      if (c.norm_topk_prob) w[i] = w[i] / (sum + 1e-20f);
      w[i] = w[i] * static_cast<float>(c.routed_scaling_factor);
    }
  }
}

}  // namespace nextn
