#include "io/tokenizer.h"

#include "core/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace nextn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Errors

// Every load error reads "tokenizer 'SOURCE': FIELD: MESSAGE".
[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& msg) {
  throw Error("tokenizer '" + source + "': " + field + ": " + msg);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("tokenizer '" + path + "': cannot open file: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error("tokenizer '" + path + "': read error");
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// UTF-8

struct Utf8Step {
  int len;          // bytes consumed: the character, or the maximal invalid subpart
  bool complete;    // a whole valid character
  bool truncated;   // a valid prefix cut short by the end of the input
  uint32_t cp;      // the code point when complete
};

// One step of UTF-8 decoding at p[0..n), n >= 1. Invalid input is consumed one "maximal subpart"
// at a time (the Unicode / WHATWG convention, also Rust's from_utf8_lossy and JS TextDecoder).
Utf8Step utf8_step(const unsigned char* p, size_t n) {
  const unsigned char b = p[0];
  if (b < 0x80) return {1, true, false, b};
  int need;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
    cp = b & 0x1Fu;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    cp = b & 0x0Fu;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    cp = b & 0x07u;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false, 0};
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= n) return {i, false, true, 0};
    const unsigned char c = p[i];
    if (c < lo || c > hi) return {i, false, false, 0};
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (c & 0x3Fu);
  }
  return {need + 1, true, false, cp};
}

// Byte offset of the first invalid byte, or npos.
size_t utf8_first_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(p + i, n - i);
    if (!st.complete) return i;
    i += static_cast<size_t>(st.len);
  }
  return std::string_view::npos;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Appends `bytes` to `out`, replacing invalid sequences by U+FFFD. When `hold_tail`, a truncated
// (possibly completable) sequence at the end is not consumed; returns the number of bytes held.
size_t append_lossy(std::string_view bytes, std::string& out, bool hold_tail) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0, run = 0;  // [run, i) is a pending run of valid bytes
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(p + i, n - i);
    if (st.complete) {
      i += static_cast<size_t>(st.len);
      continue;
    }
    out.append(bytes.data() + run, i - run);
    if (st.truncated && hold_tail) return n - i;
    out += kReplacement;
    i += static_cast<size_t>(st.len);
    run = i;
  }
  out.append(bytes.data() + run, n - run);
  return 0;
}

size_t utf8_char_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xF0) return 4;
  if (b >= 0xE0) return 3;
  if (b >= 0xC0) return 2;
  return 1;
}


// Code point before byte offset `end` of a valid UTF-8 string (end > 0).
uint32_t cp_before(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + b, end - b).cp;
}

uint32_t cp_at(std::string_view s, size_t pos) {
  return utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + pos, s.size() - pos).cp;
}

// Unicode White_Space (Rust's char::is_whitespace), used for added-token lstrip/rstrip/Strip.
bool is_white_space(uint32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

// A "word character" (\w of Unicode regex engines): Alphabetic, marks, decimal digits,
// connector punctuation, join controls. Used for added tokens' single_word.
bool is_word_char(uint32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t t = u_charType(u);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2): every byte maps to a printable code point; printable ASCII and
// most of Latin-1 map to themselves, the other 68 bytes to U+0100.. in byte order.

struct ByteLevelAlphabet {
  uint32_t byte_to_cp[256];
  std::string byte_to_utf8[256];
  int16_t cp_to_byte[324];  // -1 where unmapped; mapped code points are all < 324

  ByteLevelAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? b : 256 + extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(byte_to_utf8[b], byte_to_cp[b]);
    }
  }
};

const ByteLevelAlphabet& byte_level() {
  static const ByteLevelAlphabet a;
  return a;
}

std::string byte_level_encode(std::string_view raw) {
  const ByteLevelAlphabet& a = byte_level();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) out += a.byte_to_utf8[b];
  return out;
}

// The bytes a byte-level token stands for; when some character is not in the alphabet, the
// token's own UTF-8 bytes (as the `tokenizers` ByteLevel decoder does).
std::string byte_level_decode(std::string_view token) {
  const ByteLevelAlphabet& a = byte_level();
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  size_t i = 0;
  while (i < token.size()) {
    const Utf8Step st = utf8_step(p + i, token.size() - i);
    if (!st.complete || st.cp >= 324 || a.cp_to_byte[st.cp] < 0) return std::string(token);
    out += static_cast<char>(a.cp_to_byte[st.cp]);
    i += static_cast<size_t>(st.len);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 regex (UTF + UCP, JIT when available)

struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jit = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (mctx && jit) pcre2_jit_stack_assign(mctx, nullptr, jit);
  }
  ~MatchScratch() {
    if (jit) pcre2_jit_stack_free(jit);
    if (mctx) pcre2_match_context_free(mctx);
    if (md) pcre2_match_data_free(md);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Unicode White_Space, as a class body. The `tokenizers` library matches with Oniguruma, whose
// \s is exactly this set; PCRE2's \s (with UCP) also matches U+180E MONGOLIAN VOWEL SEPARATOR.
constexpr const char* kWhiteSpaceClass =
    R"(\t-\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s (and \S outside character classes) to the explicit White_Space set.
std::string rewrite_whitespace_escapes(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `p` of the first character after "[" or "[^"
  for (size_t i = 0; i < p.size(); ++i) {
    const char ch = p[i];
    if (ch == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E: copied verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? p.size() : end + 2;
        out.append(p, i, stop - i);
        i = stop - 1;
        continue;
      }
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
        ++i;
        continue;
      }
      if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceClass) + "]";
        ++i;
        continue;
      }
      out += ch;
      out += e;
      ++i;
      continue;
    }
    if (in_class) {
      if (ch == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
        const size_t end = p.find(":]", i + 2);
        if (end != std::string::npos) {
          out.append(p, i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      if (ch == ']' && i != class_start) in_class = false;
      out += ch;
      continue;
    }
    if (ch == '[') {
      in_class = true;
      out += ch;
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_start = i + 1;  // a ']' right here is a literal
      continue;
    }
    out += ch;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern_text, const std::string& source, const std::string& field) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // The pattern as written is compiled first, so that errors point into it.
    for (const std::string& pattern :
         {pattern_text, rewrite_whitespace_escapes(pattern_text)}) {
      if (code_) pcre2_code_free(code_);
      code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
      if (!code_) {
        fail(source, field,
             "invalid regex at offset " + std::to_string(err_off) + ": " + pcre2_message(err) +
                 " (pattern " + json(pattern).dump() + ")");
      }
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // f(begin, end) for each non-overlapping match, left to right; after an empty match the
  // search resumes one character further. `s` must be valid UTF-8.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    MatchScratch& sc = scratch();
    if (!sc.md) throw Error("tokenizer: out of memory (PCRE2 match data)");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t start = 0;
    while (start <= s.size()) {
      int rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, sc.md, sc.mctx);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_) {
        rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         sc.md, sc.mctx);
      }
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) throw Error("tokenizer: regex match failed: " + pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
      const size_t b = ov[0], e = ov[1];
      f(b, e);
      if (e > b) {
        start = e;
      } else {
        if (e >= s.size()) return;
        start = e + utf8_char_len(static_cast<unsigned char>(s[e]));
      }
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// A Split / Replace pattern: {"Regex": "..."} or {"String": "..."} (a literal).
struct Pattern {
  std::unique_ptr<Regex> re;
  std::string literal;

  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    if (re) {
      re->for_each_match(s, f);
      return;
    }
    if (literal.empty()) return;
    size_t pos = 0;
    while ((pos = s.find(literal, pos)) != std::string_view::npos) {
      f(pos, pos + literal.size());
      pos += literal.size();
    }
  }
};

