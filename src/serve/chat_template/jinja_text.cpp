#include "serve/chat_template/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cwctype>
#include <locale.h>
#include <wctype.h>

#include "core/utf8.h"

namespace nextn::serve::jinja::text {
namespace {

// Malformed bytes decode to U+DC80..U+DCFF (Python's "surrogateescape"), and encode back to the same byte,
// so text that is not UTF-8 passes through unchanged.
constexpr uint32_t kEscapedByteBase = 0xDC00;

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(next_code_point(s, i));
  return cps;
}

std::string encode(const uint32_t* begin, const uint32_t* end) {
  std::string out;
  out.reserve(static_cast<size_t>(end - begin));
  for (const uint32_t* p = begin; p != end; ++p) append_utf8(out, *p);
  return out;
}
std::string encode(const std::vector<uint32_t>& cps, size_t from, size_t to) {
  return encode(cps.data() + from, cps.data() + to);
}

// The C library's Unicode case tables and classes; "C.UTF-8" ships with glibc. Without it, ASCII only.
locale_t unicode_locale() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return locale;
}
uint32_t to_upper_cp(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  const locale_t loc = unicode_locale();
  return loc ? static_cast<uint32_t>(towupper_l(static_cast<wint_t>(cp), loc)) : cp;
}
uint32_t to_lower_cp(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const locale_t loc = unicode_locale();
  return loc ? static_cast<uint32_t>(towlower_l(static_cast<wint_t>(cp), loc)) : cp;
}
bool is_alpha_cp(uint32_t cp) {
  if (cp < 0x80) return (cp | 32) >= 'a' && (cp | 32) <= 'z';
  const locale_t loc = unicode_locale();
  return loc && iswalpha_l(static_cast<wint_t>(cp), loc);
}
bool is_digit_cp(uint32_t cp) { return cp >= '0' && cp <= '9'; }
// Python's "cased" characters (letters with an upper/lower/title case form).
bool is_cased(uint32_t cp) { return cp == 0xDF || to_upper_cp(cp) != cp || to_lower_cp(cp) != cp; }
bool is_upper_cp(uint32_t cp) { return is_cased(cp) && to_lower_cp(cp) != cp; }
bool is_lower_cp(uint32_t cp) { return is_cased(cp) && !is_upper_cp(cp); }

// The full-case mappings that expand to two code points and matter in practice (Python's SpecialCasing).
void append_upper(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {  // ß
    out += "SS";
    return;
  }
  append_utf8(out, to_upper_cp(cp));
}
void append_lower(std::string& out, uint32_t cp) {
  if (cp == 0x130) {  // İ -> i + combining dot above
    out += "i\xCC\x87";
    return;
  }
  append_utf8(out, to_lower_cp(cp));
}
void append_title(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "Ss";
    return;
  }
  append_utf8(out, to_upper_cp(cp));
}

bool contains_cp(const std::vector<uint32_t>& set, uint32_t cp) {
  return std::find(set.begin(), set.end(), cp) != set.end();
}

// Python's str.isprintable() for one code point: false for controls, format characters, separators other
// than the ASCII space, surrogates and private use. Unassigned code points are not tabulated (treated as
// printable), the one place this can differ from Python's Unicode database.
bool is_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp < 0x600) return true;
  static constexpr uint32_t kRanges[][2] = {
      {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},     {0x70F, 0x70F},   {0x890, 0x891},
      {0x8E2, 0x8E2},     {0x180E, 0x180E},   {0x1680, 0x1680},   {0x2000, 0x200F}, {0x2028, 0x202F},
      {0x205F, 0x206F},   {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF}, {0xFFF0, 0xFFFB},
      {0xFFFE, 0xFFFF},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F},
      {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0000, 0xE00FF}, {0xE01F0, 0x10FFFF},
  };
  for (const auto& range : kRanges)
    if (cp >= range[0] && cp <= range[1]) return false;
  return true;
}

void append_hex(std::string& out, uint32_t value, int digits) {
  static const char kHex[] = "0123456789abcdef";
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4) out += kHex[(value >> shift) & 0xF];
}

