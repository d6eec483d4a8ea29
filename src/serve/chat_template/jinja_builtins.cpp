// jinja2 3.1's filters, tests and globals that chat templates use, with transformers' additions (tojson with
// json.dumps' options, raise_exception, strftime_now). Each follows the jinja2 function of the same name.
#include "serve/chat_template/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "serve/chat_template/jinja_args.h"
#include "serve/chat_template/jinja_eval.h"
#include "serve/chat_template/jinja_text.h"

namespace nextn::serve::jinja {
namespace {

// ---- helpers ---------------------------------------------------------------------------------------------

std::vector<Value> items_of(Interpreter& interp, const Value& v) {
  std::vector<Value> items = iterate(v);
  interp.tick(items.size());
  return items;
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each with getitem.
std::vector<Value> attribute_path(const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return {};
  if (attribute.is_integral()) return {Value::integer(attribute.as_int())};
  std::vector<Value> parts;
  for (const std::string& part : text::split(to_str(attribute), std::string("."), -1)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::string(part));
  }
  return parts;
}

Value follow(Value item, const std::vector<Value>& path, const Value& default_value = Value()) {
  for (const Value& part : path) {
    item = get_item(item, part);
    if (item.is_undefined() && !default_value.is_undefined()) item = default_value;
  }
  return item;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(text::lower(v.as_string())) : v; }

Value sort_key(const Value& item, const std::vector<Value>& path, bool case_sensitive) {
  const Value key = follow(item, path);
  return case_sensitive ? key : ignore_case(key);
}

// ---- filters: strings ------------------------------------------------------------------------------------

Value f_string(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "string", {});
  return Value::string(to_str(v));
}
Value f_safe(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "safe", {});
  return Value::string(to_str(v));  // autoescape is off: marking text safe changes nothing
}
Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "trim", {{"chars", Value::none()}});
  std::optional<std::string> chars;
  if (!a[0].is_none() && !a[0].is_undefined()) chars = to_str(a[0]);
  return Value::string(text::strip(to_str(v), chars, true, true));
}
Value f_upper(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "upper", {});
  return Value::string(text::upper(to_str(v)));
}
Value f_lower(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "lower", {});
  return Value::string(text::lower(to_str(v)));
}
Value f_capitalize(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "capitalize", {});
  return Value::string(text::capitalize(to_str(v)));
}
Value f_title(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "title", {});
  return Value::string(text::jinja_title(to_str(v)));
}
}  // namespace

void check_replace_size(const Interpreter& interp, const std::string& s, const std::string& old,
                        const std::string& replacement, int64_t count) {
  int64_t n = text::count(s, old);
  if (count >= 0) n = std::min(n, count);
  const long double bytes = (long double)s.size() + (long double)n * (long double)replacement.size();
  interp.check_size(bytes > (long double)SIZE_MAX / 2 ? SIZE_MAX : size_t(bytes));
}

namespace {

Value f_replace(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "replace", {required("old"), required("new"), {"count", Value::none()}});
  const int64_t count = a[2].is_none() ? -1 : integer_argument(a[2], "count");
  const std::string s = to_str(v), old = to_str(a[0]), replacement = to_str(a[1]);
  check_replace_size(interp, s, old, replacement, count);
  std::string out = text::replace(s, old, replacement, count);
  return Value::string(std::move(out));
}

Value f_indent(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a =
      bind(args, "indent", {{"width", Value::integer(4)}, {"first", Value::boolean(false)}, {"blank", Value::boolean(false)}});
  if (v.is_undefined()) fail(v.undefined_reason());
  if (v.is_list() && v.as_list().flavor == ListFlavor::List) fail("'list' object has no attribute 'splitlines'");
  if (!v.is_string()) fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  const int64_t width = a[0].is_string() ? 0 : std::max<int64_t>(0, integer_argument(a[0], "width"));
  interp.check_size(size_t(width));
  const std::string indentation = a[0].is_string() ? a[0].as_string() : std::string(size_t(width), ' ');
  const std::vector<std::string> lines = text::splitlines(v.as_string() + "\n", false);
  interp.check_size(v.as_string().size() + lines.size() * indentation.size());
  std::string out;
  if (truthy(a[2])) {  // blank: indent empty lines too
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indentation : "") + lines[i];
  } else {
    for (size_t i = 0; i < lines.size(); ++i)
      out += i == 0 ? lines[i] : "\n" + (lines[i].empty() ? "" : indentation) + lines[i];
  }
  return Value::string(truthy(a[1]) ? indentation + out : out);
}

