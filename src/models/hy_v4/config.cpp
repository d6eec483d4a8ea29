#include "models/hy_v4/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace nextn {

using nlohmann::json;

namespace {

// Forces a value through memory so that the compiler cannot fuse the multiply that produced it
// with a following add (FMA contraction); the reference rounds every intermediate separately.
template <class T>
T rounded(T x) {
  volatile T v = x;
  return v;
}

[[noreturn]] void fail(const std::string& source, const std::string& msg) {
  throw Error(source + ": " + msg);
}

std::string describe(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + s;
}

const json* find(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Typed readers. `name` is the field path used in messages (e.g. "rope_parameters.factor").
int64_t as_int64(const json& v, const std::string& name, const std::string& src) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(src, "field '" + name + "' is out of range: " + v.dump());
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  fail(src, "field '" + name + "' must be an integer, got " + describe(v));
}

int as_int(const json& v, const std::string& name, const std::string& src) {
  int64_t x = as_int64(v, name, src);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    fail(src, "field '" + name + "' is out of range: " + v.dump());
  return static_cast<int>(x);
}

double as_double(const json& v, const std::string& name, const std::string& src) {
  if (!v.is_number()) fail(src, "field '" + name + "' must be a number, got " + describe(v));
  return v.get<double>();
}

bool as_bool(const json& v, const std::string& name, const std::string& src) {
  if (!v.is_boolean()) fail(src, "field '" + name + "' must be a boolean, got " + describe(v));
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& name, const std::string& src) {
  if (!v.is_string()) fail(src, "field '" + name + "' must be a string, got " + describe(v));
  return v.get<std::string>();
}

std::vector<std::string> as_string_list(const json& v, const std::string& name, const std::string& src) {
  if (!v.is_array()) fail(src, "field '" + name + "' must be a list of strings, got " + describe(v));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_string(v[i], name + "[" + std::to_string(i) + "]", src));
  return out;
}

// Non-null field readers: absent keeps the default, null or a wrong type is an error.
template <class T, class F>
void read_field(const json& obj, const std::string& key, T& out, F conv, const std::string& src) {
  if (const json* v = find(obj, key)) out = conv(*v, key, src);
}

void read(const json& o, const std::string& k, int64_t& out, const std::string& s) { read_field(o, k, out, as_int64, s); }
void read(const json& o, const std::string& k, int& out, const std::string& s) { read_field(o, k, out, as_int, s); }
void read(const json& o, const std::string& k, double& out, const std::string& s) { read_field(o, k, out, as_double, s); }
void read(const json& o, const std::string& k, bool& out, const std::string& s) { read_field(o, k, out, as_bool, s); }
void read(const json& o, const std::string& k, std::string& out, const std::string& s) { read_field(o, k, out, as_string, s); }

// Token id: absent keeps the default, null -> -1.
void read_token_id(const json& o, const std::string& k, int64_t& out, const std::string& s) {
  if (const json* v = find(o, k)) out = v->is_null() ? -1 : as_int64(*v, k, s);
}

void require_positive(int64_t v, const std::string& name, const std::string& src) {
  if (v <= 0) fail(src, "field '" + name + "' must be positive, got " + std::to_string(v));
}

