// A Jinja2 subset for HuggingFace chat templates, rendering exactly what transformers' apply_chat_template
// renders (jinja2 3.1 in an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols,
// transformers' tojson, raise_exception and strftime_now). No C++ Jinja library is packaged by Debian, so the
// subset that real chat templates use lives here:
//
//   statements  {{ }} {% %} {# #}, whitespace control -/+, if/elif/else, for (else, `if` filter, unpacking,
//               loop.*), break/continue, set (tuples, namespace attributes, block set), macro, generation
//   expressions literals, lists, tuples, dicts, a.b, a[i], a[i:j:k], calls, filters, tests, not/and/or,
//               == != < <= > >= in, + - * / // % **, ~, a if c else b
//   builtins    jinja_builtins.h: filters, tests, string/dict/list methods, range, namespace, dict
//
// Anything else fails when the template is parsed (a SyntaxError message naming the construct and its line),
// so a server refuses a template it cannot render faithfully at startup, not on a request.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "serve/chat_template/jinja_value.h"

namespace nextn::serve::jinja {

// Bounds on what one render may do, so a hostile template cannot hang the server or exhaust its memory or
// stack; each is an error naming the bound.
struct Limits {
  size_t max_output_bytes = size_t{32} << 20;  // the rendered text, and any one string or list it builds
  uint64_t max_steps = 20'000'000;             // statements, expressions and loop iterations evaluated
  int max_call_depth = 64;                     // macro calls in progress at once
  int max_eval_depth = 600;                    // nested evaluations (C++ recursion) at once
  int max_nesting = 100;                       // how deep blocks and expressions nest (checked when parsing)
};

// A failure while rendering: a template's raise_exception(message), a type error, an undefined value used.
// what() is "ORIGIN, line N: DETAIL"; detail() is the message alone (what jinja2 would raise).
class RenderError : public nextn::Error {
 public:
  RenderError(const std::string& origin, int line, const std::string& detail)
      : nextn::Error(origin + ", line " + std::to_string(line) + ": " + detail), line_(line), detail_(detail) {}
  int line() const { return line_; }
  const std::string& detail() const { return detail_; }

 private:
  int line_;
  std::string detail_;
};

using Variables = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Throws nextn::Error "ORIGIN, line N: MESSAGE" when `source` does not parse or leaves the subset.
  static Template parse(std::string_view source, const std::string& origin, const Limits& limits = {});
  // Renders with these top-level variables. Thread-safe: each call has its own state. Throws RenderError.
  std::string render(const Variables& variables) const;
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace nextn::serve::jinja
