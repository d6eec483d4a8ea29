#include "models/common/config_json.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace nextn::cfg {

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

void parse_quant(const json& j, QuantConfig& qc, int64_t size_limit, const std::string& src) {
  const json* q = find(j, "quantization_config");
  if (!q || q->is_null()) return;
  if (!q->is_object()) fail(src, "field 'quantization_config' must be an object, got " + describe(*q));
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
      require_at_most(x, size_limit, name + "[" + std::to_string(i) + "]", src);
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

std::vector<int64_t> as_int_list(const json& v, const std::string& name, const std::string& src) {
  if (!v.is_array()) fail(src, "field '" + name + "' must be a list of integers, got " + describe(v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_int64(v[i], name + "[" + std::to_string(i) + "]", src));
  return out;
}

void read_eos_ids(const json& o, const std::string& k, std::vector<int64_t>& out, const std::string& s) {
  const json* v = find(o, k);
  if (!v) return;
  out.clear();
  if (v->is_array())
    out = as_int_list(*v, k, s);
  else if (!v->is_null())
    out.push_back(as_int64(*v, k, s));
}

void require_token_ids(int64_t pad, int64_t bos, const std::vector<int64_t>& eos, const std::string& src) {
  // Token ids are int32 in the engine; an id that does not fit would be truncated into another token.
  auto token_id = [&](int64_t id, const std::string& name) {
    if (id < -1 || id > std::numeric_limits<int32_t>::max())
      fail(src, "field '" + name + "' is " + std::to_string(id) + ", not a token id");
  };
  token_id(pad, "pad_token_id");
  token_id(bos, "bos_token_id");
  for (int64_t id : eos) {
    if (id == -1) fail(src, "field 'eos_token_id' holds -1, not a token id");
    token_id(id, "eos_token_id");
  }
}

std::string read_model_type(const std::string& model_dir) {
  const std::string path = config_path(model_dir);
  json j = read_json_file(path);
  if (!j.is_object()) fail(path, "config must be a JSON object");
  const json* mt = find(j, "model_type");
  if (!mt) fail(path, "missing field 'model_type'");
  return as_string(*mt, "model_type", path);
}

}  // namespace nextn::cfg