void require_at_most(int64_t v, int64_t limit, const std::string& name, const std::string& src) {
  if (v > limit)
    fail(src, "field '" + name + "' is " + std::to_string(v) + ", more than nextn supports (" + std::to_string(limit) +
                  ")");
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A float field's meaningful range; `open_low` excludes `lo`. The forward computes in float32, so a value
// must also be finite there (1e300 is finite as a double and infinite as a float).
void require_range(double v, double lo, bool open_low, double hi, const std::string& name, const std::string& src,
                   const std::string& meaning) {
  const bool above_low = open_low ? v > lo : v >= lo;
  if (above_low && v <= hi && std::isfinite(static_cast<float>(v))) return;
  fail(src, "field '" + name + "' is " + number_text(v) + ", outside " + (open_low ? "(" : "[") + number_text(lo) +
                ", " + number_text(hi) + "] (" + meaning + ")");
}

void require_float_finite(double v, const std::string& name, const std::string& src) {
  if (!std::isfinite(static_cast<float>(v)))
    fail(src, "field '" + name + "' is " + number_text(v) + ", not a finite float32");
}

// Per-layer list: null/absent -> default; otherwise a list of num_layers allowed strings.
void read_layer_list(const json& j, const std::string& key, int num_layers,
                     const std::vector<std::string>& allowed, std::vector<std::string>& out,
                     const std::string& src) {
  const json* v = find(j, key);
  if (!v || v->is_null()) return;
  std::vector<std::string> list = as_string_list(*v, key, src);
  if (static_cast<int64_t>(list.size()) != num_layers)
    fail(src, "field '" + key + "' has " + std::to_string(list.size()) + " entries, expected num_hidden_layers = " +
                  std::to_string(num_layers));
  for (size_t i = 0; i < list.size(); ++i) {
    if (allowed.empty()) {
      if (list[i].empty()) fail(src, "field '" + key + "[" + std::to_string(i) + "]' is empty");
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), list[i]) == allowed.end()) {
      std::string opts;
      for (const auto& a : allowed) opts += (opts.empty() ? "" : ", ") + ("'" + a + "'");
      fail(src, "field '" + key + "[" + std::to_string(i) + "]' has unknown value '" + list[i] + "' (expected " +
                    opts + ")");
    }
  }
  out = std::move(list);
}

// YaRN magnitude correction 0.1 * m * ln(s) + 1 (1 for s <= 1), in double like Python.
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