const std::string kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// JSON access helpers

struct Ctx {
  const std::string& source;
};

const json* get_opt(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string get_string(const Ctx& c, const json& obj, const char* key, const std::string& field) {
  const json* v = get_opt(obj, key);
  if (!v || !v->is_string()) fail(c.source, field + "." + key, "expected a string");
  return v->get<std::string>();
}

bool get_bool(const Ctx& c, const json& obj, const char* key, const std::string& field,
              bool dflt) {
  const json* v = get_opt(obj, key);
  if (!v) return dflt;
  if (!v->is_boolean()) fail(c.source, field + "." + key, "expected a boolean");
  return v->get<bool>();
}

Pattern parse_pattern(const Ctx& c, const json& obj, const std::string& field) {
  const json* p = get_opt(obj, "pattern");
  if (!p || !p->is_object()) fail(c.source, field + ".pattern", "expected {\"Regex\"|\"String\": ...}");
  Pattern pat;
  if (const json* r = get_opt(*p, "Regex")) {
    if (!r->is_string()) fail(c.source, field + ".pattern.Regex", "expected a string");
    pat.re = std::make_unique<Regex>(r->get<std::string>(), c.source, field + ".pattern.Regex");
  } else if (const json* s = get_opt(*p, "String")) {
    if (!s->is_string()) fail(c.source, field + ".pattern.String", "expected a string");
    pat.literal = s->get<std::string>();
  } else {
    fail(c.source, field + ".pattern", "expected a \"Regex\" or \"String\" key");
  }
  return pat;
}

// ---------------------------------------------------------------------------------------------
// Normalizers

std::u16string to_utf16(std::string_view s) {
  UErrorCode st = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(nullptr, 0, &len, s.data(), static_cast<int32_t>(s.size()), &st);
  std::u16string out(static_cast<size_t>(len), u'\0');
  st = U_ZERO_ERROR;
  u_strFromUTF8(out.data(), len, &len, s.data(), static_cast<int32_t>(s.size()), &st);
  if (U_FAILURE(st)) throw Error(std::string("tokenizer: UTF-8 to UTF-16: ") + u_errorName(st));
  return out;
}

std::string to_utf8(const std::u16string& s) {
  UErrorCode st = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(nullptr, 0, &len, s.data(), static_cast<int32_t>(s.size()), &st);
  std::string out(static_cast<size_t>(len), '\0');
  st = U_ZERO_ERROR;
  u_strToUTF8(out.data(), len, &len, s.data(), static_cast<int32_t>(s.size()), &st);
  if (U_FAILURE(st)) throw Error(std::string("tokenizer: UTF-16 to UTF-8: ") + u_errorName(st));
  return out;
}

bool is_ascii(std::string_view s) {
  for (unsigned char ch : s) {
    if (ch >= 0x80) return false;
  }
  return true;
}

struct Normalizer {
  enum class Kind { kUnicode, kLowercase, kPrepend, kReplace, kStrip, kSequence };
  Kind kind = Kind::kSequence;
  const UNormalizer2* unorm = nullptr;  // kUnicode
  std::string str;                      // kPrepend: prefix; kReplace: content
  Pattern pattern;                      // kReplace
  bool strip_left = false, strip_right = false;
  std::vector<Normalizer> children;     // kSequence

  void apply(std::string& s) const {
    switch (kind) {
      case Kind::kUnicode: {
        if (is_ascii(s)) return;  // ASCII is invariant under all four forms
        const std::u16string u = to_utf16(s);
        UErrorCode st = U_ZERO_ERROR;
        if (unorm2_isNormalized(unorm, u.data(), static_cast<int32_t>(u.size()), &st) &&
            U_SUCCESS(st)) {
          return;
        }
        st = U_ZERO_ERROR;
        int32_t len = unorm2_normalize(unorm, u.data(), static_cast<int32_t>(u.size()), nullptr,
                                       0, &st);
        std::u16string out(static_cast<size_t>(len), u'\0');
        st = U_ZERO_ERROR;
        len = unorm2_normalize(unorm, u.data(), static_cast<int32_t>(u.size()), out.data(), len,
                               &st);
        if (U_FAILURE(st)) throw Error(std::string("tokenizer: normalization: ") + u_errorName(st));
        s = to_utf8(out);
        return;
      }
      case Kind::kLowercase: {
        if (is_ascii(s)) {
          for (char& ch : s) {
            if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
          }
          return;
        }
        const std::u16string u = to_utf16(s);
        UErrorCode st = U_ZERO_ERROR;
        int32_t len =
            u_strToLower(nullptr, 0, u.data(), static_cast<int32_t>(u.size()), "", &st);
        std::u16string out(static_cast<size_t>(len), u'\0');
        st = U_ZERO_ERROR;
        u_strToLower(out.data(), len, u.data(), static_cast<int32_t>(u.size()), "", &st);
        if (U_FAILURE(st)) throw Error(std::string("tokenizer: lowercase: ") + u_errorName(st));
        s = to_utf8(out);
        return;
      }
      case Kind::kPrepend:
        if (!s.empty()) s.insert(0, str);
        return;
      case Kind::kReplace: {
        std::string out;
        size_t prev = 0;
        pattern.for_each_match(s, [&](size_t b, size_t e) {
          out.append(s, prev, b - prev);
          out += str;
          prev = e;
        });
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        return;
      }
      case Kind::kStrip: {
        size_t b = 0, e = s.size();
        if (strip_left) {
          while (b < e) {
            const size_t l = utf8_char_len(static_cast<unsigned char>(s[b]));
            if (!is_white_space(cp_at(s, b))) break;
            b += l;
          }
        }
        if (strip_right) {
          while (e > b && is_white_space(cp_before(s, e))) {
            do --e;
            while (e > b && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80);
          }
        }
        s = s.substr(b, e - b);
        return;
      }
      case Kind::kSequence:
        for (const Normalizer& n : children) n.apply(s);
        return;
    }
  }
};

Normalizer parse_normalizer(const Ctx& c, const json& j, const std::string& field) {
  if (!j.is_object()) fail(c.source, field, "expected an object");
  const std::string type = get_string(c, j, "type", field);
  Normalizer n;
  UErrorCode st = U_ZERO_ERROR;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    n.kind = Normalizer::Kind::kUnicode;
    if (type == "NFC") n.unorm = unorm2_getNFCInstance(&st);
    if (type == "NFD") n.unorm = unorm2_getNFDInstance(&st);
    if (type == "NFKC") n.unorm = unorm2_getNFKCInstance(&st);
    if (type == "NFKD") n.unorm = unorm2_getNFKDInstance(&st);
    if (U_FAILURE(st) || !n.unorm) {
      fail(c.source, field, "ICU cannot provide " + type + ": " + u_errorName(st));
    }
  } else if (type == "Lowercase") {
    n.kind = Normalizer::Kind::kLowercase;
  } else if (type == "Prepend") {
    n.kind = Normalizer::Kind::kPrepend;
    n.str = get_string(c, j, "prepend", field);
  } else if (type == "Replace") {
    n.kind = Normalizer::Kind::kReplace;
    n.pattern = parse_pattern(c, j, field);
    n.str = get_string(c, j, "content", field);
  } else if (type == "Strip") {
    n.kind = Normalizer::Kind::kStrip;
    n.strip_left = get_bool(c, j, "strip_left", field, true);
    n.strip_right = get_bool(c, j, "strip_right", field, true);
  } else if (type == "Sequence") {
    n.kind = Normalizer::Kind::kSequence;
    const json* list = get_opt(j, "normalizers");
    if (!list || !list->is_array()) fail(c.source, field + ".normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      n.children.push_back(
          parse_normalizer(c, (*list)[i], field + ".normalizers[" + std::to_string(i) + "]"));
    }
  } else {
    fail(c.source, field + ".type", "unsupported normalizer type '" + type + "'");
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  Pattern pattern;  // kSplit; kByteLevel with use_regex: the GPT-2 regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = false;         // kByteLevel
};

