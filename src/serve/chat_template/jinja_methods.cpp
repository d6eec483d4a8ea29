// Attribute and item access, slicing, and the Python methods templates call on strings, dicts and lists
// (`message.content.split('</think>')[-1].lstrip('\n')`), with jinja2's sandbox rules: a missing attribute is
// an undefined that explains itself, and methods that would mutate a list or dict are refused.
#include <algorithm>
#include <limits>

#include "serve/chat_template/jinja_args.h"
#include "serve/chat_template/jinja_builtins.h"
#include "serve/chat_template/jinja_eval.h"
#include "serve/chat_template/jinja_text.h"

namespace nextn::serve::jinja {
namespace {

constexpr std::string_view kStringMethods[] = {
    "startswith", "endswith", "split",   "rsplit",  "strip",   "lstrip",  "rstrip",  "upper",   "lower",
    "title",      "capitalize", "replace", "find",  "rfind",   "index",   "rindex",  "count",   "join",
    "splitlines", "isspace",  "isdigit", "isalpha", "isalnum", "islower", "isupper"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr std::string_view kListMethods[] = {"count", "index"};
// Methods that would change a list or dict: jinja2's ImmutableSandboxedEnvironment refuses them.
constexpr std::string_view kMutatingListMethods[] = {"append", "extend", "insert", "remove", "sort", "reverse"};
// The sandbox lets these two through; our lists are shared and never change, so the subset has neither.
constexpr std::string_view kUnsupportedListMethods[] = {"pop", "clear"};
constexpr std::string_view kMutatingDictMethods[] = {"pop", "popitem", "update", "setdefault", "clear"};

template <size_t N>
bool in(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool is_plain_sequence(const Value& v) { return v.is_list() && v.as_list().flavor <= ListFlavor::Tuple; }

Value no_attribute(const Value& object, const std::string& name) {
  return Value::undefined(text::python_quote(object_type_repr(object)) + " has no attribute " + text::python_quote(name));
}

Value no_element(const Value& object, const Value& key) {
  return Value::undefined(object_type_repr(object) + " has no element " + to_repr(key));
}

Value unsafe(const Value& object, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(object) + "' object is unsafe.");
}

// `x.method` without a call: a callable that calls the method.
Value bound_method(const Value& object, const std::string& name) {
  return Value::callable(name, [object, name](Interpreter& interp, CallArgs& args) {
    return *call_method(interp, object, name, args);
  });
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::string(std::move(part)));
  return Value::list(std::move(items));
}

std::optional<std::string> optional_string(const Value& v, const std::string& method) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_string()) fail(method + " arg must be None or str");
  return v.as_string();
}

const std::string& string_argument(const Value& v, const std::string& method, int position) {
  if (!v.is_string())
    fail(method + "() argument " + std::to_string(position) + " must be str, not " + type_name(v));
  return v.as_string();
}

// str.startswith / endswith: a prefix or a tuple of them, optionally within s[start:end].
Value affix_test(const Value& object, const std::string& method, CallArgs& args) {
  const std::vector<Value> a = bind(args, method, {required("prefix"), {"start", Value::none()}, {"end", Value::none()}});
  const Value scope = a[1].is_none() && a[2].is_none() ? object : get_slice(object, a[1], a[2], Value::none());
  const std::string& s = scope.as_string();
  auto matches = [&](const Value& affix) {
    if (!affix.is_string())
      fail(method + " first arg must be str or a tuple of str, not " + type_name(affix));
    const std::string& t = affix.as_string();
    if (t.size() > s.size()) return false;
    return method == "startswith" ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (a[0].is_list() && a[0].as_list().flavor == ListFlavor::Tuple)
    return Value::boolean(std::any_of(a[0].as_list().items.begin(), a[0].as_list().items.end(), matches));
  return Value::boolean(matches(a[0]));
}

Value split_method(const std::string& s, const std::string& method, CallArgs& args) {
  const std::vector<Value> a = bind(args, method, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}});
  const std::optional<std::string> sep = optional_string(a[0], method);
  if (sep && sep->empty()) fail("empty separator");
  const int64_t max_split = integer_argument(a[1], "maxsplit");
  return string_list(method == "split" ? text::split(s, sep, max_split) : text::rsplit(s, sep, max_split));
}

Value strip_method(const std::string& s, const std::string& method, CallArgs& args) {
  const std::vector<Value> a = bind(args, method, {{"chars", Value::none()}});
  const std::optional<std::string> chars = optional_string(a[0], method);
  return Value::string(text::strip(s, chars, method != "rstrip", method != "lstrip"));
}

