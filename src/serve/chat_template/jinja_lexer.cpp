#include "serve/chat_template/jinja_lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "serve/chat_template/jinja_text.h"

namespace nextn::serve::jinja {
namespace {

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_ascii_digit(c); }
bool is_hex_digit(char c) { return is_ascii_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

// Jinja reads the source with its newlines normalized to "\n" and, keep_trailing_newline being off, without
// one final newline.
std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Length of the Python-whitespace run at s[pos] (what `\s*` matches after a `-%}`).
size_t whitespace_run(std::string_view s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    size_t next = i;
    if (!text::is_space(text::next_code_point(s, next))) break;
    i = next;
  }
  return i - pos;
}

// Python's str.rstrip(): the text before a `{%-` / `{{-` / `{#-` loses its trailing whitespace.
std::string rstrip_whitespace(std::string_view s) { return text::strip(s, std::nullopt, false, true); }

// Python's unicode-escape decoding of a string literal's body, which is what Jinja applies.
class StringDecoder {
 public:
  StringDecoder(std::string_view body, int line) : body_(body), line_(line) {}

  std::string decode() {
    std::string out;
    for (size_t i = 0; i < body_.size();) {
      if (body_[i] != '\\' || i + 1 >= body_.size()) {
        out += body_[i++];
        continue;
      }
      i = escape(i + 1, out);
    }
    return out;
  }

 private:
  // Decodes the escape whose letter is at body_[i]; returns the index after it.
  size_t escape(size_t i, std::string& out) {
    const char c = body_[i];
    switch (c) {
      case '\n': return i + 1;  // a backslash-newline continues the line
      case '\\': out += '\\'; return i + 1;
      case '\'': out += '\''; return i + 1;
      case '"': out += '"'; return i + 1;
      case 'a': out += '\a'; return i + 1;
      case 'b': out += '\b'; return i + 1;
      case 'f': out += '\f'; return i + 1;
      case 'n': out += '\n'; return i + 1;
      case 'r': out += '\r'; return i + 1;
      case 't': out += '\t'; return i + 1;
      case 'v': out += '\v'; return i + 1;
      case 'x': return hex_escape(i + 1, 2, out);
      case 'u': return hex_escape(i + 1, 4, out);
      case 'U': return hex_escape(i + 1, 8, out);
      case 'N': throw SyntaxError(line_, "unsupported string escape '\\N{...}'");
      default: break;
    }
    if (c >= '0' && c <= '7') {
      uint32_t value = 0;
      size_t k = i;
      for (; k < body_.size() && k < i + 3 && body_[k] >= '0' && body_[k] <= '7'; ++k) value = value * 8 + (body_[k] - '0');
      text::append_utf8(out, value);
      return k;
    }
    out += '\\';  // an unknown escape keeps its backslash, as in Python
    return i;
  }

  size_t hex_escape(size_t i, size_t digits, std::string& out) {
    if (i + digits > body_.size() || !std::all_of(body_.begin() + i, body_.begin() + i + digits, is_hex_digit))
      throw SyntaxError(line_, "truncated \\" + std::string(1, body_[i - 1]) + " escape in a string literal");
    const uint32_t value = static_cast<uint32_t>(std::strtoul(std::string(body_.substr(i, digits)).c_str(), nullptr, 16));
    if (value > 0x10FFFF) throw SyntaxError(line_, "string escape out of the Unicode range");
    text::append_utf8(out, value);
    return i + digits;
  }

  std::string_view body_;
  int line_;
};

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_source(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_text_and_tag();
    tokens_.push_back(Token{TokenKind::End, "", line_});
    return std::move(tokens_);
  }

 private:
  void advance_to(size_t pos) {
    line_ += static_cast<int>(std::count(src_.begin() + pos_, src_.begin() + pos, '\n'));
    pos_ = pos;
  }
  bool at(std::string_view s) const { return src_.compare(pos_, s.size(), s) == 0; }
  void push(TokenKind kind, std::string text, int line) { tokens_.push_back(Token{kind, std::move(text), line}); }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  void lex_text_and_tag() {
    const size_t tag = find_tag_start(pos_);
    if (tag == std::string::npos) {
      push(TokenKind::Text, src_.substr(pos_), line_);
      advance_to(src_.size());
      return;
    }
    const char kind = src_[tag + 1];
    const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    std::string text = src_.substr(pos_, tag - pos_);
    strip_before_tag(text, kind, sign);
    if (!text.empty()) push(TokenKind::Text, std::move(text), line_);
    advance_to(tag);
    const int tag_line = line_;
    advance_to(tag + 2 + (sign ? 1 : 0));
    if (kind == '#')
      lex_comment(tag_line);
    else
      lex_tag(kind, tag_line);
  }

