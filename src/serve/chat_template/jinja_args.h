// Binding a builtin's call arguments to its parameters, the way Python binds them (positional in order, then
// keywords by name, defaults for the rest), with Python's error messages. Internal to the Jinja subset.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "serve/chat_template/jinja_value.h"

namespace nextn::serve::jinja {

struct Param {
  std::string_view name;
  Value default_value;  // ignored when required
  bool required = false;
};

inline Param required(std::string_view name) { return Param{name, Value(), true}; }

inline std::vector<Value> bind(const CallArgs& args, std::string_view function, std::initializer_list<Param> params) {
  const std::string fn(function);
  if (args.positional.size() > params.size())
    fail(fn + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
         std::to_string(args.positional.size()) + " given)");
  std::vector<Value> values(params.size());
  std::vector<bool> given(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    values[i] = args.positional[i];
    given[i] = true;
  }
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const Param& p : params) {
      if (p.name == key) break;
      ++i;
    }
    if (i == params.size()) fail(fn + "() got an unexpected keyword argument '" + key + "'");
    if (given[i]) fail(fn + "() got multiple values for argument '" + key + "'");
    values[i] = value;
    given[i] = true;
  }
  size_t i = 0;
  for (const Param& p : params) {
    if (!given[i]) {
      if (p.required) fail(fn + "() missing required argument '" + std::string(p.name) + "'");
      values[i] = p.default_value;
    }
    ++i;
  }
  return values;
}

// An argument that must be an integer (bool counts, as in Python).
inline int64_t integer_argument(const Value& v, std::string_view what) {
  if (v.is_undefined()) fail(v.undefined_reason());
  if (!v.is_integral()) fail("'" + type_name(v) + "' object cannot be interpreted as an integer (" + std::string(what) + ")");
  return v.as_int();
}

}  // namespace nextn::serve::jinja