void parse_rope(const json& j, HYV4Config& c, const std::string& src) {
  RopeConfig& r = c.rope;
  r = RopeConfig{};
  r.dim = c.qk_rope_head_dim;

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

  for (const auto& lt : c.layer_types)
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
    // transformers rotates only head_dim * partial_rotary_factor dims; nextn rotates all of qk_rope_head_dim.
    double prf = 1.0;
    if (const json* v = find(dict, "partial_rotary_factor")) prf = as_double(*v, field("partial_rotary_factor"), src);
    else if (const json* t = find(j, "partial_rotary_factor")) prf = as_double(*t, "partial_rotary_factor", src);
    if (prf != 1.0) fail(src, "field 'partial_rotary_factor' != 1 is not supported (got " + number_text(prf) + ")");
  }

  if (r.type == "default") {
    compute_default_inv_freq(r);
    c.attn_scale = std::pow(static_cast<double>(c.qk_head_dim), -0.5);
    return;
  }
  if (r.type != "yarn")
    fail(src, "field '" + field("rope_type") + "': unsupported rope type '" + r.type +
                  "' (nextn supports: default, yarn)");

  // ---- yarn ----

  // Pre-training context: a top-level value has priority, then the dict, then max_position_embeddings.
  r.original_max_position_embeddings = c.max_position_embeddings;
  if (const json* t = find(j, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = as_int64(*t, "original_max_position_embeddings", src);
    require_positive(r.original_max_position_embeddings, "original_max_position_embeddings", src);
    require_at_most(r.original_max_position_embeddings, HYV4Limits::kSize, "original_max_position_embeddings", src);
  } else if (const json* v = find(dict, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = as_int64(*v, field("original_max_position_embeddings"), src);
    require_positive(r.original_max_position_embeddings, field("original_max_position_embeddings"), src);
    require_at_most(r.original_max_position_embeddings, HYV4Limits::kSize, field("original_max_position_embeddings"),
                    src);
  }

  const json* fv = find(dict, "factor");
  if (!fv) fail(src, "field '" + field("factor") + "' is required for yarn rope");
  if (fv->is_null()) {
    r.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(r.original_max_position_embeddings);
  } else {
    r.factor = as_double(*fv, field("factor"), src);
  }
  if (!(r.factor > 0)) fail(src, "field '" + field("factor") + "' must be positive");
  require_float_finite(r.factor, field("factor"), src);
  if (r.factor < 1)  // transformers warns too: yarn stretches the pre-training context by `factor`
    c.warnings.push_back("field '" + field("factor") + "' is " + number_text(r.factor) +
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

  double scale = std::pow(static_cast<double>(c.qk_head_dim), -0.5);
  if (r.mscale_all_dim != 0) {
    const double m = yarn_mscale(r.factor, r.mscale_all_dim);
    scale = scale * m * m;
  }
  c.attn_scale = scale;
}

// Every float field against its meaning in transformers' HYV4 (values that would make the float32 forward
// infinite or NaN, or that mean nothing, are errors).
void validate_floats(HYV4Config& c, const std::string& src) {
  // An RMSNorm of an all-zero row (the MTP layer's embedding at position 0) divides by sqrt(eps).
  require_range(c.rms_norm_eps, 0.0, true, 1.0, "rms_norm_eps", src, "the epsilon of every RMSNorm and LayerNorm");
  require_range(c.hc_eps, 0.0, false, 1.0, "hc_eps", src, "the epsilon added to the hyper-connection gates");
  require_range(c.hc_magnitude, 0.0, true, 100.0, "hc_magnitude", src, "the scale of the hyper-connection post gates");
  require_range(c.routed_scaling_factor, 0.0, true, 100.0, "routed_scaling_factor", src,
                "the scale of the routed experts' weights");
  require_float_finite(c.swiglu_limit, "swiglu_limit", src);
  require_float_finite(c.learnable_sink_init, "learnable_sink_init", src);
  if (c.swiglu_limit < 0)
    c.warnings.push_back("field 'swiglu_limit' is " + number_text(c.swiglu_limit) +
                         ": the routed experts' SwiGLU clamp is off (as in transformers for any value <= 0)");
}

// Sizes: positive (where transformers needs them to be) and within HYV4Limits.
void validate_sizes(const HYV4Config& c, const std::string& src) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.moe_intermediate_size}, {"max_position_embeddings", c.max_position_embeddings},
      {"kv_lora_rank", c.kv_lora_rank}, {"index_topk", c.index_topk}};
  for (const auto& [name, v] : sizes) {
    require_positive(v, name, src);
    require_at_most(v, HYV4Limits::kSize, name, src);
  }
  if (c.q_lora_rank != -1) {
    require_positive(c.q_lora_rank, "q_lora_rank", src);
    require_at_most(c.q_lora_rank, HYV4Limits::kSize, "q_lora_rank", src);
  }
  const std::pair<const char*, int64_t> heads_and_dims[] = {
      {"num_attention_heads", c.num_attention_heads}, {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},       {"v_head_dim", c.v_head_dim},
      {"index_head_dim", c.index_head_dim},           {"index_n_heads", c.index_n_heads}};
  for (const auto& [name, v] : heads_and_dims) {
    require_positive(v, name, src);
    require_at_most(v, HYV4Limits::kHeadCountOrDim, name, src);
  }
  require_positive(c.num_hidden_layers, "num_hidden_layers", src);
  require_at_most(c.num_hidden_layers, HYV4Limits::kLayers, "num_hidden_layers", src);
  require_at_most(c.num_nextn_predict_layers, HYV4Limits::kMtpLayers, "num_nextn_predict_layers", src);
  require_positive(c.n_routed_experts, "n_routed_experts", src);
  require_at_most(c.n_routed_experts, HYV4Limits::kCount, "n_routed_experts", src);
  if (c.n_shared_experts < 0)
    fail(src, "field 'n_shared_experts' must be non-negative, got " + std::to_string(c.n_shared_experts));
  require_at_most(c.n_shared_experts, HYV4Limits::kCount, "n_shared_experts", src);
  require_positive(c.num_experts_per_tok, "num_experts_per_tok", src);
  require_positive(c.n_group, "n_group", src);
  require_at_most(c.n_group, HYV4Limits::kExpertGroups, "n_group", src);
  require_positive(c.topk_group, "topk_group", src);
  require_positive(c.hc_mult, "hc_mult", src);
  require_at_most(c.hc_mult, HYV4Limits::kCount, "hc_mult", src);
  if (c.qk_rope_head_dim % 2 != 0)
    fail(src, "field 'qk_rope_head_dim' must be even, got " + std::to_string(c.qk_rope_head_dim));
  if (c.n_routed_experts % c.n_group != 0)
    fail(src, "field 'n_routed_experts' (" + std::to_string(c.n_routed_experts) + ") must be divisible by 'n_group' (" +
                  std::to_string(c.n_group) + ")");
  if (c.topk_group > c.n_group)
    fail(src, "field 'topk_group' (" + std::to_string(c.topk_group) + ") must not exceed 'n_group' (" +
                  std::to_string(c.n_group) + ")");
  if (c.num_experts_per_tok > c.n_routed_experts)
    fail(src, "field 'num_experts_per_tok' (" + std::to_string(c.num_experts_per_tok) +
                  ") must not exceed 'n_routed_experts' (" + std::to_string(c.n_routed_experts) + ")");
  // Token ids are int32 in the engine; an id that does not fit would be truncated into another token.
  auto token_id = [&](int64_t id, const std::string& name) {
    if (id < -1 || id > std::numeric_limits<int32_t>::max())
      fail(src, "field '" + name + "' is " + std::to_string(id) + ", not a token id");
  };
  token_id(c.pad_token_id, "pad_token_id");
  token_id(c.bos_token_id, "bos_token_id");
  for (int64_t id : c.eos_token_ids) {
    if (id == -1) fail(src, "field 'eos_token_id' holds -1, not a token id");
    token_id(id, "eos_token_id");
  }
}