Value join_method(Interpreter& interp, const std::string& separator, CallArgs& args) {
  const std::vector<Value> a = bind(args, "join", {required("iterable")});
  const std::vector<Value> items = iterate(a[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string())
      fail("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) + " found");
    if (i) out += separator;
    out += items[i].as_string();
    interp.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value search_method(const std::string& s, const std::string& method, CallArgs& args) {
  const std::vector<Value> a = bind(args, method, {required("sub")});
  const std::string& sub = string_argument(a[0], method, 1);
  if (method == "count") return Value::integer(text::count(s, sub));
  const bool from_right = method == "rfind" || method == "rindex";
  const int64_t at = from_right ? text::rfind(s, sub) : text::find(s, sub);
  if (at < 0 && (method == "index" || method == "rindex")) fail("substring not found");
  return Value::integer(at);
}

Value predicate_method(const std::string& s, const std::string& method, CallArgs& args) {
  bind(args, method, {});
  if (method == "isspace") return Value::boolean(text::is_all_space(s));
  if (method == "isdigit") return Value::boolean(text::is_digit(s));
  if (method == "isalpha") return Value::boolean(text::is_alpha(s));
  if (method == "isalnum") return Value::boolean(text::is_alnum(s));
  if (method == "islower") return Value::boolean(text::is_lower(s));
  return Value::boolean(text::is_upper(s));
}

Value case_method(const std::string& s, const std::string& method, CallArgs& args) {
  bind(args, method, {});
  if (method == "upper") return Value::string(text::upper(s));
  if (method == "lower") return Value::string(text::lower(s));
  if (method == "title") return Value::string(text::title(s));
  return Value::string(text::capitalize(s));
}

std::optional<Value> string_method(Interpreter& interp, const Value& object, const std::string& name, CallArgs& args) {
  const std::string& s = object.as_string();
  if (name == "startswith" || name == "endswith") return affix_test(object, name, args);
  if (name == "split" || name == "rsplit") return split_method(s, name, args);
  if (name == "strip" || name == "lstrip" || name == "rstrip") return strip_method(s, name, args);
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") return case_method(s, name, args);
  if (name == "join") return join_method(interp, s, args);
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return search_method(s, name, args);
  if (name == "replace") {
    const std::vector<Value> a = bind(args, "replace", {required("old"), required("new"), {"count", Value::integer(-1)}});
    const std::string& old = string_argument(a[0], name, 1);
    const std::string& replacement = string_argument(a[1], name, 2);
    const int64_t count = integer_argument(a[2], "count");
    check_replace_size(interp, s, old, replacement, count);
    return Value::string(text::replace(s, old, replacement, count));
  }
  if (name == "splitlines") {
    const std::vector<Value> a = bind(args, "splitlines", {{"keepends", Value::boolean(false)}});
    return string_list(text::splitlines(s, truthy(a[0])));
  }
  if (in(kStringMethods, name)) return predicate_method(s, name, args);
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& object, const std::string& name, CallArgs& args) {
  const DictData& d = object.as_dict();
  if (name == "get") {
    const std::vector<Value> a = bind(args, "get", {required("key"), {"default", Value::none()}});
    const Value* found = d.find(a[0]);
    return found ? *found : a[1];
  }
  if (name != "items" && name != "keys" && name != "values") return std::nullopt;
  bind(args, name, {});
  std::vector<Value> view;
  view.reserve(d.entries.size());
  for (const auto& [key, value] : d.entries)
    view.push_back(name == "items" ? Value::tuple({key, value}) : name == "keys" ? key : value);
  const ListFlavor flavor = name == "items" ? ListFlavor::DictItems : name == "keys" ? ListFlavor::DictKeys : ListFlavor::DictValues;
  return Value::list(std::move(view), flavor);
}

std::optional<Value> list_method(const Value& object, const std::string& name, CallArgs& args) {
  const std::vector<Value>& items = object.as_list().items;
  if (name != "count" && name != "index") return std::nullopt;
  const std::vector<Value> a = bind(args, name, {required("value")});
  if (name == "count") return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, a[0]); }));
  const auto at = std::find_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, a[0]); });
  if (at == items.end()) fail(to_repr(a[0]) + " is not in " + type_name(object));
  return Value::integer(at - items.begin());
}

// Python's slice bounds for a sequence of `length` (PySlice_AdjustIndices).
int64_t slice_bound(const Value& bound, int64_t length, int64_t step, bool is_start) {
  if (bound.is_undefined() || bound.is_none())
    return is_start ? (step < 0 ? length - 1 : 0) : (step < 0 ? -1 : length);
  if (!bound.is_integral()) fail("slice indices must be integers or None or have an __index__ method");
  int64_t i = bound.as_int();
  if (i < 0) {
    i += length;
    if (i < 0) i = step < 0 ? -1 : 0;
  } else if (i >= length) {
    i = step < 0 ? length - 1 : length;
  }
  return i;
}