// ---- filters: sequences ----------------------------------------------------------------------------------

Value f_length(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "length", {});
  return Value::integer(length(v));
}

Value f_list(Interpreter& interp, const Value& v, CallArgs& args) {
  bind(args, "list", {});
  return Value::list(items_of(interp, v));
}

Value f_first(Interpreter& interp, const Value& v, CallArgs& args) {
  bind(args, "first", {});
  const std::vector<Value> items = items_of(interp, v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter& interp, const Value& v, CallArgs& args) {
  bind(args, "last", {});
  if (!v.is_undefined() && !v.is_string() && !v.is_list() && !v.is_dict())
    fail("'" + type_name(v) + "' object is not reversible");
  const std::vector<Value> items = items_of(interp, v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(Interpreter& interp, const Value& v, CallArgs& args) {
  bind(args, "reverse", {});
  if (v.is_string()) return get_slice(v, Value::none(), Value::none(), Value::integer(-1));
  if (!v.is_undefined() && !v.is_list() && !v.is_dict()) fail("argument must be iterable");
  std::vector<Value> items = items_of(interp, v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_join(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "join", {{"d", Value::string("")}, {"attribute", Value::none()}});
  const std::vector<Value> path = attribute_path(a[1]);
  const std::string separator = to_str(a[0]);
  std::string out;
  bool first = true;
  for (const Value& item : items_of(interp, v)) {
    if (!first) out += separator;
    first = false;
    out += to_str(follow(item, path));
    interp.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "default", {{"default_value", Value::string("")}, {"boolean", Value::boolean(false)}});
  return v.is_undefined() || (truthy(a[1]) && !truthy(v)) ? a[0] : v;
}

Value f_items(Interpreter& interp, const Value& v, CallArgs& args) {
  bind(args, "items", {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  interp.tick(pairs.size());
  return Value::list(std::move(pairs));
}

// Python's stable sort by key (reverse keeps equal keys in their order, as sorted(reverse=True) does).
std::vector<Value> sorted_by(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return reverse ? less(keys[y], keys[x]) : less(keys[x], keys[y]); });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

std::vector<std::vector<Value>> multi_attribute_paths(const Value& attribute) {
  std::vector<std::vector<Value>> paths;
  if (!attribute.is_string()) return {attribute_path(attribute)};
  for (const std::string& part : text::split(attribute.as_string(), std::string(","), -1))
    paths.push_back(attribute_path(Value::string(part)));
  return paths;
}

Value f_sort(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "sort", {{"reverse", Value::boolean(false)},
                                                   {"case_sensitive", Value::boolean(false)},
                                                   {"attribute", Value::none()}});
  std::vector<Value> items = items_of(interp, v);
  const auto paths = multi_attribute_paths(a[2]);
  std::vector<Value> keys;
  for (const Value& item : items) {
    std::vector<Value> key;
    for (const auto& path : paths) key.push_back(sort_key(item, path, truthy(a[1])));
    keys.push_back(Value::list(std::move(key)));
  }
  return Value::list(sorted_by(std::move(items), keys, truthy(a[0])));
}

Value f_dictsort(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "dictsort", {{"case_sensitive", Value::boolean(false)},
                                                       {"by", Value::string("key")},
                                                       {"reverse", Value::boolean(false)}});
  const std::string by = to_str(a[1]);
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) fail("'" + type_name(v) + "' object has no attribute 'items'");
  std::vector<Value> pairs, keys;
  for (const auto& [key, value] : v.as_dict().entries) {
    pairs.push_back(Value::tuple({key, value}));
    const Value& sorted_on = by == "key" ? key : value;
    keys.push_back(truthy(a[0]) ? sorted_on : ignore_case(sorted_on));
  }
  interp.tick(pairs.size());
  return Value::list(sorted_by(std::move(pairs), keys, truthy(a[2])));
}

Value f_unique(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "unique", {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  const std::vector<Value> path = attribute_path(a[1]);
  std::vector<Value> seen, out;
  for (const Value& item : items_of(interp, v)) {
    const Value key = sort_key(item, path, truthy(a[0]));
    const bool unhashable = key.is_dict() || (key.is_list() && key.as_list().flavor != ListFlavor::Tuple);
    if (unhashable) fail("unhashable type: '" + type_name(key) + "'");  // unique() keeps a Python set
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    interp.tick(seen.size());
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value min_or_max(Interpreter& interp, const Value& v, CallArgs& args, bool want_max) {
  const std::vector<Value> a = bind(args, want_max ? "max" : "min",
                                    {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  const std::vector<Value> items = items_of(interp, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const std::vector<Value> path = attribute_path(a[1]);
  size_t best = 0;
  Value best_key = sort_key(items[0], path, truthy(a[0]));
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(items[i], path, truthy(a[0]));
    if (want_max ? less(best_key, key) : less(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}
Value f_min(Interpreter& interp, const Value& v, CallArgs& args) { return min_or_max(interp, v, args, false); }
Value f_max(Interpreter& interp, const Value& v, CallArgs& args) { return min_or_max(interp, v, args, true); }

Value f_sum(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "sum", {{"attribute", Value::none()}, {"start", Value::integer(0)}});
  if (a[1].is_string()) fail("sum() can't sum strings [use ''.join(seq) instead]");
  const std::vector<Value> path = attribute_path(a[0]);
  Value total = a[1];
  for (const Value& item : items_of(interp, v)) total = arithmetic(BinaryOp::Add, total, follow(item, path), interp);
  return total;
}

// ---- filters: map / select ---------------------------------------------------------------------------------

Value f_map(Interpreter& interp, const Value& v, CallArgs& args) {
  if (!truthy(v)) return Value::list({});
  std::vector<Value> out;
  if (args.positional.empty()) {  // map(attribute='name', default=...)
    const std::vector<Value> a = bind(args, "map", {required("attribute"), {"default", Value()}});
    const std::vector<Value> path = attribute_path(a[0]);
    for (const Value& item : items_of(interp, v)) out.push_back(follow(item, path, a[1]));
    return Value::list(std::move(out));
  }
  const FilterFn filter = filter_by_name(args.positional[0]);
  CallArgs rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()), args.keyword};
  for (const Value& item : items_of(interp, v)) {
    CallArgs each = rest;
    out.push_back(filter(interp, item, each));
  }
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr: items whose (attribute's) test passes, or is truthy without one.
Value select_items(Interpreter& interp, const Value& v, CallArgs& args, bool by_attribute, bool keep_when) {
  if (!truthy(v)) return Value::list({});
  size_t next_arg = 0;
  std::vector<Value> path;
  if (by_attribute) {
    if (args.positional.empty()) fail("Missing parameter for attribute name");
    path = attribute_path(args.positional[next_arg++]);
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (args.positional.size() > next_arg) {
    test = test_by_name(args.positional[next_arg]);
    test_args.positional.assign(args.positional.begin() + long(next_arg) + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : items_of(interp, v)) {
    const Value subject = follow(item, path);
    CallArgs each = test_args;
    const bool passes = test ? test(interp, subject, each) : truthy(subject);
    if (passes == keep_when) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, false, true); }
Value f_reject(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, false, false); }
Value f_selectattr(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, true, true); }
Value f_rejectattr(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, true, false); }

// ---- filters: numbers and JSON -----------------------------------------------------------------------------

// Python's int(str, base): optional sign, underscores between digits, surrounding whitespace.
std::optional<int64_t> parse_python_int(const std::string& s, int base) {
  std::string digits;
  for (char c : text::strip(s, std::nullopt, true, true))
    if (c != '_') digits += c;
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(digits.c_str(), &end, base);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

std::optional<double> parse_python_float(const std::string& s) {
  std::string digits;
  for (char c : text::strip(s, std::nullopt, true, true))
    if (c != '_') digits += c;
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(digits.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return value;
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "int", {{"default", Value::integer(0)}, {"base", Value::integer(10)}});
  if (v.is_undefined()) fail(v.undefined_reason());
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.kind() == Value::Kind::Float) {
    if (!std::isfinite(v.as_float())) return a[0];
    return Value::integer(static_cast<int64_t>(std::trunc(v.as_float())));
  }
  if (v.is_string()) {  // "42" -> 42; "42.23" -> 42 (through float), as jinja2's do_int
    if (const auto i = parse_python_int(v.as_string(), int(integer_argument(a[1], "base")))) return Value::integer(*i);
    if (const auto f = parse_python_float(v.as_string()); f && std::isfinite(*f))
      return Value::integer(static_cast<int64_t>(std::trunc(*f)));
  }
  return a[0];
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "float", {{"default", Value::number(0.0)}});
  if (v.is_undefined()) fail(v.undefined_reason());
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string())
    if (const auto f = parse_python_float(v.as_string())) return Value::number(*f);
  return a[0];
}

Value f_abs(Interpreter&, const Value& v, CallArgs& args) {
  bind(args, "abs", {});
  if (v.kind() == Value::Kind::Float) return Value::number(std::fabs(v.as_float()));
  if (!v.is_integral()) fail("bad operand type for abs(): '" + type_name(v) + "'");
  if (v.as_int() == INT64_MIN) fail("integer overflow (the result does not fit in 64 bits)");
  return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

// Python's round(x, n) for a float: the correctly rounded decimal, ties to even.
double round_half_even(double x, int64_t digits) {
  if (digits <= 0) {
    const double scale = std::pow(10.0, double(-digits));
    return std::nearbyint(x / scale) * scale;
  }
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", int(std::min<int64_t>(digits, 300)), x);
  return std::strtod(buffer, nullptr);
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "round", {{"precision", Value::integer(0)}, {"method", Value::string("common")}});
  const std::string method = to_str(a[1]);
  if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail(v.undefined_reason());
  if (!v.is_number()) fail("type " + type_name(v) + " doesn't define __round__ method");
  const int64_t precision = integer_argument(a[0], "precision");
  if (method == "common") {
    if (v.is_integral() && precision >= 0) return Value::integer(v.as_int());
    return Value::number(round_half_even(v.as_float(), precision));
  }
  const double scale = std::pow(10.0, double(precision));
  const double scaled = v.as_float() * scale;
  return Value::number((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Interpreter& interp, const Value& v, CallArgs& args) {
  const std::vector<Value> a = bind(args, "tojson", {{"ensure_ascii", Value::boolean(false)}, {"indent", Value::none()},
                                                     {"separators", Value::none()}, {"sort_keys", Value::boolean(false)}});
  JsonFormat format;
  format.ensure_ascii = truthy(a[0]);
  if (a[1].is_string()) {
    format.indent = a[1].as_string();
  } else if (!a[1].is_none()) {
    const int64_t width = std::max<int64_t>(0, integer_argument(a[1], "indent"));
    interp.check_size(size_t(width));
    format.indent = std::string(size_t(width), ' ');
  }
  if (format.indent) format.item_separator = ",";
  if (!a[2].is_none()) {
    const bool pair = a[2].is_list() && a[2].as_list().items.size() == 2 && a[2].as_list().items[0].is_string() &&
                      a[2].as_list().items[1].is_string();
    if (!pair) fail("tojson separators must be a pair of strings (item separator, key separator)");
    format.item_separator = a[2].as_list().items[0].as_string();
    format.key_separator = a[2].as_list().items[1].as_string();
  }
  format.sort_keys = truthy(a[3]);
  format.max_bytes = interp.limits().max_output_bytes;
  std::string out = to_json(v, format);
  interp.check_size(out.size());
  return Value::string(std::move(out));
}

// ---- tests -----------------------------------------------------------------------------------------------

bool no_args(CallArgs& args, const char* name) {
  bind(args, name, {});
  return true;
}
Value one_arg(CallArgs& args, const char* name) { return bind(args, name, {required("other")})[0]; }

bool t_defined(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "defined") && !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "undefined") && v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "none") && v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "boolean") && v.kind() == Value::Kind::Bool; }
bool t_true(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "true") && v.kind() == Value::Kind::Bool && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "false") && v.kind() == Value::Kind::Bool && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "integer") && v.kind() == Value::Kind::Int; }
bool t_float(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "float") && v.kind() == Value::Kind::Float; }
bool t_number(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "number") && v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "string") && v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "mapping") && v.is_dict(); }
bool t_callable(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "callable") && v.kind() == Value::Kind::Callable; }
// jinja2's `sequence`: has len() and [] (so str, list, tuple, dict; its Undefined passes too).
bool t_sequence(Interpreter&, const Value& v, CallArgs& a) {
  return no_args(a, "sequence") && (v.is_undefined() || v.is_string() || v.is_dict() ||
                                    (v.is_list() && v.as_list().flavor <= ListFlavor::Tuple));
}
bool t_iterable(Interpreter&, const Value& v, CallArgs& a) {
  return no_args(a, "iterable") && (v.is_undefined() || v.is_string() || v.is_list() || v.is_dict());
}
bool t_lower(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "lower") && text::is_lower(to_str(v)); }
bool t_upper(Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "upper") && text::is_upper(to_str(v)); }
bool t_odd(Interpreter& i, const Value& v, CallArgs& a) {
  return no_args(a, "odd") && equal(arithmetic(BinaryOp::Modulo, v, Value::integer(2), i), Value::integer(1));
}
bool t_even(Interpreter& i, const Value& v, CallArgs& a) {
  return no_args(a, "even") && equal(arithmetic(BinaryOp::Modulo, v, Value::integer(2), i), Value::integer(0));
}
bool t_divisibleby(Interpreter& i, const Value& v, CallArgs& a) {
  return equal(arithmetic(BinaryOp::Modulo, v, bind(a, "divisibleby", {required("num")})[0], i), Value::integer(0));
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equal(v, one_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equal(v, one_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "lt"), CompareOp::Less); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "le"), CompareOp::LessEqual); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "gt"), CompareOp::Greater); }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "ge"), CompareOp::GreaterEqual); }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(bind(a, "in", {required("seq")})[0], v); }
// `is`: identity. Values of the subset are immutable except namespaces, so identity of scalars is equality.
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value other = one_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::Bool:
    case Value::Kind::Int:
    case Value::Kind::Float: return equal(v, other);
    default: return v.identity() == other.identity();
  }
}