Behavior parse_behavior(const Ctx& c, const json& j, const std::string& field) {
  const std::string b = get_string(c, j, "behavior", field);
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  fail(c.source, field + ".behavior", "unknown split behavior '" + b + "'");
}

void parse_pre_tokenizer(const Ctx& c, const json& j, const std::string& field,
                         std::vector<PreTokenizer>& out) {
  if (!j.is_object()) fail(c.source, field, "expected an object");
  const std::string type = get_string(c, j, "type", field);
  if (type == "Sequence") {
    const json* list = get_opt(j, "pretokenizers");
    if (!list || !list->is_array()) fail(c.source, field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      parse_pre_tokenizer(c, (*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", out);
    }
    return;
  }
  PreTokenizer p;
  if (type == "Split") {
    p.kind = PreTokenizer::Kind::kSplit;
    p.pattern = parse_pattern(c, j, field);
    p.behavior = parse_behavior(c, j, field);
    p.invert = get_bool(c, j, "invert", field, false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::Kind::kByteLevel;
    p.add_prefix_space = get_bool(c, j, "add_prefix_space", field, true);
    p.use_regex = get_bool(c, j, "use_regex", field, true);
    if (p.use_regex) p.pattern.re = std::make_unique<Regex>(kGpt2Regex, c.source, field);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Kind::kSplit;
    const bool individual = get_bool(c, j, "individual_digits", field, false);
    p.pattern.re = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", c.source, field);
    p.behavior = Behavior::kIsolated;
  } else if (type == "WhitespaceSplit") {
    p.kind = PreTokenizer::Kind::kSplit;
    p.pattern.re = std::make_unique<Regex>("\\s+", c.source, field);
    p.behavior = Behavior::kRemoved;
  } else {
    fail(c.source, field + ".type", "unsupported pre_tokenizer type '" + type + "'");
  }
  out.push_back(std::move(p));
}

// Splits `s` at the matches of `pat` per the `tokenizers` SplitDelimiterBehavior semantics and
// appends the non-empty pieces to `out`.
void split_piece(std::string_view s, const Pattern& pat, Behavior behavior, bool invert,
                 std::vector<std::string_view>& out) {
  struct Seg {
    size_t b, e;
    bool match;
  };
  thread_local std::vector<Seg> segs;
  segs.clear();
  size_t prev = 0;
  pat.for_each_match(s, [&](size_t b, size_t e) {
    if (prev != b) segs.push_back({prev, b, false});
    segs.push_back({b, e, true});
    prev = e;
  });
  if (prev != s.size()) segs.push_back({prev, s.size(), false});
  if (invert) {
    for (Seg& g : segs) g.match = !g.match;
  }
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(s.substr(b, e - b));
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Seg& g : segs) emit(g.b, g.e);
      return;
    case Behavior::kRemoved:
      for (const Seg& g : segs) {
        if (!g.match) emit(g.b, g.e);
      }
      return;
    case Behavior::kMergedWithPrevious: {
      // A match joins the piece before it, unless that piece was itself a match.
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const Seg& g : segs) {
        if (g.match && !prev_match && !acc.empty()) {
          acc.back().second = g.e;
        } else {
          acc.push_back({g.b, g.e});
        }
        prev_match = g.match;
      }
      for (auto& [b, e] : acc) emit(b, e);
      return;
    }
    case Behavior::kMergedWithNext: {
      // A match joins the piece after it, unless that piece is itself a match.
      std::vector<std::pair<size_t, size_t>> acc;
      bool next_match = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const Seg& g = segs[k];
        if (g.match && !next_match && !acc.empty()) {
          acc.back().first = g.b;
        } else {
          acc.push_back({g.b, g.e});
        }
        next_match = g.match;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k].first, acc[k].second);
      return;
    }
    case Behavior::kContiguous: {
      // Consecutive matches form one piece.
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const Seg& g : segs) {
        if (g.match == prev_match && !acc.empty()) {
          acc.back().second = g.e;
        } else {
          acc.push_back({g.b, g.e});
        }
        prev_match = g.match;
      }
      for (auto& [b, e] : acc) emit(b, e);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matcher over a set of added tokens (a byte trie).