std::vector<size_t> slice_positions(int64_t length, const Value& start, const Value& stop, const Value& step_value) {
  int64_t step = 1;
  if (!step_value.is_undefined() && !step_value.is_none()) {
    if (!step_value.is_integral()) fail("slice indices must be integers or None or have an __index__ method");
    step = step_value.as_int();
    if (step == 0) fail("slice step cannot be zero");
  }
  const int64_t from = slice_bound(start, length, step, true);
  const int64_t to = slice_bound(stop, length, step, false);
  std::vector<size_t> positions;
  for (int64_t i = from; step > 0 ? i < to : i > to; i += step) positions.push_back(static_cast<size_t>(i));
  return positions;
}

}  // namespace

bool is_known_method(std::string_view name) {
  return in(kStringMethods, name) || in(kDictMethods, name) || in(kListMethods, name) ||
         in(kMutatingListMethods, name) || in(kUnsupportedListMethods, name) || in(kMutatingDictMethods, name) ||
         name == "cycle";
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::Undefined: fail(object.undefined_reason());
    case Value::Kind::Dict: {
      if (in(kDictMethods, name)) return bound_method(object, name);
      if (in(kMutatingDictMethods, name)) return unsafe(object, name);
      const Value* found = object.as_dict().find(std::string_view(name));
      return found ? *found : no_attribute(object, name);
    }
    case Value::Kind::Namespace: {
      const Value* found = object.as_namespace().attributes.find(std::string_view(name));
      return found ? *found : no_attribute(object, name);
    }
    case Value::Kind::String:
      return in(kStringMethods, name) ? bound_method(object, name) : no_attribute(object, name);
    case Value::Kind::List:
      if (!is_plain_sequence(object)) return no_attribute(object, name);
      if (in(kListMethods, name)) return bound_method(object, name);
      if (object.as_list().flavor == ListFlavor::List) {
        if (in(kMutatingListMethods, name)) return unsafe(object, name);
        if (in(kUnsupportedListMethods, name))
          return Value::undefined("unsupported: list." + name + "() (lists never change in this Jinja subset)");
      }
      return no_attribute(object, name);
    default: return no_attribute(object, name);
  }
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::Undefined: fail(object.undefined_reason());
    case Value::Kind::Dict:
      if (const Value* found = object.as_dict().find(key)) return *found;
      break;
    case Value::Kind::List:
    case Value::Kind::String: {
      if (!key.is_integral() || (object.is_list() && !is_plain_sequence(object))) break;
      const int64_t n = length(object);
      const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n) return no_element(object, key);
      if (object.is_list()) return object.as_list().items[static_cast<size_t>(i)];
      const std::vector<size_t> offsets = text::code_point_offsets(object.as_string());
      return Value::string(object.as_string().substr(offsets[size_t(i)], offsets[size_t(i) + 1] - offsets[size_t(i)]));
    }
    default: break;
  }
  // jinja2 falls back to the attribute for a string key (`d['items']` is the method, `ns['x']` the attribute).
  return key.is_string() ? get_attribute(object, key.as_string()) : no_element(object, key);
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail(object.undefined_reason());
  if (object.is_string()) {
    const std::string& s = object.as_string();
    const std::vector<size_t> offsets = text::code_point_offsets(s);
    std::string out;
    for (size_t i : slice_positions(int64_t(offsets.size()) - 1, start, stop, step))
      out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    return Value::string(std::move(out));
  }
  if (is_plain_sequence(object)) {
    const std::vector<Value>& items = object.as_list().items;
    std::vector<Value> out;
    for (size_t i : slice_positions(int64_t(items.size()), start, stop, step)) out.push_back(items[i]);
    return Value::list(std::move(out), object.as_list().flavor);
  }
  // jinja2 slices with Python's own [] (not its getitem), so a slice of anything else is Python's TypeError.
  if (object.is_dict()) fail("unhashable type: 'slice'");
  std::string message = "'";  // built by appending: GCC 12 -O2 warns falsely (-Wrestrict) on "..." + string
  message += type_name(object);
  fail(message + "' object is not subscriptable");
}

std::optional<Value> call_method(Interpreter& interp, const Value& object, const std::string& name, CallArgs& args) {
  switch (object.kind()) {
    case Value::Kind::String: return string_method(interp, object, name, args);
    case Value::Kind::Dict: return dict_method(object, name, args);
    case Value::Kind::List: return is_plain_sequence(object) ? list_method(object, name, args) : std::nullopt;
    default: return std::nullopt;
  }
}

}  // namespace nextn::serve::jinja