  // `{%-` strips all whitespace before the tag; lstrip_blocks strips the spaces and tabs between a line's
  // start and a `{%` or `{#` (not a `{{`) when nothing else precedes it on that line; `{%+` keeps them.
  void strip_before_tag(std::string& text, char kind, char sign) const {
    if (sign == '-') {
      text = rstrip_whitespace(text);
      return;
    }
    if (sign == '+' || kind == '{') return;
    const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (line_start == 0 && !line_starting_) return;
    if (line_start < text.size() && whitespace_run(text, line_start) == text.size() - line_start)
      text.resize(line_start);
  }

  // After a `-%}` / `-}}` / `-#}` the following whitespace goes; after a plain `%}` or `#}` (trim_blocks) one
  // newline does.
  void finish_tag(size_t end, bool strip_whitespace, bool trim_newline) {
    if (strip_whitespace) end += whitespace_run(src_, end);
    if (trim_newline && end < src_.size() && src_[end] == '\n') ++end;
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    advance_to(end);
  }

  void lex_comment(int tag_line) {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) throw SyntaxError(tag_line, "the comment opened here is never closed ('#}')");
    const char sign = close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    finish_tag(close + 2, sign == '-', sign == 0);
  }

  void reject_raw_block(int tag_line) const {
    size_t i = pos_;
    while (i < src_.size() && (src_[i] == ' ' || src_[i] == '\t' || src_[i] == '\n')) ++i;
    if (src_.compare(i, 3, "raw") == 0 && (i + 3 >= src_.size() || !is_name_char(src_[i + 3])))
      throw SyntaxError(tag_line, "unsupported statement 'raw'");
  }

  void lex_tag(char kind, int tag_line) {
    const bool statement = kind == '%';
    push(statement ? TokenKind::StatementBegin : TokenKind::PrintBegin, statement ? "{%" : "{{", tag_line);
    if (statement) reject_raw_block(tag_line);
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= src_.size())
        throw SyntaxError(tag_line, std::string("the tag opened here is never closed (expected '") +
                                        (statement ? "%}" : "}}") + "')");
      if (brackets.empty() && lex_tag_end(statement)) return;
      lex_token(brackets);
    }
  }

  bool lex_tag_end(bool statement) {
    const TokenKind kind = statement ? TokenKind::StatementEnd : TokenKind::PrintEnd;
    const std::string_view close = statement ? "%}" : "}}";
    const bool minus = src_.compare(pos_, 1, "-") == 0 && src_.compare(pos_ + 1, 2, close) == 0;
    const bool plus = statement && src_.compare(pos_, 1, "+") == 0 && src_.compare(pos_ + 1, 2, close) == 0;
    if (!minus && !plus && !at(close)) return false;
    push(kind, std::string(close), line_);
    finish_tag(pos_ + close.size() + (minus || plus ? 1 : 0), minus, statement && !minus && !plus);
    return true;
  }

  void lex_token(std::vector<char>& brackets) {
    const char c = src_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      advance_to(pos_ + 1);
    } else if (c == '\'' || c == '"') {
      lex_string(c);
    } else if (is_ascii_digit(c)) {
      lex_number();
    } else if (is_name_start(c)) {
      size_t end = pos_;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      push(TokenKind::Name, src_.substr(pos_, end - pos_), line_);
      advance_to(end);
    } else {
      lex_operator(brackets);
    }
  }

  void lex_string(char quote) {
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size()) throw SyntaxError(line_, "unterminated string literal");
    const std::string_view body = std::string_view(src_).substr(pos_ + 1, i - pos_ - 1);
    push(TokenKind::String, StringDecoder(body, line_).decode(), line_);
    advance_to(i + 1);
  }

  // `(\d+_)*\d+`: digits, single underscores between them. Returns the end, or `from` when none.
  size_t scan_digits(size_t from) const {
    size_t i = from;
    while (i < src_.size() && is_ascii_digit(src_[i])) {
      ++i;
      if (i + 1 < src_.size() && src_[i] == '_' && is_ascii_digit(src_[i + 1])) ++i;
    }
    return i;
  }

  // A float's fraction / exponent after the integer digits ending at `i`, or `i` when it has neither.
  size_t scan_float_tail(size_t i) const {
    size_t end = i;
    if (end < src_.size() && src_[end] == '.' && scan_digits(end + 1) > end + 1) end = scan_digits(end + 1);
    if (end < src_.size() && (src_[end] | 32) == 'e') {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (scan_digits(exp) > exp) end = scan_digits(exp);
    }
    return end;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s)
      if (c != '_') out += c;
    return out;
  }

  void lex_number() {
    const size_t digits_end = scan_digits(pos_);
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';  // `x.0.1` is two subscripts, not a float
    const size_t float_end = after_dot ? digits_end : scan_float_tail(digits_end);
    if (float_end > digits_end) {
      Token t{TokenKind::Float, src_.substr(pos_, float_end - pos_), line_};
      t.real = std::strtod(without_underscores(t.text).c_str(), nullptr);
      tokens_.push_back(std::move(t));
      advance_to(float_end);
      return;
    }
    lex_integer();
  }

  void lex_integer() {
    int base = 10;
    size_t start = pos_;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size()) {
      const char prefix = static_cast<char>(src_[pos_ + 1] | 32);
      base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : prefix == 'b' ? 2 : 10;
      if (base != 10) start += 2;
    }
    size_t end = start;
    auto is_base_digit = [&](char c) {
      return base == 16 ? is_hex_digit(c) : base == 10 ? is_ascii_digit(c) : c >= '0' && c < '0' + base;
    };
    if (base == 10 && src_[pos_] == '0') {  // `0(_?0)*`: a literal starting with 0 is only zeros
      end = pos_ + 1;
      while (end < src_.size() && (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0')))
        ++end;
    } else {
      while (end < src_.size() && (is_base_digit(src_[end]) || (src_[end] == '_' && end + 1 < src_.size() && is_base_digit(src_[end + 1]))))
        ++end;
    }
    if (end == start) throw SyntaxError(line_, "invalid integer literal '" + src_.substr(pos_, end - pos_ + 1) + "'");
    Token t{TokenKind::Integer, src_.substr(pos_, end - pos_), line_};
    const std::string digits = without_underscores(std::string_view(src_).substr(start, end - start));
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), t.integer, base);
    if (parsed.ec != std::errc()) throw SyntaxError(line_, "integer literal '" + t.text + "' is too large");
    tokens_.push_back(std::move(t));
    advance_to(end);
  }

  void lex_operator(std::vector<char>& brackets) {
    static constexpr std::string_view kTwoChar[] = {"**", "//", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoChar)
      if (at(op)) {
        push(TokenKind::Operator, std::string(op), line_);
        advance_to(pos_ + 2);
        return;
      }
    const char c = src_[pos_];
    if (std::string_view("+-*/%~[](){}<>=.:|,;").find(c) == std::string_view::npos) {
      std::string shown;
      size_t end = pos_;
      text::append_utf8(shown, text::next_code_point(src_, end));
      throw SyntaxError(line_, "unexpected character '" + shown + "'");
    }
    track_bracket(brackets, c);
    push(TokenKind::Operator, std::string(1, c), line_);
    advance_to(pos_ + 1);
  }

  // Brackets must balance inside a tag; while one is open, `}}` / `%}` are operators, not the tag's end.
  void track_bracket(std::vector<char>& brackets, char c) const {
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) throw SyntaxError(line_, std::string("unexpected '") + c + "'");
      if (brackets.back() != c)
        throw SyntaxError(line_, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      brackets.pop_back();
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the previous tag's end took the line's newline (lstrip_blocks then applies)
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::End: return "end of template";
    case TokenKind::Text: return "template text";
    case TokenKind::PrintEnd: return "end of print statement '}}'";
    case TokenKind::StatementEnd: return "end of statement '%}'";
    case TokenKind::String: return "string literal";
    default: return "'" + token.text + "'";
  }
}

}  // namespace nextn::serve::jinja