class AddedMatcher {
 public:
  bool empty() const { return count_ == 0; }

  void add(const std::string& content, int32_t index) {
    if (content.empty()) return;
    if (nodes_.empty()) nodes_.emplace_back();
    int32_t n = 0;
    for (unsigned char b : content) {
      int32_t next = child(n, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(n)].next.push_back({b, next});
        nodes_.emplace_back();
      }
      n = next;
    }
    nodes_[static_cast<size_t>(n)].token = index;
    first_[static_cast<unsigned char>(content[0])] = true;
    ++count_;
  }

  // Longest token starting at s[pos]: {index, end} or {-1, pos}.
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const {
    int32_t best = -1;
    size_t best_end = pos;
    int32_t n = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      n = child(n, static_cast<unsigned char>(s[i]));
      if (n < 0) break;
      if (nodes_[static_cast<size_t>(n)].token >= 0) {
        best = nodes_[static_cast<size_t>(n)].token;
        best_end = i + 1;
      }
    }
    return {best, best_end};
  }

  bool may_start(unsigned char b) const { return first_[b]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;
  };
  int32_t child(int32_t n, unsigned char b) const {
    for (const auto& [k, v] : nodes_[static_cast<size_t>(n)].next) {
      if (k == b) return v;
    }
    return -1;
  }
  std::vector<Node> nodes_;
  bool first_[256] = {};
  size_t count_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Transparent string hashing (lookups by string_view without allocating)

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <class V>
using StrMap = std::unordered_map<std::string, V, SvHash, std::equal_to<>>;

}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  append_lossy(bytes, out, /*hold_tail=*/false);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer::Impl

struct Tokenizer::Impl {
  std::string source;

  // Model (BPE).
  StrMap<int32_t> vocab;
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  std::unordered_map<uint64_t, Merge> merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string subword_prefix, word_suffix;
  int32_t byte_ids[256];  // vocabulary id of each byte's byte-level character, -1 if absent

  // Id space.
  std::vector<uint32_t> tok_off;  // id -> [tok_off[id], tok_off[id+1]) in tok_blob
  std::string tok_blob;           // token strings (vocabulary form)
  std::vector<uint32_t> bytes_off;
  std::string bytes_blob;         // decoded bytes per id
  std::vector<uint8_t> flags;     // bit 0: known id, bit 1: special

  // Added tokens.
  std::vector<AddedToken> added;
  StrMap<int32_t> added_by_content;  // content -> id
  AddedMatcher raw_matcher, norm_matcher;

  // Pipeline.
  std::unique_ptr<Normalizer> normalizer;
  std::vector<PreTokenizer> pre_tokenizers;
  bool byte_level_decoder = false;

  // Post-processing.
  struct TemplateItem {
    bool sequence;
    std::vector<int32_t> ids;
  };
  bool has_template = false;
  std::vector<TemplateItem> single_template;
  bool add_bos = false, add_eos = false;
  int32_t bos = -1, eos = -1, pad = -1;

  // BPE cache: word (as fed to BPE) -> ids.
  mutable std::mutex cache_mu;
  mutable StrMap<std::vector<int32_t>> cache;
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheMaxEntries = 1 << 18;

  int32_t lookup(std::string_view tok) const {
    auto it = vocab.find(tok);
    return it == vocab.end() ? -1 : it->second;
  }

  void load(const json& root, const json* config);
  void load_model(const Ctx& c, const json& model);
  void load_added_tokens(const Ctx& c, const json& list);
  void load_post_processor(const Ctx& c, const json& pp, const std::string& field);
  void load_decoder(const Ctx& c, const json& d, const std::string& field);
  void load_config(const json& cfg);
  void check_id_bounds() const;
  void build_id_tables();
  bool known(int32_t id) const;
  // Throws Error naming `caller`, the id and the vocabulary size when `id` is not a token.
  void check_known(int32_t id, const char* caller) const;

