#include "serve/chat_template/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "serve/chat_template/jinja_text.h"

namespace nextn::serve::jinja {

void fail(const std::string& message) { throw Failure(message); }

// ---- construction ----------------------------------------------------------------------------------------

Value Value::undefined(std::string reason) {
  Value v;
  v.ptr_ = std::make_shared<std::string>(std::move(reason));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}
Value Value::list(std::vector<Value> items, ListFlavor flavor) {
  Value v;
  v.kind_ = Kind::List;
  v.ptr_ = std::make_shared<ListData>(ListData{std::move(items), flavor});
  return v;
}
Value Value::dict(DictData d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.ptr_ = std::make_shared<DictData>(std::move(d));
  return v;
}
Value Value::new_namespace(DictData attributes) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.ptr_ = std::make_shared<NamespaceData>(NamespaceData{std::move(attributes)});
  return v;
}
Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> call, bool is_macro) {
  Value v;
  v.kind_ = Kind::Callable;
  v.ptr_ = std::make_shared<CallableData>(CallableData{std::move(name), is_macro, std::move(call)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u <= uint64_t(std::numeric_limits<int64_t>::max()) ? integer(int64_t(u)) : number(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      d.entries.reserve(j.size());
      for (const auto& [key, item] : j.items()) d.entries.emplace_back(string(key), from_json(item));
      return dict(std::move(d));
    }
    default: fail("a JSON value of type '" + std::string(j.type_name()) + "' has no template equivalent");
  }
}

std::string Value::undefined_reason() const {
  return ptr_ ? *static_cast<const std::string*>(ptr_.get()) : std::string("value is undefined");
}

// ---- dict ------------------------------------------------------------------------------------------------

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries)
    if (equal(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : entries)
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---- names -----------------------------------------------------------------------------------------------

namespace {
const char* list_type_name(ListFlavor flavor) {
  switch (flavor) {
    case ListFlavor::List: return "list";
    case ListFlavor::Tuple: return "tuple";
    case ListFlavor::DictItems: return "dict_items";
    case ListFlavor::DictKeys: return "dict_keys";
    case ListFlavor::DictValues: return "dict_values";
  }
  return "list";
}
}  // namespace

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return list_type_name(v.as_list().flavor);
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return v.as_callable().is_macro ? "Macro" : "builtin_function_or_method";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::None: return "None";
    case Value::Kind::Undefined: return "jinja2.runtime.Undefined object";
    case Value::Kind::Namespace: return "jinja2.utils.Namespace object";
    case Value::Kind::Callable:
      return v.as_callable().is_macro ? "jinja2.runtime.Macro object" : "builtin_function_or_method object";
    default: return type_name(v) + " object";
  }
}

// ---- truth, printing -------------------------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.as_bool();
    case Value::Kind::Int: return v.as_int() != 0;
    case Value::Kind::Float: return v.as_float() != 0.0;
    case Value::Kind::String: return !v.as_string().empty();
    case Value::Kind::List: return !v.as_list().items.empty();
    case Value::Kind::Dict: return !v.as_dict().entries.empty();
    case Value::Kind::Namespace:
    case Value::Kind::Callable: return true;
  }
  return false;
}

namespace {

std::string list_repr(const ListData& list) {
  std::string out;
  for (size_t i = 0; i < list.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(list.items[i]);
  }
  switch (list.flavor) {
    case ListFlavor::Tuple: return "(" + out + (list.items.size() == 1 ? ",)" : ")");
    case ListFlavor::List: return "[" + out + "]";
    default: return std::string(list_type_name(list.flavor)) + "([" + out + "])";
  }
}

std::string dict_repr(const DictData& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(d.entries[i].first) + ": " + to_repr(d.entries[i].second);
  }
  return out + "}";
}

std::string callable_repr(const CallableData& c) {
  return c.is_macro ? "<Macro '" + c.name + "'>" : "<built-in function " + c.name + ">";
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return text::float_repr(v.as_float());
    case Value::Kind::String: return v.as_string();
    case Value::Kind::List: return list_repr(v.as_list());
    case Value::Kind::Dict: return dict_repr(v.as_dict());
    case Value::Kind::Namespace: return "<Namespace " + dict_repr(v.as_namespace().attributes) + ">";
    case Value::Kind::Callable: return callable_repr(v.as_callable());
  }
  return "";
}

