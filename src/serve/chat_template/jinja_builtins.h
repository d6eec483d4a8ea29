// The filters, tests, global functions and Python methods of the Jinja subset, as jinja2 3.1 and transformers'
// chat-template environment define them. The parser looks names up here, so a template that uses one we do
// not have fails when it is loaded, not when a request renders it.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "serve/chat_template/jinja_ast.h"

namespace nextn::serve::jinja {

FilterFn find_filter(std::string_view name);  // null: not in the subset
TestFn find_test(std::string_view name);      // null: not in the subset
// range, namespace, dict, and transformers' raise_exception and strftime_now.
bool is_global_function(std::string_view name);
Value global_function(std::string_view name);  // undefined when not one
// Whether `x.name(...)` can be a method call on some value (str, dict, list, loop methods).
bool is_known_method(std::string_view name);

// jinja2's getattr (`x.name`: a Python attribute, else the item) and getitem (`x[key]`: the item, else the
// attribute), returning an undefined that explains itself when neither exists.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// Python slicing x[start:stop:step] of a str, list or tuple (absent bounds are undefined values); a TypeError
// for anything else.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// `object.name(args)` when `name` is a method of object's type (str.strip, dict.items, ...); nullopt when not.
std::optional<Value> call_method(Interpreter& interp, const Value& object, const std::string& name, CallArgs& args);

// Fails (through interp.check_size) when s.replace(old, replacement, count) would be too large to build.
void check_replace_size(const Interpreter& interp, const std::string& s, const std::string& old,
                        const std::string& replacement, int64_t count);

// The filter / test named by a string argument (map('upper'), select('defined')); fails for unknown names.
FilterFn filter_by_name(const Value& name);
TestFn test_by_name(const Value& name);

}  // namespace nextn::serve::jinja
