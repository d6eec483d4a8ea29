// Reading config.json fields the way every family needs them: typed readers whose errors name the file and
// the field, range checks, per-layer lists, token ids, `quantization_config`, and the file itself.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/quant_plan.h"  // QuantConfig

namespace nextn::cfg {

using nlohmann::json;

// Forces a value through memory so that the compiler cannot fuse the multiply that produced it with a
// following add (FMA contraction); the reference rounds every intermediate separately.
template <class T>
T rounded(T x) {
  volatile T v = x;
  return v;
}

[[noreturn]] void fail(const std::string& source, const std::string& msg);
std::string describe(const json& v);  // "type value" (shortened) for messages
const json* find(const json& obj, const std::string& key);

// Typed readers. `name` is the field path used in messages (e.g. "rope_parameters.factor").
int64_t as_int64(const json& v, const std::string& name, const std::string& src);
int as_int(const json& v, const std::string& name, const std::string& src);
double as_double(const json& v, const std::string& name, const std::string& src);
bool as_bool(const json& v, const std::string& name, const std::string& src);
std::string as_string(const json& v, const std::string& name, const std::string& src);
std::vector<std::string> as_string_list(const json& v, const std::string& name, const std::string& src);
std::vector<int64_t> as_int_list(const json& v, const std::string& name, const std::string& src);

// Non-null field readers: absent keeps the default, null or a wrong type is an error.
void read(const json& o, const std::string& k, int64_t& out, const std::string& s);
void read(const json& o, const std::string& k, int& out, const std::string& s);
void read(const json& o, const std::string& k, double& out, const std::string& s);
void read(const json& o, const std::string& k, bool& out, const std::string& s);
void read(const json& o, const std::string& k, std::string& out, const std::string& s);
// Token id: absent keeps the default, null -> -1.
void read_token_id(const json& o, const std::string& k, int64_t& out, const std::string& s);
// eos_token_id: an int or a list; absent keeps the default, null -> empty.
void read_eos_ids(const json& o, const std::string& k, std::vector<int64_t>& out, const std::string& s);
// Every id is an int32 token id (-1 allowed for pad/bos: "none").
void require_token_ids(int64_t pad, int64_t bos, const std::vector<int64_t>& eos, const std::string& src);

void require_positive(int64_t v, const std::string& name, const std::string& src);
void require_at_most(int64_t v, int64_t limit, const std::string& name, const std::string& src);
std::string number_text(double v);
// A float field's meaningful range; `open_low` excludes `lo`. The forward computes in float32, so a value
// must also be finite there (1e300 is finite as a double and infinite as a float).
void require_range(double v, double lo, bool open_low, double hi, const std::string& name, const std::string& src,
                   const std::string& meaning);
void require_float_finite(double v, const std::string& name, const std::string& src);
// Per-layer list: null/absent -> default; otherwise a list of num_layers strings from `allowed` (any
// non-empty string when `allowed` is empty).
void read_layer_list(const json& j, const std::string& key, int num_layers, const std::vector<std::string>& allowed,
                     std::vector<std::string>& out, const std::string& src);

// `quantization_config` into q (untouched when absent or null); sizes at most `size_limit`.
void parse_quant(const json& j, QuantConfig& q, int64_t size_limit, const std::string& src);

json read_json_file(const std::string& path);
std::string config_path(const std::string& model_dir);  // model_dir/config.json
// The "model_type" string of model_dir/config.json (throws Error if unreadable/absent).
std::string read_model_type(const std::string& model_dir);

}  // namespace nextn::cfg