std::string to_repr(const Value& v) {
  if (v.is_string()) return text::python_quote(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return to_str(v);
}

// ---- comparison ------------------------------------------------------------------------------------------

namespace {

// int == float exactly, as Python compares them (not through a rounding conversion of the int).
bool int_equals_float(int64_t i, double f) {
  if (!std::isfinite(f) || f != std::floor(f) || f < -9.3e18 || f > 9.3e18) return false;
  return static_cast<long double>(i) == static_cast<long double>(f);
}

bool numbers_equal(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
  if (a.kind() == Value::Kind::Float && b.kind() == Value::Kind::Float) return a.as_float() == b.as_float();
  return a.kind() == Value::Kind::Float ? int_equals_float(b.as_int(), a.as_float())
                                        : int_equals_float(a.as_int(), b.as_float());
}

bool lists_equal(const ListData& a, const ListData& b) {
  if (a.flavor != b.flavor || a.items.size() != b.items.size()) return false;
  for (size_t i = 0; i < a.items.size(); ++i)
    if (!equal(a.items[i], b.items[i])) return false;
  return true;
}

bool dicts_equal(const DictData& a, const DictData& b) {
  if (a.entries.size() != b.entries.size()) return false;
  for (const auto& [key, value] : a.entries) {
    const Value* other = b.find(key);
    if (!other || !equal(value, *other)) return false;
  }
  return true;
}

const char* op_symbol(CompareOp op) {
  switch (op) {
    case CompareOp::Less: return "<";
    case CompareOp::LessEqual: return "<=";
    case CompareOp::Greater: return ">";
    case CompareOp::GreaterEqual: return ">=";
  }
  return "<";
}

template <typename T>
bool apply(const T& a, const T& b, CompareOp op) {
  switch (op) {
    case CompareOp::Less: return a < b;
    case CompareOp::LessEqual: return a <= b;
    case CompareOp::Greater: return a > b;
    case CompareOp::GreaterEqual: return a >= b;
  }
  return false;
}

bool compare_lists(const ListData& a, const ListData& b, CompareOp op) {
  const size_t n = std::min(a.items.size(), b.items.size());
  for (size_t i = 0; i < n; ++i)
    if (!equal(a.items[i], b.items[i])) return compare(a.items[i], b.items[i], op);
  return apply(a.items.size(), b.items.size(), op);
}

}  // namespace

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return numbers_equal(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::List: return lists_equal(a.as_list(), b.as_list());
    case Value::Kind::Dict: return dicts_equal(a.as_dict(), b.as_dict());
    default: return a.identity() == b.identity();
  }
}

bool compare(const Value& a, const Value& b, CompareOp op) {
  if (a.is_undefined()) fail(a.undefined_reason());
  if (b.is_undefined()) fail(b.undefined_reason());
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return apply(a.as_int(), b.as_int(), op);
    return apply(a.as_float(), b.as_float(), op);
  }
  if (a.is_string() && b.is_string()) return apply(a.as_string(), b.as_string(), op);
  const bool sequences = a.is_list() && b.is_list() && a.as_list().flavor == b.as_list().flavor &&
                         a.as_list().flavor <= ListFlavor::Tuple;
  if (sequences) return compare_lists(a.as_list(), b.as_list(), op);
  fail(std::string("'") + op_symbol(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

// ---- containers ------------------------------------------------------------------------------------------

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(text::code_point_count(v.as_string()));
    case Value::Kind::List: return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.as_dict().entries.size());
    default: fail("object of type '" + type_name(v) + "' has no len()");
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.as_list().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& entry : v.as_dict().entries) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      const std::string& s = v.as_string();
      for (size_t i = 0; i < s.size();) {
        std::string one;
        text::append_utf8(one, text::next_code_point(s, i));
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& element : container.as_list().items)
        if (equal(element, item)) return true;
      return false;
    case Value::Kind::Dict: return container.as_dict().find(item) != nullptr;
    default: fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ---- JSON ------------------------------------------------------------------------------------------------

namespace {

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return text::float_repr(f);
}

std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::String: return key.as_string();
    case Value::Kind::Float: return json_float(key.as_float());
    case Value::Kind::Bool: return key.as_bool() ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Int: return std::to_string(key.as_int());
    default: fail("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

struct JsonWriter {
  const JsonFormat& format;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) {
      if (out.size() + format.indent->size() > format.max_bytes)
        fail("the JSON text is larger than " + std::to_string(format.max_bytes) + " bytes");
      out += *format.indent;
    }
  }

  // Python's json writes "[" / "{", then each item after a separator (and a newline + indent when indenting).
  template <typename Items, typename WriteItem>
  void container(const Items& items, char open, char close, int level, WriteItem write_item) {
    if (items.empty()) {
      out += open;
      out += close;
      return;
    }
    out += open;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += format.item_separator;
      if (format.indent) newline(level + 1);
      write_item(items[i]);
    }
    if (format.indent) newline(level);
    out += close;
  }

  void write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::None: out += "null"; return;
      case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::Int: out += std::to_string(v.as_int()); return;
      case Value::Kind::Float: out += json_float(v.as_float()); return;
      case Value::Kind::String: out += text::json_quote(v.as_string(), format.ensure_ascii); return;
      case Value::Kind::List:
        if (v.as_list().flavor > ListFlavor::Tuple) break;
        container(v.as_list().items, '[', ']', level, [&](const Value& item) { write(item, level + 1); });
        return;
      case Value::Kind::Dict: write_dict(v.as_dict(), level); return;
      default: break;
    }
    fail("Object of type " + type_name(v) + " is not JSON serializable");
  }

  void write_dict(const DictData& d, int level) {
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& entry : d.entries) entries.push_back(&entry);
    if (format.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return less(a->first, b->first); });
    container(entries, '{', '}', level, [&](const std::pair<Value, Value>* entry) {
      out += text::json_quote(json_key(entry->first), format.ensure_ascii);
      out += format.key_separator;
      write(entry->second, level + 1);
    });
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  JsonWriter writer{format, {}};
  writer.write(v, 0);
  return std::move(writer.out);
}

}  // namespace nextn::serve::jinja