bool is_line_break(uint32_t cp) {
  return (cp >= 0x0A && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

int64_t code_points_before(std::string_view s, size_t byte_offset) {
  return static_cast<int64_t>(code_point_count(s.substr(0, byte_offset)));
}

}  // namespace

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
  if (length == 1) {
    ++i;
    return lead;
  }
  if (length == 0 || i + length > s.size()) return kEscapedByteBase + static_cast<unsigned char>(s[i++]);
  uint32_t cp = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    const auto byte = static_cast<unsigned char>(s[i + k]);
    if (!is_continuation(byte)) return kEscapedByteBase + static_cast<unsigned char>(s[i++]);
    cp = (cp << 6) | (byte & 0x3F);
  }
  static constexpr uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinimum[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return kEscapedByteBase + static_cast<unsigned char>(s[i++]);  // overlong, out of range, or a surrogate
  i += length;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= kEscapedByteBase + 0x80 && cp <= kEscapedByteBase + 0xFF)
    out += static_cast<char>(cp - kEscapedByteBase);  // a byte that was not valid UTF-8 goes back as it was
  else
    nextn::append_utf8(out, cp);
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_code_point(s, i);
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    next_code_point(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = decode(s);
  const std::vector<uint32_t> set = chars ? decode(*chars) : std::vector<uint32_t>{};
  auto strippable = [&](uint32_t cp) { return chars ? contains_cp(set, cp) : is_space(cp); };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(cps, begin, end);
}

namespace {

std::vector<std::string> split_whitespace(const std::vector<uint32_t>& cps, int64_t max_split) {
  std::vector<std::string> parts;
  const size_t n = cps.size();
  size_t i = 0;
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    while (i < n && is_space(cps[i])) ++i;
    if (i == n) break;
    const size_t start = i;
    while (i < n && !is_space(cps[i])) ++i;
    parts.push_back(encode(cps, start, i));
  }
  while (i < n && is_space(cps[i])) ++i;  // only reached with text left when max_split ran out
  if (i < n) parts.push_back(encode(cps, i, n));
  return parts;
}

std::vector<std::string> rsplit_whitespace(const std::vector<uint32_t>& cps, int64_t max_split) {
  std::vector<std::string> parts;
  size_t i = cps.size();  // one past the next code point to look at
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    while (i > 0 && is_space(cps[i - 1])) --i;
    if (i == 0) break;
    const size_t end = i;
    while (i > 0 && !is_space(cps[i - 1])) --i;
    parts.push_back(encode(cps, i, end));
  }
  while (i > 0 && is_space(cps[i - 1])) --i;
  if (i > 0) parts.push_back(encode(cps, 0, i));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t max_split) {
  if (!sep) return split_whitespace(decode(s), max_split);
  std::vector<std::string> parts;
  size_t start = 0;
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0; --left) {
    const size_t at = s.find(*sep, start);
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, at - start));
    start = at + sep->size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t max_split) {
  if (!sep) return rsplit_whitespace(decode(s), max_split);
  std::vector<std::string> parts;
  size_t end = s.size();
  for (int64_t left = max_split < 0 ? INT64_MAX : max_split; left > 0 && end >= sep->size(); --left) {
    const size_t at = s.rfind(*sep, end - sep->size());
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view s, bool keep_ends) {
  const std::vector<uint32_t> cps = decode(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size();) {
    if (!is_line_break(cps[i])) {
      ++i;
      continue;
    }
    size_t end_of_break = i + 1;
    if (cps[i] == '\r' && end_of_break < cps.size() && cps[end_of_break] == '\n') ++end_of_break;
    lines.push_back(encode(cps, start, keep_ends ? end_of_break : i));
    start = i = end_of_break;
  }
  if (start < cps.size()) lines.push_back(encode(cps, start, cps.size()));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count) {
  int64_t left = count < 0 ? INT64_MAX : count;
  std::string out;
  if (old.empty()) {
    const std::vector<size_t> offsets = code_point_offsets(s);
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      if (left > 0) {
        out += replacement;
        --left;
      }
      out += s.substr(offsets[k], offsets[k + 1] - offsets[k]);
    }
    if (left > 0) out += replacement;
    return out;
  }
  size_t start = 0;
  for (; left > 0; --left) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
  }
  out += s.substr(start);
  return out;
}