  void encode_section(std::string_view raw, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view s, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view word, bool raw_bytes, std::vector<int32_t>& out) const;
  void bpe_merge(std::vector<int32_t>& symbols) const;
  void split_added(const AddedMatcher& m, std::string_view s,
                   const std::function<void(std::string_view)>& on_text,
                   std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::load_model(const Ctx& c, const json& model) {
  if (!model.is_object()) fail(c.source, "model", "expected an object");
  std::string type;
  if (const json* t = get_opt(model, "type")) {
    if (!t->is_string()) fail(c.source, "model.type", "expected a string");
    type = t->get<std::string>();
  } else if (get_opt(model, "merges")) {
    type = "BPE";  // untagged (older files)
  }
  if (type != "BPE") {
    fail(c.source, "model.type",
         "unsupported model type '" + type + "' (only BPE is supported)");
  }
  if (get_bool(c, model, "byte_fallback", "model", false)) {
    fail(c.source, "model.byte_fallback", "byte_fallback=true is not supported");
  }
  ignore_merges = get_bool(c, model, "ignore_merges", "model", false);
  fuse_unk = get_bool(c, model, "fuse_unk", "model", false);
  if (const json* p = get_opt(model, "continuing_subword_prefix")) {
    if (!p->is_string()) fail(c.source, "model.continuing_subword_prefix", "expected a string");
    subword_prefix = p->get<std::string>();
  }
  if (const json* p = get_opt(model, "end_of_word_suffix")) {
    if (!p->is_string()) fail(c.source, "model.end_of_word_suffix", "expected a string");
    word_suffix = p->get<std::string>();
  }

  const json* v = get_opt(model, "vocab");
  if (!v || !v->is_object()) fail(c.source, "model.vocab", "expected an object {token: id}");
  vocab.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX - 1) {
      fail(c.source, "model.vocab[\"" + it.key() + "\"]", "expected a non-negative integer id");
    }
    vocab.emplace(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
  }

  if (const json* u = get_opt(model, "unk_token")) {
    if (!u->is_string()) fail(c.source, "model.unk_token", "expected a string");
    unk_id = lookup(u->get<std::string>());
    if (unk_id < 0) {
      fail(c.source, "model.unk_token",
           "'" + u->get<std::string>() + "' is not in the vocabulary");
    }
  }

  const json* m = get_opt(model, "merges");
  if (!m || !m->is_array()) fail(c.source, "model.merges", "expected an array");
  merges.reserve(m->size());
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string field = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        fail(c.source, field, "expected \"left right\" (two tokens separated by one space), got '" +
                                  s + "'");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail(c.source, field, "expected \"left right\" or [\"left\", \"right\"]");
    }
    const int32_t ia = lookup(a), ib = lookup(b);
    if (ia < 0) fail(c.source, field, "token '" + a + "' is not in the vocabulary");
    if (ib < 0) fail(c.source, field, "token '" + b + "' is not in the vocabulary");
    std::string merged = a;
    if (!subword_prefix.empty() && b.compare(0, subword_prefix.size(), subword_prefix) == 0) {
      merged.append(b, subword_prefix.size(), std::string::npos);
    } else {
      merged += b;
    }
    const int32_t im = lookup(merged);
    if (im < 0) fail(c.source, field, "merged token '" + merged + "' is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) |
                         static_cast<uint32_t>(ib);
    merges.emplace(key, Merge{static_cast<int32_t>(i), im});  // first occurrence wins
  }

  const ByteLevelAlphabet& bl = byte_level();
  for (int b = 0; b < 256; ++b) byte_ids[b] = lookup(bl.byte_to_utf8[b]);
}

void Tokenizer::Impl::load_added_tokens(const Ctx& c, const json& list) {
  if (!list.is_array()) fail(c.source, "added_tokens", "expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) fail(c.source, field, "expected an object");
    AddedToken a;
    a.content = get_string(c, t, "content", field);
    const json* id = get_opt(t, "id");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX - 1) {
      fail(c.source, field + ".id", "expected a non-negative integer");
    }
    a.id = static_cast<int32_t>(id->get<int64_t>());
    a.special = get_bool(c, t, "special", field, false);
    a.lstrip = get_bool(c, t, "lstrip", field, false);
    a.rstrip = get_bool(c, t, "rstrip", field, false);
    a.single_word = get_bool(c, t, "single_word", field, false);
    a.normalized = get_bool(c, t, "normalized", field, !a.special);
    if (a.content.empty()) fail(c.source, field + ".content", "empty token");
    if (utf8_first_invalid(a.content) != std::string_view::npos) {
      fail(c.source, field + ".content", "not valid UTF-8");
    }
    added_by_content[a.content] = a.id;
    added.push_back(std::move(a));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    (added[i].normalized ? norm_matcher : raw_matcher)
        .add(added[i].content, static_cast<int32_t>(i));
  }
}

void Tokenizer::Impl::load_post_processor(const Ctx& c, const json& pp, const std::string& field) {
  if (!pp.is_object()) fail(c.source, field, "expected an object");
  const std::string type = get_string(c, pp, "type", field);
  auto token_id = [&](const std::string& tok, const std::string& f) {
    auto a = added_by_content.find(tok);
    if (a != added_by_content.end()) return a->second;
    const int32_t id = lookup(tok);
    if (id < 0) fail(c.source, f, "token '" + tok + "' is not in the vocabulary");
    return id;
  };
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json* list = get_opt(pp, "processors");
    if (!list || !list->is_array()) fail(c.source, field + ".processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      load_post_processor(c, (*list)[i], field + ".processors[" + std::to_string(i) + "]");
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const json* single = get_opt(pp, "single");
    if (!single || !single->is_array()) fail(c.source, field + ".single", "expected an array");
    const json* specials = get_opt(pp, "special_tokens");
    has_template = true;
    single_template.clear();
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string f = field + ".single[" + std::to_string(i) + "]";
      if (const json* seq = get_opt(item, "Sequence")) {
        const std::string which = get_string(c, *seq, "id", f + ".Sequence");
        if (which != "A") fail(c.source, f + ".Sequence.id", "expected \"A\" in a single template");
        single_template.push_back({true, {}});
      } else if (const json* sp = get_opt(item, "SpecialToken")) {
        const std::string name = get_string(c, *sp, "id", f + ".SpecialToken");
        TemplateItem ti{false, {}};
        const json* entry = specials ? get_opt(*specials, name.c_str()) : nullptr;
        if (entry) {
          const json* ids = get_opt(*entry, "ids");
          if (!ids || !ids->is_array()) {
            fail(c.source, field + ".special_tokens[\"" + name + "\"].ids", "expected an array");
          }
          for (const json& x : *ids) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0) {
              fail(c.source, field + ".special_tokens[\"" + name + "\"].ids",
                   "expected non-negative integers");
            }
            ti.ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
          }
        } else {
          ti.ids.push_back(token_id(name, f + ".SpecialToken.id"));
        }
        single_template.push_back(std::move(ti));
      } else {
        fail(c.source, f, "expected a \"Sequence\" or \"SpecialToken\" item");
      }
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto pair = [&](const char* key) {
      const json* p = get_opt(pp, key);
      if (!p || !p->is_array() || p->size() != 2 || !(*p)[0].is_string()) {
        fail(c.source, field + "." + key, "expected [token, id]");
      }
      return token_id((*p)[0].get<std::string>(), field + "." + key);
    };
    has_template = true;
    single_template = {{false, {pair("cls")}}, {true, {}}, {false, {pair("sep")}}};
    return;
  }
  fail(c.source, field + ".type", "unsupported post_processor type '" + type + "'");
}

