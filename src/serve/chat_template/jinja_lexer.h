// The Jinja subset's lexer: template text and tags, with the whitespace rules transformers renders chat
// templates under (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False) and `-` / `+` control.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace nextn::serve::jinja {

// A template that does not lex or parse, or uses a construct outside the subset; `line` is 1-based.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(int line, const std::string& message) : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

enum class TokenKind { Text, PrintBegin, PrintEnd, StatementBegin, StatementEnd, Name, String, Integer, Float,
                       Operator, End };

struct Token {
  TokenKind kind;
  std::string text;  // Text: the output text; String: the decoded literal; Name / Operator: the spelling
  int line = 0;
  int64_t integer = 0;
  double real = 0;
};

// The tokens of `source`, ending with one End token. Throws SyntaxError.
std::vector<Token> tokenize(std::string_view source);
// How a token reads in an error message ("'endfor'", "end of template", "'}}'").
std::string describe(const Token& token);

}  // namespace nextn::serve::jinja