struct NamedFilter {
  std::string_view name;
  FilterFn fn;
};
constexpr NamedFilter kFilters[] = {
    {"abs", f_abs},         {"capitalize", f_capitalize}, {"count", f_length},     {"d", f_default},
    {"default", f_default}, {"dictsort", f_dictsort},     {"first", f_first},      {"float", f_float},
    {"indent", f_indent},   {"int", f_int},               {"items", f_items},      {"join", f_join},
    {"last", f_last},       {"length", f_length},         {"list", f_list},        {"lower", f_lower},
    {"map", f_map},         {"max", f_max},               {"min", f_min},          {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},  {"round", f_round},
    {"safe", f_safe},       {"select", f_select},         {"selectattr", f_selectattr}, {"sort", f_sort},
    {"string", f_string},   {"sum", f_sum},               {"title", f_title},      {"tojson", f_tojson},
    {"trim", f_trim},       {"unique", f_unique},         {"upper", f_upper},
};

struct NamedTest {
  std::string_view name;
  TestFn fn;
};
constexpr NamedTest kTests[] = {
    {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
    {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},           {"even", t_even},
    {"false", t_false},     {"float", t_float},       {"ge", t_ge},           {">=", t_ge},
    {"gt", t_gt},           {"greaterthan", t_gt},    {">", t_gt},            {"in", t_in},
    {"integer", t_integer}, {"iterable", t_iterable}, {"le", t_le},           {"<=", t_le},
    {"lower", t_lower},     {"lt", t_lt},             {"lessthan", t_lt},     {"<", t_lt},
    {"mapping", t_mapping}, {"ne", t_ne},             {"!=", t_ne},           {"none", t_none},
    {"number", t_number},   {"odd", t_odd},           {"sameas", t_sameas},   {"sequence", t_sequence},
    {"string", t_string},   {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
};

// ---- globals ---------------------------------------------------------------------------------------------

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses larger ranges

Value g_range(Interpreter& interp, CallArgs& args) {
  if (!args.keyword.empty()) fail("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3)
    fail("range expected at most 3 arguments, got " + std::to_string(args.positional.size()));
  std::vector<int64_t> n;
  for (const Value& v : args.positional) n.push_back(integer_argument(v, "range"));
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) fail("range() arg 3 must not be zero");
  const long double span = step > 0 ? (long double)stop - start : (long double)start - stop;
  const long double count = span <= 0 ? 0 : std::ceil(span / std::fabs((long double)step));
  if (count > kMaxRange) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  for (int64_t i = 0; i < int64_t(count); ++i) items.push_back(Value::integer(start + i * step));
  interp.tick(items.size());
  return Value::list(std::move(items));
}

// dict(mapping_or_pairs, **kwargs), which namespace() also takes.
DictData dict_from(CallArgs& args, const char* function) {
  if (args.positional.size() > 1)
    fail(std::string(function) + " expected at most 1 argument, got " + std::to_string(args.positional.size()));
  DictData d;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      d = source.as_dict();
    } else {
      for (const Value& pair : iterate(source)) {
        if (!pair.is_list() || pair.as_list().items.size() != 2)
          fail("dictionary update sequence element has length " + std::to_string(pair.is_list() ? pair.as_list().items.size() : 1) + "; 2 is required");
        d.set(pair.as_list().items[0], pair.as_list().items[1]);
      }
    }
  }
  for (auto& [key, value] : args.keyword) d.set(Value::string(key), value);
  return d;
}