void Tokenizer::Impl::load_decoder(const Ctx& c, const json& d, const std::string& field) {
  if (!d.is_object()) fail(c.source, field, "expected an object");
  const std::string type = get_string(c, d, "type", field);
  if (type == "ByteLevel") {
    byte_level_decoder = true;
  } else if (type == "Sequence") {
    const json* list = get_opt(d, "decoders");
    if (!list || !list->is_array()) fail(c.source, field + ".decoders", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      load_decoder(c, (*list)[i], field + ".decoders[" + std::to_string(i) + "]");
    }
  } else {
    fail(c.source, field + ".type", "unsupported decoder type '" + type + "'");
  }
}

// The id tables are dense (a few dozen bytes per id up to the largest), so one id far beyond the number of
// entries would make a small file allocate gigabytes. Real vocabularies are dense up to small gaps, so an
// id must stay below twice the number of entries plus a margin.
void Tokenizer::Impl::check_id_bounds() const {
  constexpr int64_t kIdMargin = 1024;
  const int64_t entries = static_cast<int64_t>(vocab.size() + added.size());
  const int64_t limit = 2 * entries + kIdMargin;
  auto too_far = [&](int64_t id) {
    return "id " + std::to_string(id) + " is far beyond the vocabulary (" + std::to_string(entries) +
           " entries: ids must be below " + std::to_string(limit) + ")";
  };
  for (const auto& [tok, id] : vocab)
    if (id >= limit) fail(source, "model.vocab[\"" + tok + "\"]", too_far(id));
  for (size_t i = 0; i < added.size(); ++i)
    if (added[i].id >= limit) fail(source, "added_tokens[" + std::to_string(i) + "].id", too_far(added[i].id));
}

void Tokenizer::Impl::build_id_tables() {
  check_id_bounds();
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& a : added) max_id = std::max<int64_t>(max_id, a.id);
  const size_t n = static_cast<size_t>(max_id + 1);
  std::vector<std::string_view> toks(n);
  flags.assign(n, 0);
  for (const auto& [tok, id] : vocab) {
    toks[static_cast<size_t>(id)] = tok;
    flags[static_cast<size_t>(id)] = 1;
  }
  std::vector<int8_t> is_added(n, 0);
  for (const AddedToken& a : added) {
    toks[static_cast<size_t>(a.id)] = a.content;
    flags[static_cast<size_t>(a.id)] = static_cast<uint8_t>(1 | (a.special ? 2 : 0));
    is_added[static_cast<size_t>(a.id)] = 1;
  }
  tok_off.assign(n + 1, 0);
  bytes_off.assign(n + 1, 0);
  tok_blob.clear();
  bytes_blob.clear();
  for (size_t id = 0; id < n; ++id) {
    tok_off[id] = static_cast<uint32_t>(tok_blob.size());
    bytes_off[id] = static_cast<uint32_t>(bytes_blob.size());
    tok_blob += toks[id];
    // Added tokens decode to their content; model tokens through the decoder.
    if (is_added[id] || !byte_level_decoder) {
      bytes_blob += toks[id];
    } else {
      bytes_blob += byte_level_decode(toks[id]);
    }
  }
  tok_off[n] = static_cast<uint32_t>(tok_blob.size());
  bytes_off[n] = static_cast<uint32_t>(bytes_blob.size());
}

void Tokenizer::Impl::load_config(const json& cfg) {
  const Ctx c{source};
  if (!cfg.is_object()) fail(source, "tokenizer_config.json", "expected a JSON object");
  auto token = [&](const char* key) -> int32_t {
    const json* v = get_opt(cfg, key);
    if (!v) return -1;
    std::string content;
    if (v->is_string()) {
      content = v->get<std::string>();
    } else if (v->is_object()) {
      content = get_string(c, *v, "content", std::string("tokenizer_config.json.") + key);
    } else {
      fail(source, std::string("tokenizer_config.json.") + key,
           "expected a string or {\"content\": ...}");
    }
    auto a = added_by_content.find(content);
    if (a != added_by_content.end()) return a->second;
    const int32_t id = lookup(content);
    if (id < 0) {
      fail(source, std::string("tokenizer_config.json.") + key,
           "'" + content + "' is not a token of the vocabulary");
    }
    return id;
  };
  bos = token("bos_token");
  eos = token("eos_token");
  pad = token("pad_token");
  add_bos = get_bool(c, cfg, "add_bos_token", "tokenizer_config.json", false);
  add_eos = get_bool(c, cfg, "add_eos_token", "tokenizer_config.json", false);
}

void Tokenizer::Impl::load(const json& root, const json* config) {
  const Ctx c{source};
  if (!root.is_object()) fail(source, "(root)", "expected a JSON object");
  const json* model = get_opt(root, "model");
  if (!model) fail(source, "model", "missing");
  load_model(c, *model);
  if (const json* a = get_opt(root, "added_tokens")) load_added_tokens(c, *a);
  if (const json* n = get_opt(root, "normalizer")) {
    normalizer = std::make_unique<Normalizer>(parse_normalizer(c, *n, "normalizer"));
  }
  if (const json* p = get_opt(root, "pre_tokenizer")) {
    parse_pre_tokenizer(c, *p, "pre_tokenizer", pre_tokenizers);
  }
  if (const json* d = get_opt(root, "decoder")) load_decoder(c, *d, "decoder");
  if (const json* pp = get_opt(root, "post_processor")) load_post_processor(c, *pp, "post_processor");
  build_id_tables();
  if (config) load_config(*config);
}

