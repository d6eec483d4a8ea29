// HY V4's MoE router decisions, shared by every backend (they are host code: a handful of floats a token).
#pragma once
#include <cstdint>

namespace nextn {

struct HYV4Config;
struct FfnWeights;

// For each of S tokens, from its router logits [S, E]: sigmoid scores; the correction bias steers the choice
// only; group-limited top-k (the best topk_group groups by their two best experts' biased scores, then the k
// best experts inside them). ids [S, k] in ascending expert id, weights [S, k] the chosen experts' scores,
// normalized when norm_topk_prob and times routed_scaling_factor.
void route_tokens(const HYV4Config& c, const FfnWeights& F, const float* logits, int64_t S, int32_t* ids,
                  float* weights);

}  // namespace nextn