Value g_dict(Interpreter&, CallArgs& args) { return Value::dict(dict_from(args, "dict")); }
Value g_namespace(Interpreter&, CallArgs& args) { return Value::new_namespace(dict_from(args, "namespace")); }

// transformers: raise TemplateError(message) -- how a template rejects a conversation it cannot format.
Value g_raise_exception(Interpreter&, CallArgs& args) {
  fail(to_str(bind(args, "raise_exception", {required("message")})[0]));
}

// transformers: datetime.now().strftime(format), local time.
Value g_strftime_now(Interpreter&, CallArgs& args) {
  const std::string format = to_str(bind(args, "strftime_now", {required("format")})[0]);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string out(format.size() * 4 + 64, '\0');
  const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
  if (n == 0 && !format.empty()) fail("strftime_now: the formatted time is too long or the format is invalid");
  out.resize(n);
  return Value::string(out);
}

struct NamedGlobal {
  std::string_view name;
  Value (*fn)(Interpreter&, CallArgs&);
};
constexpr NamedGlobal kGlobals[] = {
    {"range", g_range},
    {"dict", g_dict},
    {"namespace", g_namespace},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const NamedFilter& f : kFilters)
    if (f.name == name) return f.fn;
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const NamedTest& t : kTests)
    if (t.name == name) return t.fn;
  return nullptr;
}

bool is_global_function(std::string_view name) {
  return std::any_of(std::begin(kGlobals), std::end(kGlobals), [&](const NamedGlobal& g) { return g.name == name; });
}

Value global_function(std::string_view name) {
  for (const NamedGlobal& g : kGlobals)
    if (g.name == name) return Value::callable(std::string(name), g.fn);
  return Value();
}

FilterFn filter_by_name(const Value& name) {
  const FilterFn fn = name.is_string() ? find_filter(name.as_string()) : nullptr;
  if (!fn) fail("No filter named " + to_repr(name) + ".");
  return fn;
}

TestFn test_by_name(const Value& name) {
  const TestFn fn = name.is_string() ? find_test(name.as_string()) : nullptr;
  if (!fn) fail("No test named " + to_repr(name) + ".");
  return fn;
}

}  // namespace nextn::serve::jinja
