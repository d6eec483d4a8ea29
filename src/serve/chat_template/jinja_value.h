// The values of the Jinja subset (jinja.h), modelled on the Python objects jinja2 works with, because a
// chat template's output depends on Python's rules: None / True print as "None" / "True", 1.0 prints "1.0",
// a list prints as its repr, an empty string or list is false, True == 1, and a missing dict key or variable
// is an "undefined" that prints as nothing but raises when used in arithmetic or looked into.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace nextn::serve::jinja {

class Value;
class Interpreter;

// A template-level failure (Python's TypeError, UndefinedError, raise_exception...). The interpreter adds the
// template's origin and line and rethrows it as nextn::Error.
class Failure : public nextn::Error {
 public:
  explicit Failure(const std::string& message) : nextn::Error(message) {}
};
[[noreturn]] void fail(const std::string& message);

// Arguments of a call: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Lists are immutable once built (transformers renders in jinja2's ImmutableSandboxedEnvironment), so they
// are shared, never copied. A dict's items()/keys()/values() are lists that print as Python's views do.
enum class ListFlavor : uint8_t { List, Tuple, DictItems, DictKeys, DictValues };
struct ListData {
  std::vector<Value> items;
  ListFlavor flavor = ListFlavor::List;
};
// Insertion-ordered, as Python's dict (a chat template's `tools | tojson` must keep the request's key order).
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};
// jinja2's namespace(): the one mutable object a template can make (`{% set ns.x = ... %}`).
struct NamespaceData {
  DictData attributes;
};
struct CallableData {
  std::string name;
  bool is_macro = false;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Value() = default;  // undefined
  static Value undefined(std::string reason);  // `reason` is the error when the value is used
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(std::vector<Value> items, ListFlavor flavor = ListFlavor::List);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), ListFlavor::Tuple); }
  static Value dict(DictData d);
  static Value new_namespace(DictData attributes);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> call, bool is_macro = false);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }  // lists, tuples and dict views
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_number() const { return kind_ == Kind::Bool || kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Bool || kind_ == Kind::Int; }  // Python: bool is an int

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? int64_t{b_} : i_; }  // Bool or Int
  double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }  // numbers
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const ListData& as_list() const { return *static_cast<const ListData*>(ptr_.get()); }
  const DictData& as_dict() const { return *static_cast<const DictData*>(ptr_.get()); }
  NamespaceData& as_namespace() const { return *static_cast<NamespaceData*>(ptr_.get()); }
  const CallableData& as_callable() const { return *static_cast<const CallableData*>(ptr_.get()); }
  // Why this value is undefined (the error raised when it is used).
  std::string undefined_reason() const;
  const void* identity() const { return ptr_.get(); }

 private:
  Kind kind_ = Kind::Undefined;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> ptr_;  // the string / list / dict / namespace / callable / undefined reason
};

// Python's type(x).__name__ ("NoneType", "str", "dict", "Undefined", ...).
std::string type_name(const Value& v);
// jinja2's object_type_repr, in "'dict object' has no attribute 'x'" ("dict object", "None").
std::string object_type_repr(const Value& v);
// bool(x).
bool truthy(const Value& v);
// str(x): what {{ x }} prints. Undefined prints as "".
std::string to_str(const Value& v);
// repr(x): how x prints inside a printed list or dict.
std::string to_repr(const Value& v);
// x == y, Python's rules (1 == 1.0 == True; a list never equals a tuple; undefined equals undefined only).
bool equal(const Value& a, const Value& b);
// Python's x < y (<=, >, >=); a TypeError for incomparable types, an undefined operand raises its reason.
enum class CompareOp { Less, LessEqual, Greater, GreaterEqual };
bool compare(const Value& a, const Value& b, CompareOp op);
inline bool less(const Value& a, const Value& b) { return compare(a, b, CompareOp::Less); }
// len(x): strings in code points; undefined is 0.
int64_t length(const Value& v);
// The items `for x in v` visits (a dict's keys, a string's characters; undefined: none).
std::vector<Value> iterate(const Value& v);
// x in container.
bool contains(const Value& container, const Value& item);
// json.dumps(x, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as transformers' tojson calls it.
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // absent: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // the output may not grow past this (a huge indent times many items)
};
std::string to_json(const Value& v, const JsonFormat& format);

}  // namespace nextn::serve::jinja
