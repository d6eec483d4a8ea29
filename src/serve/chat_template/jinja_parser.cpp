#include "serve/chat_template/jinja_parser.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <set>

#include "serve/chat_template/jinja_builtins.h"

namespace nextn::serve::jinja {
namespace {

using Names = std::initializer_list<std::string_view>;

bool is_literal_name(std::string_view name) {
  return name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None";
}

bool closes_a_block(std::string_view name) { return name == "elif" || name == "else" || name.substr(0, 3) == "end"; }

int height_of(const ExprPtr& e) { return e ? e->height : 0; }

int height_of(const Arguments& args) {
  int h = 0;
  for (const auto& e : args.positional) h = std::max(h, height_of(e));
  for (const auto& [name, e] : args.keyword) h = std::max(h, height_of(e));
  return h;
}

int children_height(const Expr& e) {
  int h = std::max({height_of(e.a), height_of(e.b), height_of(e.c), height_of(e.d), height_of(e.args)});
  for (const auto& item : e.items) h = std::max(h, height_of(item));
  for (const auto& [key, value] : e.pairs) h = std::max({h, height_of(key), height_of(value)});
  for (const auto& [op, operand] : e.comparisons) h = std::max(h, height_of(operand));
  return h;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_nesting) : tokens_(std::move(tokens)), max_nesting_(max_nesting) {}

  Body run() {
    std::string unused;
    Body body = parse_body({}, &unused);
    check_calls();
    return body;
  }

 private:
  struct OpenBlock {
    std::string_view name;
    int line;
    std::string_view closer;
  };

  // Bounds the parser's recursion (and so the tree's depth) on hostile input.
  class Nest {
   public:
    explicit Nest(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > parser_.max_nesting_)
        parser_.error(parser_.peek(), "blocks or expressions nest deeper than " +
                                          std::to_string(parser_.max_nesting_) + " levels");
    }
    ~Nest() { --parser_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& parser_;
  };

  // ---- tokens --------------------------------------------------------------------------------------------

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool at_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Operator && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }
  [[noreturn]] void error(const Token& at, const std::string& message) const { throw SyntaxError(at.line, message); }
  [[noreturn]] void error(int line, const std::string& message) const { throw SyntaxError(line, message); }

  void expect_op(std::string_view op) {
    if (!at_op(op)) error(peek(), "expected '" + std::string(op) + "', got " + describe(peek()));
    next();
  }
  const Token& expect_name(std::string_view what) {
    if (peek().kind != TokenKind::Name) error(peek(), "expected " + std::string(what) + ", got " + describe(peek()));
    return next();
  }
  void expect_statement_end() {
    if (peek().kind != TokenKind::StatementEnd)
      error(peek(), "expected end of statement '%}', got " + describe(peek()));
    next();
  }

  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // A composite node is sealed once its children are in place: its height is checked against the bound.
  ExprPtr seal(ExprPtr e) {
    e->height = 1 + children_height(*e);
    if (e->height > max_nesting_)
      error(e->line, "an expression nests deeper than " + std::to_string(max_nesting_) + " levels");
    return e;
  }
  StmtPtr stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // ---- statements ----------------------------------------------------------------------------------------

