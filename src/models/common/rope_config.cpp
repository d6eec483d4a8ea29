#include "models/common/rope_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "models/common/config_json.h"

namespace nextn {

using namespace cfg;

namespace {

double yarn_mscale(double scale, double m) {
  if (scale <= 1) return 1.0;
  return rounded(0.1 * m * std::log(scale)) + 1.0;
}

// Exponent 2i/dim and theta^(2i/dim), both in float32 (theta is first narrowed to float32).
float rope_pos_freq(float theta_f, int i, int dim) {
  float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
  // The double-precision power rounded once to float is the correctly rounded float32 power.
  return static_cast<float>(std::pow(static_cast<double>(theta_f), static_cast<double>(expo)));
}

void compute_default_inv_freq(RopeConfig& r) {
  const float theta_f = static_cast<float>(r.theta);
  r.inv_freq.resize(r.dim / 2);
  for (int i = 0; i < r.dim / 2; ++i) r.inv_freq[i] = 1.0f / rope_pos_freq(theta_f, i, r.dim);
}

// Dimension index at which the wavelength completes `rotations` turns over `max_pos` positions.
double correction_dim(double rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
}

void compute_yarn_inv_freq(RopeConfig& r) {
  const int dim = r.dim;
  const double max_pos = static_cast<double>(r.original_max_position_embeddings);
  double low = correction_dim(r.beta_fast, dim, r.theta, max_pos);
  double high = correction_dim(r.beta_slow, dim, r.theta, max_pos);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  const float low_f = static_cast<float>(low);
  const float width_f = static_cast<float>(high - low);
  const float theta_f = static_cast<float>(r.theta);
  const float factor_f = static_cast<float>(r.factor);

  r.inv_freq.resize(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float pos = rope_pos_freq(theta_f, i, dim);
    const float extrapolation = 1.0f / pos;
    const float interpolation = 1.0f / rounded(factor_f * pos);
    float ramp = (static_cast<float>(i) - low_f) / width_f;
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float interpolation_weight = 1.0f - extrapolation_weight;
    r.inv_freq[i] = rounded(interpolation * interpolation_weight) + rounded(extrapolation * extrapolation_weight);
  }
}

}  // namespace

RopeConfig parse_rope(const json& j, const RopeRequest& req, std::vector<std::string>& warnings,
                      const std::string& src) {
  RopeConfig r;
  r.dim = req.fixed_dim;

  // Legacy `rope_scaling` wins when it is a non-empty dict, else `rope_parameters`.
  const json* scaling = find(j, "rope_scaling");
  const json* params = find(j, "rope_parameters");
  if (scaling && !scaling->is_null() && !scaling->is_object())
    fail(src, "field 'rope_scaling' must be an object or null, got " + describe(*scaling));
  if (params && !params->is_null() && !params->is_object())
    fail(src, "field 'rope_parameters' must be an object or null, got " + describe(*params));
  json dict = json::object();
  std::string dname = "rope_parameters";
  if (scaling && scaling->is_object() && !scaling->empty()) {
    dict = *scaling;
    dname = "rope_scaling";
  } else if (params && params->is_object()) {
    dict = *params;
  }
  auto field = [&](const std::string& k) { return dname + "." + k; };

  if (req.layer_types)
    for (const auto& lt : *req.layer_types)
      if (dict.contains(lt))
        fail(src, "field '" + dname + "' holds per-layer-type parameters ('" + lt + "'), which nextn does not support");

  // rope_theta: the dict's own value, else top-level rope_theta, else 10000.
  std::string theta_field = field("rope_theta");
  if (const json* v = find(dict, "rope_theta")) {
    r.theta = as_double(*v, theta_field, src);
  } else if (const json* t = find(j, "rope_theta")) {
    theta_field = "rope_theta";
    r.theta = as_double(*t, theta_field, src);
  }
  if (!(r.theta > 0)) fail(src, "field '" + theta_field + "' must be positive");
  // theta^(-2i/dim) must fall from 1 (theta <= 1 has no meaning; theta -> 0 divides by zero in float32).
  require_range(r.theta, 1.0, true, std::numeric_limits<float>::max(), theta_field, src, "the RoPE base wavelength");

  if (const json* v = find(dict, "rope_type")) {
    r.type = as_string(*v, field("rope_type"), src);
  } else if (const json* t = find(dict, "type")) {
    r.type = as_string(*t, field("type"), src);
  }
  {
    // transformers rotates the first int(head_dim * partial_rotary_factor) dims of a head.
    double prf = 1.0;
    std::string prf_field = "partial_rotary_factor";
    if (const json* v = find(dict, "partial_rotary_factor")) {
      prf_field = field("partial_rotary_factor");
      prf = as_double(*v, prf_field, src);
    } else if (const json* t = find(j, "partial_rotary_factor")) {
      prf = as_double(*t, prf_field, src);
    }
    r.partial_rotary_factor = prf;
    if (req.head_dim > 0) {
      require_range(prf, 0.0, true, 1.0, prf_field, src, "the share of each head's dims that RoPE rotates");
      r.dim = static_cast<int>(req.head_dim * prf);  // Python's int(): truncation
      if (r.dim < 2 || r.dim % 2 != 0)
        fail(src, "field '" + prf_field + "' (" + number_text(prf) + ") rotates " + std::to_string(r.dim) +
                      " dims of head_dim " + std::to_string(req.head_dim) + ": nextn needs an even count >= 2");
    } else if (prf != 1.0) {
      fail(src, "field 'partial_rotary_factor' != 1 is not supported (got " + number_text(prf) + ")");
    }
  }

  if (r.type == "default") {
    compute_default_inv_freq(r);
    return r;
  }
  if (r.type != "yarn")
    fail(src, "field '" + field("rope_type") + "': unsupported rope type '" + r.type +
                  "' (nextn supports: default, yarn)");

  // ---- yarn ----

  // Pre-training context: a top-level value has priority, then the dict, then max_position_embeddings.
  r.original_max_position_embeddings = req.max_position_embeddings;
  if (const json* t = find(j, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = as_int64(*t, "original_max_position_embeddings", src);
    require_positive(r.original_max_position_embeddings, "original_max_position_embeddings", src);
    require_at_most(r.original_max_position_embeddings, req.size_limit, "original_max_position_embeddings", src);
  } else if (const json* v = find(dict, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = as_int64(*v, field("original_max_position_embeddings"), src);
    require_positive(r.original_max_position_embeddings, field("original_max_position_embeddings"), src);
    require_at_most(r.original_max_position_embeddings, req.size_limit, field("original_max_position_embeddings"),
                    src);
  }

  const json* fv = find(dict, "factor");
  if (!fv) fail(src, "field '" + field("factor") + "' is required for yarn rope");
  if (fv->is_null()) {
    r.factor = static_cast<double>(req.max_position_embeddings) / static_cast<double>(r.original_max_position_embeddings);
  } else {
    r.factor = as_double(*fv, field("factor"), src);
  }
  if (!(r.factor > 0)) fail(src, "field '" + field("factor") + "' must be positive");
  require_float_finite(r.factor, field("factor"), src);
  if (r.factor < 1)  // transformers warns too: yarn stretches the pre-training context by `factor`
    warnings.push_back("field '" + field("factor") + "' is " + number_text(r.factor) +
                         " < 1: yarn then shortens the context it was trained for");

  auto optional_number = [&](const std::string& k, double& out) {
    const json* v = find(dict, k);
    if (!v || v->is_null()) return false;
    out = as_double(*v, field(k), src);
    return true;
  };
  optional_number("mscale", r.mscale);
  optional_number("mscale_all_dim", r.mscale_all_dim);
  // Zero / null mean "use the default" for the betas (the reference uses a truthiness test).
  double b = 0;
  if (optional_number("beta_fast", b) && b != 0) r.beta_fast = b;
  b = 0;
  if (optional_number("beta_slow", b) && b != 0) r.beta_slow = b;
  if (const json* v = find(dict, "truncate")) r.truncate = v->is_null() ? false : as_bool(*v, field("truncate"), src);
  // The ramp between the betas' correction dims takes log(rotations): they must be positive, fast above slow.
  require_range(r.beta_fast, 0.0, true, 1e6, field("beta_fast"), src, "rotations at the fast end of the yarn ramp");
  require_range(r.beta_slow, 0.0, true, 1e6, field("beta_slow"), src, "rotations at the slow end of the yarn ramp");
  if (r.beta_fast < r.beta_slow)
    fail(src, "field '" + field("beta_fast") + "' (" + number_text(r.beta_fast) + ") is below '" + field("beta_slow") +
                  "' (" + number_text(r.beta_slow) + "): the yarn ramp would run backwards");
  require_range(r.mscale, 0.0, false, 100.0, field("mscale"), src, "yarn's magnitude correction coefficient");
  require_range(r.mscale_all_dim, 0.0, false, 100.0, field("mscale_all_dim"), src,
                "yarn's magnitude correction coefficient");

  double af = 0;
  if (optional_number("attention_factor", af)) {
    r.attention_factor = af;
  } else if (r.mscale != 0 && r.mscale_all_dim != 0) {
    r.attention_factor = yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim);
  } else {
    r.attention_factor = yarn_mscale(r.factor, 1.0);
  }

  // cos and sin are multiplied by it (on queries and keys): zero, a sign flip or an overflow has no meaning.
  require_range(r.attention_factor, 0.0, true, 100.0, field("attention_factor"), src,
                "yarn's scale of cos and sin, explicit or from mscale / mscale_all_dim");

  compute_yarn_inv_freq(r);

  if (r.mscale_all_dim != 0) {
    const double m = yarn_mscale(r.factor, r.mscale_all_dim);
    r.softmax_scale_factor = m * m;
  }
  return r;
}

// Every float field against its meaning in transformers' HYV4 (values that would make the float32 forward
// infinite or NaN, or that mean nothing, are errors).

}  // namespace nextn