// The size fields transformers defaults that config.json leaves out (HYV4Config::defaulted).
std::vector<std::string> defaulted_sizes(const json& j) {
  std::vector<std::string> out;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                        "v_head_dim", "index_head_dim", "index_n_heads", "hc_mult", "n_shared_experts"})
    if (!find(j, k)) out.emplace_back(k);
  if (!find(j, "n_routed_experts") && !find(j, "num_local_experts")) out.emplace_back("n_routed_experts");
  return out;
}

void parse_quant(const json& j, HYV4Config& c, const std::string& src) {
  const json* q = find(j, "quantization_config");
  if (!q || q->is_null()) return;
  if (!q->is_object()) fail(src, "field 'quantization_config' must be an object, got " + describe(*q));
  QuantConfig& qc = c.quant;
  qc.present = true;
  qc.raw = *q;
  auto str = [&](const std::string& k, std::string& out) {
    const json* v = find(*q, k);
    if (v && !v->is_null()) out = as_string(*v, "quantization_config." + k, src);
  };
  str("quant_method", qc.quant_method);
  str("fmt", qc.fmt);
  str("activation_scheme", qc.activation_scheme);
  str("scale_fmt", qc.scale_fmt);
  if (const json* v = find(*q, "weight_block_size"); v && !v->is_null()) {
    const std::string name = "quantization_config.weight_block_size";
    if (!v->is_array()) fail(src, "field '" + name + "' must be a list of integers, got " + describe(*v));
    for (size_t i = 0; i < v->size(); ++i) {
      int64_t x = as_int64((*v)[i], name + "[" + std::to_string(i) + "]", src);
      require_positive(x, name + "[" + std::to_string(i) + "]", src);
      require_at_most(x, HYV4Limits::kSize, name + "[" + std::to_string(i) + "]", src);
      qc.weight_block_size.push_back(x);
    }
  }
  for (const char* k : {"ignored_layers", "modules_to_not_convert", "exclude_modules"}) {
    const json* v = find(*q, k);
    if (!v || v->is_null()) continue;
    for (auto& name : as_string_list(*v, std::string("quantization_config.") + k, src))
      if (std::find(qc.ignored_layers.begin(), qc.ignored_layers.end(), name) == qc.ignored_layers.end())
        qc.ignored_layers.push_back(std::move(name));
  }
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": read error");
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond a double (1E1111)
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