  // The statements up to a `{% name %}` with name in `ends` (consumed through the name, stored in *found), or
  // to the end of the template when `ends` is empty.
  Body parse_body(Names ends, std::string* found) {
    Body body;
    while (true) {
      const Token& t = peek();
      switch (t.kind) {
        case TokenKind::End:
          if (ends.size() == 0) return body;
          unclosed_block_error();
        case TokenKind::Text: {
          auto s = stmt(StmtKind::Text, t.line);
          s->text = next().text;
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::PrintBegin: body.push_back(parse_print()); break;
        case TokenKind::StatementBegin:
          if (peek(1).kind == TokenKind::Name && std::find(ends.begin(), ends.end(), peek(1).text) != ends.end()) {
            next();
            *found = next().text;
            return body;
          }
          next();
          body.push_back(parse_statement());
          break;
        default: error(t, "unexpected " + describe(t));
      }
    }
  }

  [[noreturn]] void unclosed_block_error() const {
    const OpenBlock& block = open_blocks_.back();
    error(block.line, "the '" + std::string(block.name) + "' block opened on this line is never closed (expected '" +
                          std::string(block.closer) + "')");
  }

  std::string innermost_block() const {
    if (open_blocks_.empty()) return " (no block is open)";
    const OpenBlock& block = open_blocks_.back();
    return " (the innermost open block is '" + std::string(block.name) + "' from line " + std::to_string(block.line) +
           ", closed by '" + std::string(block.closer) + "')";
  }

  StmtPtr parse_print() {
    const int line = next().line;
    auto s = stmt(StmtKind::Print, line);
    s->expr = parse_tuple(true, false, {});
    if (peek().kind != TokenKind::PrintEnd) error(peek(), "expected end of print statement '}}', got " + describe(peek()));
    next();
    return s;
  }

  StmtPtr parse_statement() {
    Nest nest(*this);
    const Token& t = next();
    if (t.kind != TokenKind::Name) error(t, "expected a statement name after '{%', got " + describe(t));
    const std::string& name = t.text;
    if (name == "if") return parse_if(t.line);
    if (name == "for") return parse_for(t.line);
    if (name == "set") return parse_set(t.line);
    if (name == "macro") return parse_macro(t.line);
    if (name == "break" || name == "continue") return parse_loop_control(t);
    if (name == "generation") return parse_generation(t.line);
    if (closes_a_block(name)) error(t, "unexpected '" + name + "'" + innermost_block());
    error(t, "unsupported statement '" + name + "'");
  }

  // The body of a block up to `closer`, which must then end its tag.
  Body parse_block_body(std::string_view block, int line, Names ends, std::string* found) {
    open_blocks_.push_back(OpenBlock{block, line, *std::prev(ends.end())});
    Body body = parse_body(ends, found);
    open_blocks_.pop_back();
    return body;
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(StmtKind::If, line);
    ExprPtr condition = parse_tuple(false, false, {});
    expect_statement_end();
    std::string found;
    while (true) {
      Body body = parse_block_body("if", line, {"elif", "else", "endif"}, &found);
      s->branches.emplace_back(std::move(condition), std::move(body));
      if (found != "elif") break;
      condition = parse_tuple(false, false, {});
      expect_statement_end();
    }
    if (found == "else") {
      expect_statement_end();
      s->else_body = parse_block_body("if", line, {"endif"}, &found);
    }
    expect_statement_end();
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(StmtKind::For, line);
    s->target = parse_target("in");
    if (!at_name("in")) error(peek(), "expected 'in' in the for loop, got " + describe(peek()));
    next();
    s->expr = parse_tuple(false, false, {"recursive"});
    if (at_name("recursive")) error(peek(), "unsupported: recursive for loops");
    if (at_name("if")) {
      next();
      s->filter = parse_expression(true);
    }
    expect_statement_end();
    std::string found;
    ++loop_depth_;
    s->body = parse_block_body("for", line, {"else", "endfor"}, &found);
    --loop_depth_;
    if (found == "else") {
      expect_statement_end();
      s->else_body = parse_block_body("for", line, {"endfor"}, &found);
    }
    expect_statement_end();
    return s;
  }

  // `a`, `a, b`, `(a, b)`: the names a for loop or a set assigns. `end_name` ends a trailing comma's tuple.
  AssignTarget parse_target(std::string_view end_name) {
    AssignTarget target;
    const bool parens = at_op("(");
    if (parens) next();
    while (true) {
      const Token& t = next();
      if (t.kind != TokenKind::Name || is_literal_name(t.text))
        error(t, "expected a variable name to assign to, got " + describe(t));
      target.names.push_back(t.text);
      assigned_names_.insert(t.text);
      if (!at_op(",")) break;
      next();
      target.unpack = true;
      // `for a, in xs` is a one-name tuple (as in jinja2); a set's trailing comma is an error, as there.
      const bool tuple_ends = parens ? at_op(")") : !end_name.empty() && at_name(end_name);
      if (tuple_ends) break;
    }
    if (parens) {
      expect_op(")");
      target.unpack = target.unpack || target.names.size() > 1;
    }
    return target;
  }

  StmtPtr parse_set(int line) {
    auto s = stmt(StmtKind::Set, line);
    if (peek().kind == TokenKind::Name && at_op(".", 1)) {
      s->target.names.push_back(next().text);
      next();
      s->target.attribute = expect_name("an attribute name after '.'").text;
      assigned_names_.insert(s->target.attribute);
    } else {
      s->target = parse_target("");
    }
    if (at_op("=")) {
      next();
      s->expr = parse_tuple(true, false, {});
      expect_statement_end();
      return s;
    }
    if (at_op("|")) error(peek(), "unsupported: a filter on a block set");
    if (s->target.unpack || !s->target.attribute.empty())
      error(peek(), "expected '=' (a block set assigns one variable)");
    expect_statement_end();
    s->kind = StmtKind::SetBlock;
    std::string found;
    s->body = parse_block_body("set", line, {"endset"}, &found);
    expect_statement_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(StmtKind::Macro, line);
    s->text = expect_name("a macro name").text;
    assigned_names_.insert(s->text);
    expect_op("(");
    while (!at_op(")")) {
      if (!s->params.empty()) {
        expect_op(",");
        if (at_op(")")) break;
      }
      const Token& param = expect_name("a parameter name");
      if (is_literal_name(param.text)) error(param, "expected a parameter name, got '" + param.text + "'");
      MacroParam p{param.text, nullptr};
      assigned_names_.insert(param.text);
      if (at_op("=")) {
        next();
        p.default_value = parse_expression(true);
      } else if (!s->params.empty() && s->params.back().default_value) {
        error(param, "non-default argument '" + param.text + "' follows default argument");
      }
      s->params.push_back(std::move(p));
    }
    next();
    expect_statement_end();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // a loop around the macro's definition is not around its body
    std::string found;
    s->body = parse_block_body("macro", line, {"endmacro"}, &found);
    loop_depth_ = saved_loop_depth;
    expect_statement_end();
    return s;
  }

  StmtPtr parse_loop_control(const Token& t) {
    if (loop_depth_ == 0) error(t, "'" + t.text + "' outside of a loop");
    expect_statement_end();
    return stmt(t.text == "break" ? StmtKind::Break : StmtKind::Continue, t.line);
  }

  // transformers' {% generation %}...{% endgeneration %} marks assistant text for its training masks; when
  // rendering a prompt it is just its body.
  StmtPtr parse_generation(int line) {
    expect_statement_end();
    auto s = stmt(StmtKind::Block, line);
    std::string found;
    s->body = parse_block_body("generation", line, {"endgeneration"}, &found);
    expect_statement_end();
    return s;
  }

  // ---- expressions (jinja2's grammar, loosest first) -----------------------------------------------------

  bool is_tuple_end(Names extra_ends) const {
    const Token& t = peek();
    if (t.kind == TokenKind::PrintEnd || t.kind == TokenKind::StatementEnd || at_op(")")) return true;
    return t.kind == TokenKind::Name && std::find(extra_ends.begin(), extra_ends.end(), t.text) != extra_ends.end();
  }

  // `a, b` is a tuple wherever a whole expression stands ({{ }}, set, for, parentheses).
  ExprPtr parse_tuple(bool with_conditional, bool explicit_parens, Names extra_ends) {
    const int line = peek().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_ends)) break;
      items.push_back(parse_expression(with_conditional));
      if (!at_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error(peek(), "expected an expression, got " + describe(peek()));
    }
    auto e = node(ExprKind::Tuple, line);
    e->items = std::move(items);
    return seal(std::move(e));
  }

  ExprPtr parse_expression(bool with_conditional) {
    Nest nest(*this);
    return with_conditional ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      auto e = node(ExprKind::Conditional, next().line);
      e->a = std::move(expr);
      e->b = parse_or();
      if (at_name("else")) {
        next();
        Nest nest(*this);
        e->c = parse_conditional();
      }
      expr = seal(std::move(e));
    }
    return expr;
  }

  ExprPtr binary_node(ExprKind kind, int line, ExprPtr left, ExprPtr right) {
    auto e = node(kind, line);
    e->a = std::move(left);
    e->b = std::move(right);
    return seal(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const int line = next().line;
      left = binary_node(ExprKind::Or, line, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const int line = next().line;
      left = binary_node(ExprKind::And, line, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (!at_name("not")) return parse_compare();
    auto e = node(ExprKind::Not, next().line);
    Nest nest(*this);
    e->a = parse_not();
    return seal(std::move(e));
  }

  std::optional<CompareKind> comparison_at() const {
    static constexpr std::pair<std::string_view, CompareKind> kOps[] = {
        {"==", CompareKind::Equal}, {"!=", CompareKind::NotEqual},    {"<", CompareKind::Less},
        {"<=", CompareKind::LessEqual}, {">", CompareKind::Greater}, {">=", CompareKind::GreaterEqual}};
    for (const auto& [op, kind] : kOps)
      if (at_op(op)) return kind;
    if (at_name("in")) return CompareKind::In;
    if (at_name("not") && at_name("in", 1)) return CompareKind::NotIn;
    return std::nullopt;
  }

  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    auto e = node(ExprKind::Compare, line);
    while (const std::optional<CompareKind> kind = comparison_at()) {
      next();
      if (*kind == CompareKind::NotIn) next();
      e->comparisons.emplace_back(*kind, parse_math1());
    }
    if (e->comparisons.empty()) return first;
    e->a = std::move(first);
    return seal(std::move(e));
  }

  ExprPtr arithmetic(ExprPtr left, BinaryOp op, int line, ExprPtr right) {
    if (op == BinaryOp::Modulo && left->kind == ExprKind::Literal && left->literal.is_string())
      error(line, "unsupported: printf-style string formatting ('%' on a string)");
    auto e = node(ExprKind::Binary, line);
    e->binary_op = op;
    e->a = std::move(left);
    e->b = std::move(right);
    return seal(std::move(e));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& op = next();
      left = arithmetic(std::move(left), op.text == "+" ? BinaryOp::Add : BinaryOp::Subtract, op.line, parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = peek().line;
    ExprPtr first = parse_math2();
    if (!at_op("~")) return first;
    auto e = node(ExprKind::Concat, line);
    e->items.push_back(std::move(first));
    while (at_op("~")) {
      next();
      e->items.push_back(parse_math2());
    }
    return seal(std::move(e));
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& op = next();
      const BinaryOp kind = op.text == "*"    ? BinaryOp::Multiply
                            : op.text == "/"  ? BinaryOp::Divide
                            : op.text == "//" ? BinaryOp::FloorDivide
                                              : BinaryOp::Modulo;
      left = arithmetic(std::move(left), kind, op.line, parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const int line = next().line;
      left = arithmetic(std::move(left), BinaryOp::Power, line, parse_unary(true));
    }
    return left;
  }

  // Unary minus binds tighter than a filter: `-x | abs` is abs(-x); `-2 ** 2` is (-2) ** 2, as in jinja2.
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const ExprKind kind = at_op("-") ? ExprKind::Negate : ExprKind::Plus;
      e = node(kind, next().line);
      Nest nest(*this);
      e->a = parse_unary(false);
      e = seal(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr literal(Value v, int line) {
    auto e = node(ExprKind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        auto e = node(ExprKind::Name, t.line);
        e->name = t.text;
        return e;
      }
      case TokenKind::String: {
        std::string s;  // adjacent literals concatenate, as in Python
        while (peek().kind == TokenKind::String) s += next().text;
        return literal(Value::string(std::move(s)), t.line);
      }
      case TokenKind::Integer: next(); return literal(Value::integer(t.integer), t.line);
      case TokenKind::Float: next(); return literal(Value::number(t.real), t.line);
      default: break;
    }
    if (at_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true, {});
      expect_op(")");
      return e;
    }
    if (at_op("[")) return parse_list();
    if (at_op("{")) return parse_dict();
    error(t, "expected an expression, got " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = node(ExprKind::List, next().line);
    while (!at_op("]")) {
      if (!e->items.empty()) {
        expect_op(",");
        if (at_op("]")) break;
      }
      e->items.push_back(parse_expression(true));
    }
    next();
    return seal(std::move(e));
  }

  ExprPtr parse_dict() {
    auto e = node(ExprKind::Dict, next().line);
    while (!at_op("}")) {
      if (!e->pairs.empty()) {
        expect_op(",");
        if (at_op("}")) break;
      }
      ExprPtr key = parse_expression(true);
      expect_op(":");
      e->pairs.emplace_back(std::move(key), parse_expression(true));
    }
    next();
    return seal(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".") || at_op("["))
        e = parse_subscript(std::move(e));
      else if (at_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (at_op("|"))
        e = parse_filter(std::move(e));
      else if (at_name("is"))
        e = parse_test(std::move(e));
      else if (at_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.kind == TokenKind::Name) {
        auto e = node(ExprKind::Attribute, t.line);
        e->a = std::move(object);
        e->name = attr.text;
        return seal(std::move(e));
      }
      if (attr.kind != TokenKind::Integer) error(attr, "expected a name or number after '.', got " + describe(attr));
      auto e = node(ExprKind::Item, t.line);
      e->a = std::move(object);
      e->b = literal(Value::integer(attr.integer), attr.line);
      return seal(std::move(e));
    }
    auto e = node(ExprKind::Item, t.line);
    e->a = std::move(object);
    std::vector<ExprPtr> indices;
    while (!at_op("]")) {
      if (!indices.empty()) expect_op(",");
      indices.push_back(parse_subscribed());
    }
    next();
    if (indices.empty()) error(t, "expected an index or a slice inside '[]'");
    if (indices.size() == 1) {
      e->b = std::move(indices[0]);
    } else {
      e->b = node(ExprKind::Tuple, t.line);
      e->b->items = std::move(indices);
      e->b = seal(std::move(e->b));
    }
    return seal(std::move(e));
  }

  // An index or a slice start:stop:step (each part optional).
  ExprPtr parse_subscribed() {
    const int line = peek().line;
    ExprPtr start;
    if (!at_op(":")) {
      start = parse_expression(true);
      if (!at_op(":")) return start;
    }
    next();
    auto e = node(ExprKind::SliceSpec, line);
    e->b = std::move(start);
    if (!at_op(":") && !at_op("]") && !at_op(",")) e->c = parse_expression(true);
    if (at_op(":")) {
      next();
      if (!at_op("]") && !at_op(",")) e->d = parse_expression(true);
    }
    return seal(std::move(e));
  }

  Arguments parse_call_args() {
    Arguments args;
    while (!at_op(")")) {
      if (!args.positional.empty() || !args.keyword.empty()) {
        expect_op(",");
        if (at_op(")")) break;
      }
      if (at_op("*") || at_op("**")) error(peek(), "unsupported: *args / **kwargs in a call");
      if (peek().kind == TokenKind::Name && at_op("=", 1)) {
        std::string key = next().text;
        next();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.keyword.empty()) error(peek(), "a positional argument follows a keyword argument");
        args.positional.push_back(parse_expression(true));
      }
    }
    next();
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, next().line);
    e->args = parse_call_args();
    if (callee->kind == ExprKind::Name) {
      function_calls_.emplace_back(callee->name, e->line);
      if (callee->name == "namespace")
        for (const auto& [key, value] : e->args.keyword) assigned_names_.insert(key);
    } else if (callee->kind == ExprKind::Attribute) {
      method_calls_.emplace_back(callee->name, e->line);
    }
    e->a = std::move(callee);
    return seal(std::move(e));
  }

  // `a.b` spelled after `|` or `is`; the subset has no dotted filter or test names, so it reads as one name.
  std::string dotted_name(const Token& first) {
    std::string name = first.text;
    while (at_op(".")) {
      next();
      name += "." + expect_name("a name after '.'").text;
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    next();
    const Token& t = expect_name("a filter name after '|'");
    auto e = node(ExprKind::Filter, t.line);
    e->name = dotted_name(t);
    e->filter = find_filter(e->name);
    if (!e->filter) error(t, "unknown filter '" + e->name + "'");
    if (at_op("(")) {
      next();
      e->args = parse_call_args();
    }
    check_named_argument(*e);
    e->a = std::move(operand);
    return seal(std::move(e));
  }

  // map('name') names a filter, select('name') / selectattr('attr', 'name') a test: check them now too.
  void check_named_argument(const Expr& filter) const {
    const bool names_filter = filter.name == "map";
    const bool names_test = filter.name == "select" || filter.name == "reject";
    const bool attr_then_test = filter.name == "selectattr" || filter.name == "rejectattr";
    const size_t index = attr_then_test ? 1 : 0;
    if ((!names_filter && !names_test && !attr_then_test) || filter.args.positional.size() <= index) return;
    const Expr& arg = *filter.args.positional[index];
    if (arg.kind != ExprKind::Literal || !arg.literal.is_string()) return;
    const std::string& name = arg.literal.as_string();
    if (names_filter && !find_filter(name)) error(arg.line, "unknown filter '" + name + "'");
    if (!names_filter && !find_test(name)) error(arg.line, "unknown test '" + name + "'");
  }

  bool starts_test_argument() const {
    const Token& t = peek();
    const bool value_like = t.kind == TokenKind::Name || t.kind == TokenKind::String ||
                            t.kind == TokenKind::Integer || t.kind == TokenKind::Float || at_op("[") || at_op("{");
    return value_like && !at_name("else") && !at_name("or") && !at_name("and");
  }

  ExprPtr parse_test(ExprPtr operand) {
    const int line = next().line;
    auto e = node(ExprKind::Test, line);
    if (at_name("not")) {
      next();
      e->negated = true;
    }
    const Token& t = expect_name("a test name after 'is'");
    e->name = dotted_name(t);
    e->test = find_test(e->name);
    if (!e->test) error(t, "unknown test '" + e->name + "'");
    if (at_op("(")) {
      next();
      e->args = parse_call_args();
    } else if (starts_test_argument()) {  // `x is divisibleby 3`: one argument without parentheses
      if (at_name("is")) error(peek(), "tests cannot be chained with 'is'");
      e->args.positional.push_back(parse_postfix(parse_primary()));
    }
    e->a = std::move(operand);
    return seal(std::move(e));
  }

  // Calls of names that are neither globals nor anything the template defines (`lipsum()`, `caller()`), and
  // methods no value of the subset has (`.format()`), are refused when the template loads.
  void check_calls() const {
    for (const auto& [name, line] : function_calls_)
      if (!is_global_function(name) && !assigned_names_.count(name))
        error(line, "unsupported function '" + name + "'");
    for (const auto& [name, line] : method_calls_)
      if (!is_known_method(name) && !assigned_names_.count(name)) error(line, "unsupported method '" + name + "'");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int max_nesting_;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<OpenBlock> open_blocks_;
  std::set<std::string, std::less<>> assigned_names_;  // names that may hold a macro
  std::vector<std::pair<std::string, int>> function_calls_;
  std::vector<std::pair<std::string, int>> method_calls_;
};

}  // namespace

Body parse(std::vector<Token> tokens, int max_nesting) { return Parser(std::move(tokens), max_nesting).run(); }

}  // namespace nextn::serve::jinja