int64_t find(std::string_view s, std::string_view sub) {
  const size_t at = s.find(sub);
  return at == std::string_view::npos ? -1 : code_points_before(s, at);
}

int64_t rfind(std::string_view s, std::string_view sub) {
  const size_t at = s.rfind(sub);
  return at == std::string_view::npos ? -1 : code_points_before(s, at);
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(code_point_count(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

std::string upper(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_upper(out, next_code_point(s, i));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_lower(out, next_code_point(s, i));
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const bool first = i == 0;
    const uint32_t cp = next_code_point(s, i);
    first ? append_title(out, cp) : append_lower(out, cp);
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool previous_is_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    previous_is_cased ? append_lower(out, cp) : append_title(out, cp);
    previous_is_cased = is_cased(cp);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  auto is_word_separator = [](uint32_t cp) {
    return is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
  };
  std::string out;
  bool at_word_start = true;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    if (is_word_separator(cp)) {
      append_utf8(out, cp);
      at_word_start = true;
    } else {
      at_word_start ? append_upper(out, cp) : append_lower(out, cp);
      at_word_start = false;
    }
  }
  return out;
}

bool is_lower(std::string_view s) {
  bool any_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    if (is_upper_cp(cp)) return false;
    any_cased = any_cased || is_lower_cp(cp);
  }
  return any_cased;
}

bool is_upper(std::string_view s) {
  bool any_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    if (is_lower_cp(cp)) return false;
    any_cased = any_cased || is_upper_cp(cp);
  }
  return any_cased;
}

namespace {
template <typename Pred>
bool all_of_non_empty(std::string_view s, Pred pred) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!pred(next_code_point(s, i))) return false;
  return true;
}
}  // namespace

bool is_alpha(std::string_view s) { return all_of_non_empty(s, is_alpha_cp); }
bool is_digit(std::string_view s) { return all_of_non_empty(s, is_digit_cp); }
bool is_alnum(std::string_view s) {
  return all_of_non_empty(s, [](uint32_t cp) { return is_alpha_cp(cp) || is_digit_cp(cp); });
}
bool is_all_space(std::string_view s) { return all_of_non_empty(s, is_space); }

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string_view sci(buffer, static_cast<size_t>(result.ptr - buffer));  // e.g. "-1.2345e+17"
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c >= '0' && c <= '9') digits += c;
  const int exponent = std::stoi(std::string(sci.substr(e + 1)));
  std::string out = value < 0 || (value == 0 && std::signbit(value)) ? "-" : "";
  const int point = exponent + 1;  // digits before the decimal point
  if (point > 16 || point < -3) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_text;
  }
  if (point <= 0) return out + "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  const auto whole = static_cast<size_t>(point);
  if (whole >= digits.size()) return out + digits + std::string(whole - digits.size(), '0') + ".0";
  return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

std::string python_quote(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (is_printable(cp)) {
      append_utf8(out, cp);
    } else if (cp < 0x100) {
      out += "\\x";
      append_hex(out, cp, 2);
    } else if (cp < 0x10000) {
      out += "\\u";
      append_hex(out, cp, 4);
    } else {
      out += "\\U";
      append_hex(out, cp, 8);
    }
  }
  return out + quote;
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_code_point(s, i);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x80 && cp < 0x10000)) {
      out += "\\u";
      append_hex(out, cp, 4);
    } else if (ensure_ascii && cp >= 0x10000) {  // a surrogate pair, as Python writes it
      const uint32_t v = cp - 0x10000;
      out += "\\u";
      append_hex(out, 0xD800 + (v >> 10), 4);
      out += "\\u";
      append_hex(out, 0xDC00 + (v & 0x3FF), 4);
    } else {
      append_utf8(out, cp);
    }
  }
  return out + "\"";
}

}  // namespace nextn::serve::jinja::text
