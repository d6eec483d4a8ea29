// The Jinja subset's parser: tokens (jinja_lexer.h) to a syntax tree (jinja_ast.h), with jinja2's grammar and
// operator precedence. Everything outside the subset (an unknown statement, filter, test, function or method)
// is a SyntaxError naming it and its line.
#pragma once
#include <vector>

#include "serve/chat_template/jinja_ast.h"
#include "serve/chat_template/jinja_lexer.h"

namespace nextn::serve::jinja {

// `max_nesting` bounds how deep blocks and expressions nest (the parser and the evaluator recurse on them).
Body parse(std::vector<Token> tokens, int max_nesting);

}  // namespace nextn::serve::jinja
