// Rotary position embeddings as transformers configures them: `rope_parameters` (or legacy `rope_scaling` +
// `rope_theta`) resolved into the inverse frequencies and the cos/sin factor, for the default and yarn
// types, computed in float32 the way the reference computes them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nextn {

struct RopeConfig {
  std::string type = "default";  // "default" or "yarn"; any other type is rejected
  double theta = 10000.0;
  double factor = 1.0;            // yarn: resolved (null -> max_position_embeddings / original)
  double attention_factor = 1.0;  // multiplier applied to cos/sin
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;
  int64_t original_max_position_embeddings = 0;  // yarn only (0 for default)
  bool truncate = true;
  double partial_rotary_factor = 1.0;
  int dim = 0;                  // rotary dims (even)
  std::vector<float> inv_freq;  // dim/2 entries, float32 as transformers computes them
  // yarn with mscale_all_dim: the softmax scale's extra factor mscale(factor, mscale_all_dim)^2 (DeepSeek-style
  // MLA models apply it; 1 otherwise).
  double softmax_scale_factor = 1.0;
};

// What a family's RoPE looks like: either a fixed rotary width (partial_rotary_factor must then be 1), or
// `head_dim` whose first int(head_dim * partial_rotary_factor) dims rotate.
struct RopeRequest {
  int fixed_dim = 0;
  int head_dim = 0;
  int64_t max_position_embeddings = 0;
  int64_t size_limit = 0;                              // largest original_max_position_embeddings
  const std::vector<std::string>* layer_types = nullptr;  // refused as per-layer-type keys of the dict
};

// Parses the rope fields of config object j; warnings get the accepted-but-odd values.
RopeConfig parse_rope(const nlohmann::json& j, const RopeRequest& req, std::vector<std::string>& warnings,
                      const std::string& src);

}  // namespace nextn