// Splits `s` around the added tokens of `m`: token ids go to `out`, the text between them to
// `on_text` (in order). Semantics of the `tokenizers` AddedVocabulary: leftmost-longest,
// single_word matches that touch a word character are dropped (their text stays plain text),
// lstrip/rstrip swallow the whitespace on that side.
void Tokenizer::Impl::split_added(const AddedMatcher& m, std::string_view s,
                                  const std::function<void(std::string_view)>& on_text,
                                  std::vector<int32_t>& out) const {
  if (m.empty()) {
    on_text(s);
    return;
  }
  size_t text_begin = 0, i = 0;
  while (i < s.size()) {
    if (!m.may_start(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    const auto [idx, end] = m.longest_at(s, i);
    if (idx < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = added[static_cast<size_t>(idx)];
    size_t start = i, stop = end;
    if (t.single_word) {
      const bool left_ok = start == 0 || !is_word_char(cp_before(s, start));
      const bool right_ok = stop == s.size() || !is_word_char(cp_at(s, stop));
      if (!left_ok || !right_ok) {
        i = end;
        continue;
      }
    }
    if (t.lstrip) {
      while (start > text_begin && is_white_space(cp_before(s, start))) {
        do --start;
        while (start > text_begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80);
      }
    }
    if (t.rstrip) {
      while (stop < s.size() && is_white_space(cp_at(s, stop))) {
        stop += utf8_char_len(static_cast<unsigned char>(s[stop]));
      }
    }
    if (start > text_begin) on_text(s.substr(text_begin, start - text_begin));
    out.push_back(t.id);
    text_begin = i = stop;
  }
  if (text_begin < s.size()) on_text(s.substr(text_begin));
}

void Tokenizer::Impl::encode_section(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  std::string norm;
  std::string_view s = raw;
  if (normalizer) {
    norm.assign(raw);
    normalizer->apply(norm);
    s = norm;
  }
  if (s.empty()) return;
  if (norm_matcher.empty()) {
    encode_normalized(s, out);
  } else {
    split_added(norm_matcher, s, [&](std::string_view t) { encode_normalized(t, out); }, out);
  }
}

void Tokenizer::Impl::encode_normalized(std::string_view s, std::vector<int32_t>& out) const {
  // Pieces point into `s` or into `store` (a deque: elements never move).
  std::deque<std::string> store;
  std::vector<std::string_view> pieces{s}, next;
  bool raw_bytes = false;  // a ByteLevel step ran: pieces still hold raw bytes, not yet mapped
  auto materialize = [&]() {
    if (!raw_bytes) return;
    for (std::string_view& p : pieces) {
      store.push_back(byte_level_encode(p));
      p = store.back();
    }
    raw_bytes = false;
  };
  for (const PreTokenizer& pt : pre_tokenizers) {
    materialize();
    next.clear();
    if (pt.kind == PreTokenizer::Kind::kSplit) {
      for (std::string_view p : pieces) split_piece(p, pt.pattern, pt.behavior, pt.invert, next);
    } else {
      for (std::string_view p : pieces) {
        if (pt.add_prefix_space && p.front() != ' ') {
          store.push_back(" " + std::string(p));
          p = store.back();
        }
        if (pt.use_regex) {
          split_piece(p, pt.pattern, Behavior::kIsolated, false, next);
        } else {
          next.push_back(p);
        }
      }
      raw_bytes = true;
    }
    pieces.swap(next);
  }
  for (std::string_view p : pieces) bpe_word(p, raw_bytes, out);
}

// Applies the merges to `sym` (ids), lowest rank first, leftmost first among equal ranks.
void Tokenizer::Impl::bpe_merge(std::vector<int32_t>& sym) const {
  const size_t n = sym.size();
  if (n < 2) return;
  struct Cand {
    int32_t rank, pos, left, right, merged;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<int32_t> next_of, prev_of;
  thread_local std::vector<Cand> heap;
  next_of.resize(n);
  prev_of.resize(n);
  heap.clear();
  for (size_t k = 0; k < n; ++k) {
    next_of[k] = k + 1 < n ? static_cast<int32_t>(k + 1) : -1;
    prev_of[k] = static_cast<int32_t>(k) - 1;
  }
  auto consider = [&](int32_t pos) {
    const int32_t r = next_of[static_cast<size_t>(pos)];
    if (r < 0) return;
    const int32_t a = sym[static_cast<size_t>(pos)], b = sym[static_cast<size_t>(r)];
    if (a < 0 || b < 0) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                         static_cast<uint32_t>(b);
    auto it = merges.find(key);
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, pos, a, b, it->second.id});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (size_t k = 0; k + 1 < n; ++k) consider(static_cast<int32_t>(k));
  constexpr int32_t kDead = -2;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Cand c = heap.back();
    heap.pop_back();
    const size_t p = static_cast<size_t>(c.pos);
    if (sym[p] != c.left) continue;
    const int32_t r = next_of[p];
    if (r < 0 || sym[static_cast<size_t>(r)] != c.right) continue;
    sym[p] = c.merged;
    sym[static_cast<size_t>(r)] = kDead;
    const int32_t rn = next_of[static_cast<size_t>(r)];
    next_of[p] = rn;
    if (rn >= 0) prev_of[static_cast<size_t>(rn)] = c.pos;
    if (prev_of[p] >= 0) consider(prev_of[p]);
    consider(c.pos);
  }
  size_t w = 0;
  for (size_t k = 0; k < n; ++k) {
    if (sym[k] != kDead) sym[w++] = sym[k];
  }
  sym.resize(w);
}

// BPE of one pre-token. `raw_bytes`: `word` holds raw bytes whose byte-level form is the token
// string; otherwise `word` is already in vocabulary form.
void Tokenizer::Impl::bpe_word(std::string_view word, bool raw_bytes,
                               std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::string mapped;
  std::string_view form = word;  // vocabulary form
  const bool fast = raw_bytes && subword_prefix.empty() && word_suffix.empty();
  if (raw_bytes && (!fast || ignore_merges)) {
    mapped = byte_level_encode(word);
    form = mapped;
  }
  std::vector<int32_t> ids;
  const int32_t whole = ignore_merges ? lookup(form) : -1;
  if (whole >= 0) {
    ids.push_back(whole);
  } else {
    // Initial symbols: one per byte (fast byte-level path) or per character.
    std::vector<int32_t> sym;
    auto push_unknown = [&]() {
      if (unk_id < 0) return;  // dropped, as `tokenizers` does without an unk token
      if (fuse_unk && !sym.empty() && sym.back() == unk_id) return;
      sym.push_back(unk_id);
    };
    if (fast) {
      sym.reserve(word.size());
      for (unsigned char b : word) {
        if (byte_ids[b] >= 0) {
          sym.push_back(byte_ids[b]);
        } else {
          push_unknown();
        }
      }
    } else {
      std::string buf;
      size_t k = 0;
      while (k < form.size()) {
        const size_t len = std::min(utf8_char_len(static_cast<unsigned char>(form[k])),
                                    form.size() - k);
        buf.clear();
        if (k > 0) buf += subword_prefix;
        buf.append(form.substr(k, len));
        if (k + len == form.size()) buf += word_suffix;
        const int32_t id = lookup(buf);
        if (id >= 0) {
          sym.push_back(id);
        } else {
          push_unknown();
        }
        k += len;
      }
    }
    bpe_merge(sym);
    ids = std::move(sym);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

json parse_json_text(std::string_view text, const std::string& source, const std::string& what) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error("tokenizer '" + source + "': " + what + ": invalid JSON: " + e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json,
                               std::string_view tokenizer_config_json, const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  const json root = parse_json_text(tokenizer_json, source, "tokenizer.json");
  json cfg;
  const bool has_cfg = !tokenizer_config_json.empty();
  if (has_cfg) cfg = parse_json_text(tokenizer_config_json, source, "tokenizer_config.json");
  impl->load(root, has_cfg ? &cfg : nullptr);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  return from_json(read_text_file(tokenizer_json_path), {}, tokenizer_json_path);
}

Tokenizer Tokenizer::from_dir(const std::string& model_dir) {
  const std::string tj = (fs::path(model_dir) / "tokenizer.json").string();
  const std::string cj = (fs::path(model_dir) / "tokenizer_config.json").string();
  const std::string tokenizer_text = read_text_file(tj);
  std::error_code ec;
  if (!fs::exists(cj, ec)) return from_json(tokenizer_text, {}, tj);
  const std::string config_text = read_text_file(cj);
  // Name the file at fault: tokenizer.json errors mention tj, config errors cj.
  auto impl = std::make_unique<Impl>();
  impl->source = tj;
  const json root = parse_json_text(tokenizer_text, tj, "tokenizer.json");
  const json cfg = parse_json_text(config_text, cj, "tokenizer_config.json");
  impl->load(root, nullptr);
  impl->source = cj;
  impl->load_config(cfg);
  impl->source = tj;
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  const Impl& m = *impl_;
  const size_t bad = utf8_first_invalid(text);
  if (bad != std::string_view::npos) {
    throw Error("Tokenizer::encode: input is not valid UTF-8 (byte offset " + std::to_string(bad) +
                ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  m.split_added(m.raw_matcher, text, [&](std::string_view t) { m.encode_section(t, ids); }, ids);
  if (!add_special) return ids;
  if (m.has_template) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Impl::TemplateItem& it : m.single_template) {
      if (it.sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), it.ids.begin(), it.ids.end());
      }
    }
    return out;
  }
  if (m.add_bos && m.bos >= 0) ids.insert(ids.begin(), m.bos);
  if (m.add_eos && m.eos >= 0) ids.push_back(m.eos);
  return ids;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.flags.size() || !(m.flags[static_cast<size_t>(id)] & 1)) {
    return {};
  }
  const size_t b = m.bytes_off[static_cast<size_t>(id)], e = m.bytes_off[static_cast<size_t>(id) + 1];
  return std::string_view(m.bytes_blob).substr(b, e - b);
}

bool Tokenizer::Impl::known(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < flags.size() && (flags[static_cast<size_t>(id)] & 1);
}

void Tokenizer::Impl::check_known(int32_t id, const char* caller) const {
  if (known(id)) return;
  throw Error(std::string(caller) + ": token id " + std::to_string(id) + " is not in the vocabulary of '" +
              source + "' (vocabulary size " + std::to_string(flags.size()) + ")");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    impl_->check_known(id, "Tokenizer::decode");
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  std::string out;
  out.reserve(bytes.size());
  append_lossy(bytes, out, false);
  return out;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  return impl_->lookup(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.flags.size() || !(m.flags[static_cast<size_t>(id)] & 1)) {
    return {};
  }
  const size_t b = m.tok_off[static_cast<size_t>(id)], e = m.tok_off[static_cast<size_t>(id) + 1];
  return m.tok_blob.substr(b, e - b);
}

size_t Tokenizer::vocab_size() const { return impl_->flags.size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }

bool Tokenizer::is_special(int32_t id) const {
  const Impl& m = *impl_;
  return id >= 0 && static_cast<size_t>(id) < m.flags.size() &&
         (m.flags[static_cast<size_t>(id)] & 2) != 0;
}

// ---------------------------------------------------------------------------------------------
// StreamingDecoder

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(&tokenizer), skip_special_(skip_special) {}

std::string StreamingDecoder::push(int32_t id) {
  tok_->impl_->check_known(id, "StreamingDecoder::push");
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += tok_->token_bytes(id);
  std::string out;
  const size_t held = append_lossy(pending_, out, true);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  append_lossy(pending_, out, false);
  pending_.clear();
  return out;
}

}  // namespace nextn