std::string config_path(const std::string& model_dir) {
  if (model_dir.empty()) return "config.json";
  return model_dir.back() == '/' ? model_dir + "config.json" : model_dir + "/config.json";
}

}  // namespace

bool HYV4Config::is_sparse_mlp(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(mlp_layer_types.size()))
    throw Error("HYV4Config::is_sparse_mlp: layer " + std::to_string(layer) + " out of range");
  return mlp_layer_types[layer] == "sparse";
}

bool HYV4Config::is_defaulted(const std::string& field) const {
  return std::find(defaulted.begin(), defaulted.end(), field) != defaulted.end();
}

bool HYV4Config::has_own_indexer(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(indexer_types.size()))
    throw Error("HYV4Config::has_own_indexer: layer " + std::to_string(layer) + " out of range");
  return indexer_types[layer] == "full";
}

HYV4Config parse_hy_v4_config(const json& j, const std::string& src) {
  if (!j.is_object()) fail(src, "config must be a JSON object, got " + std::string(j.type_name()));
  {
    const json* mt = find(j, "model_type");
    std::string name = "(missing)";
    if (mt) name = mt->is_string() ? "'" + mt->get<std::string>() + "'" : mt->dump();
    if (!mt || !mt->is_string() || mt->get<std::string>() != "hy_v4")
      fail(src, "unsupported model_type " + name + " (nextn supports: hy_v4)");
  }

  HYV4Config c;
  read(j, "vocab_size", c.vocab_size, src);
  read(j, "hidden_size", c.hidden_size, src);
  read(j, "intermediate_size", c.intermediate_size, src);
  read(j, "moe_intermediate_size", c.moe_intermediate_size, src);
  read(j, "num_hidden_layers", c.num_hidden_layers, src);
  read(j, "num_attention_heads", c.num_attention_heads, src);
  read(j, "num_key_value_heads", c.num_key_value_heads, src);  // type-checked, then overridden
  read(j, "head_dim", c.head_dim, src);                        // type-checked, then overridden
  read(j, "hidden_act", c.hidden_act, src);
  read(j, "max_position_embeddings", c.max_position_embeddings, src);
  read(j, "rms_norm_eps", c.rms_norm_eps, src);
  read_token_id(j, "pad_token_id", c.pad_token_id, src);
  read_token_id(j, "bos_token_id", c.bos_token_id, src);
  if (const json* v = find(j, "eos_token_id")) {
    c.eos_token_ids.clear();
    if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i)
        c.eos_token_ids.push_back(as_int64((*v)[i], "eos_token_id[" + std::to_string(i) + "]", src));
    } else if (!v->is_null()) {
      c.eos_token_ids.push_back(as_int64(*v, "eos_token_id", src));
    }
  }
  read(j, "tie_word_embeddings", c.tie_word_embeddings, src);
  read(j, "attention_bias", c.attention_bias, src);
  if (find(j, "n_routed_experts"))
    read(j, "n_routed_experts", c.n_routed_experts, src);
  else
    read(j, "num_local_experts", c.n_routed_experts, src);
  read(j, "n_shared_experts", c.n_shared_experts, src);
  read(j, "num_experts_per_tok", c.num_experts_per_tok, src);
  read(j, "routed_scaling_factor", c.routed_scaling_factor, src);
  read(j, "norm_topk_prob", c.norm_topk_prob, src);
  read(j, "n_group", c.n_group, src);
  read(j, "topk_group", c.topk_group, src);
  if (const json* v = find(j, "q_lora_rank")) c.q_lora_rank = v->is_null() ? -1 : as_int64(*v, "q_lora_rank", src);
  read(j, "kv_lora_rank", c.kv_lora_rank, src);
  read(j, "qk_nope_head_dim", c.qk_nope_head_dim, src);
  read(j, "qk_rope_head_dim", c.qk_rope_head_dim, src);
  read(j, "v_head_dim", c.v_head_dim, src);
  read(j, "index_topk", c.index_topk, src);
  read(j, "index_head_dim", c.index_head_dim, src);
  read(j, "index_n_heads", c.index_n_heads, src);
  read(j, "hc_mult", c.hc_mult, src);
  read(j, "hc_magnitude", c.hc_magnitude, src);
  read(j, "hc_eps", c.hc_eps, src);
  read(j, "learnable_sink_init", c.learnable_sink_init, src);
  read(j, "swiglu_limit", c.swiglu_limit, src);

  if (const json* v = find(j, "num_nextn_predict_layers"); v && !v->is_null())
    c.num_nextn_predict_layers = as_int(*v, "num_nextn_predict_layers", src);
  else if (const json* m = find(j, "num_mtp_layers"); m && !m->is_null())
    c.num_nextn_predict_layers = as_int(*m, "num_mtp_layers", src);
  if (c.num_nextn_predict_layers < 0)
    fail(src, "field 'num_nextn_predict_layers' must be non-negative, got " + std::to_string(c.num_nextn_predict_layers));
  if (const json* v = find(j, "dtype"); v && !v->is_null())
    c.torch_dtype = as_string(*v, "dtype", src);
  else if (const json* t = find(j, "torch_dtype"); t && !t->is_null())
    c.torch_dtype = as_string(*t, "torch_dtype", src);

  validate_sizes(c, src);
  validate_floats(c, src);
  c.defaulted = defaulted_sizes(j);

  // Derived values.
  c.num_key_value_heads = c.num_attention_heads;
  c.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.head_dim = c.qk_rope_head_dim;

  const int L = c.num_hidden_layers;
  c.mlp_layer_types.assign(L, "sparse");
  c.mlp_layer_types[0] = "dense";
  c.layer_types.assign(L, "deepseek_sparse_attention");
  c.indexer_types.resize(L);
  for (int i = 0; i < L; ++i) c.indexer_types[i] = (i == 0 || (i - 1) % 4 == 0) ? "full" : "shared";
  read_layer_list(j, "mlp_layer_types", L, {"dense", "sparse"}, c.mlp_layer_types, src);
  read_layer_list(j, "layer_types", L, {}, c.layer_types, src);
  read_layer_list(j, "indexer_types", L, {"full", "shared"}, c.indexer_types, src);
  if (c.indexer_types[0] != "full")
    fail(src, "field 'indexer_types[0]' is 'shared' but there is no earlier 'full' indexer layer to share from");

  parse_rope(j, c, src);

  if (const json* v = find(j, "mtp_quant_algo"); v && !v->is_null()) c.mtp_quant_algo = as_string(*v, "mtp_quant_algo", src);
  parse_quant(j, c, src);
  if (c.mtp_quant_algo.empty() && c.quant.present) {
    if (const json* v = find(c.quant.raw, "mtp_quant_algo"); v && !v->is_null())
      c.mtp_quant_algo = as_string(*v, "quantization_config.mtp_quant_algo", src);
  }
  return c;
}

HYV4Config load_hy_v4_config(const std::string& model_dir) {
  const std::string path = config_path(model_dir);
  return parse_hy_v4_config(read_json_file(path), path);
}

std::string read_model_type(const std::string& model_dir) {
  const std::string path = config_path(model_dir);
  json j = read_json_file(path);
  if (!j.is_object()) fail(path, "config must be a JSON object");
  const json* mt = find(j, "model_type");
  if (!mt) fail(path, "missing field 'model_type'");
  return as_string(*mt, "model_type", path);
}

}  // namespace nextn
