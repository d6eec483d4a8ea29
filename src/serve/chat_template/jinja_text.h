// Python's str semantics over UTF-8 strings, for the Jinja subset (jinja.h): chat templates call Python string
// methods (strip, split, startswith, ...) and print values as Python's str() / repr() / json.dumps do, and a
// rendered prompt must be byte for byte what transformers renders. Indices count code points, as Python's do.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nextn::serve::jinja::text {

// The code point at s[i], advancing i past it. A byte that does not start a valid UTF-8 sequence decodes as
// itself (one byte, one "code point"), so malformed text never loops or reads out of bounds.
uint32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);
size_t code_point_count(std::string_view s);
// Byte offsets of each code point's start, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches in Python's re, which Jinja's lexer uses).
bool is_space(uint32_t cp);

// str.strip / lstrip / rstrip: `chars` absent strips whitespace, else the code points of `chars`.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit: `sep` absent splits on runs of whitespace; max_split < 0 means no limit.
// Precondition: sep, when given, is not empty (the caller reports Python's "empty separator").
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t max_split);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t max_split);
// str.splitlines: the boundaries Python uses (\n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029).
std::vector<std::string> splitlines(std::string_view s, bool keep_ends);
// str.replace: an empty `old` inserts `replacement` around every code point, as Python does.
std::string replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count);
// str.find / str.rfind / str.count, in code points (-1 when absent).
int64_t find(std::string_view s, std::string_view sub);
int64_t rfind(std::string_view s, std::string_view sub);
int64_t count(std::string_view s, std::string_view sub);

// Case mapping: str.upper / lower / capitalize / title, and Jinja's `title` filter (words begin after
// whitespace or one of -({[<). Non-ASCII letters map through the C library's Unicode tables (C.UTF-8).
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);
std::string title(std::string_view s);
std::string jinja_title(std::string_view s);
// str.islower / isupper / isalpha / isdigit / isalnum / isspace over the whole string.
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);
bool is_alpha(std::string_view s);
bool is_digit(std::string_view s);
bool is_alnum(std::string_view s);
bool is_all_space(std::string_view s);

// repr(float): the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16 ("1.0", "0.0001"),
// else scientific ("1e+16", "1.5e-05"); "inf", "-inf", "nan".
std::string float_repr(double value);
// repr(str): single quotes unless the text has ' and no ", escapes as Python's.
std::string python_quote(std::string_view s);
// A JSON string literal as Python's json.dumps writes it (ensure_ascii escapes every non-ASCII code point).
std::string json_quote(std::string_view s, bool ensure_ascii);

}  // namespace nextn::serve::jinja::text
