// The syntax tree of the Jinja subset: what the parser (jinja_parser.h) builds and the interpreter
// (jinja_eval.h) walks. One node type per family (Expr, Stmt) with the fields its kinds use, to keep the
// evaluator a plain switch.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serve/chat_template/jinja_value.h"

namespace nextn::serve::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// A filter is called with the value left of the `|`; a test with the value left of `is`.
using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

enum class ExprKind {
  Literal,      // literal
  Name,         // name
  Attribute,    // a.name
  Item,         // a[b]; b may be a SliceSpec
  SliceSpec,    // b:c:d inside [], each may be null
  Call,         // a(args)
  Filter,       // a | name(args)
  Test,         // a is [not] name(args)
  Not,          // not a
  Negate,       // -a
  Plus,         // +a
  Binary,       // a op b
  And,          // a and b
  Or,           // a or b
  Compare,      // a op1 x1 op2 x2 ... (chained, as Python)
  Concat,       // items[0] ~ items[1] ~ ...
  Conditional,  // a if b else c (c may be null)
  List,         // [items]
  Tuple,        // (items)
  Dict,         // {pairs}
};

enum class BinaryOp { Add, Subtract, Multiply, Divide, FloorDivide, Modulo, Power };
enum class CompareKind { Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual, In, NotIn };

struct Expr {
  ExprKind kind;
  int line = 0;
  int height = 1;  // of the subtree; the parser bounds it, so evaluating and destroying it cannot overflow the stack
  Value literal;
  std::string name;  // Name; Attribute's attribute; Filter's / Test's name
  ExprPtr a, b, c, d;
  BinaryOp binary_op = BinaryOp::Add;
  std::vector<ExprPtr> items;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
  std::vector<std::pair<CompareKind, ExprPtr>> comparisons;
  Arguments args;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;
};

enum class StmtKind { Text, Print, If, For, Set, SetBlock, Macro, Break, Continue, Block };

// What a set or a for loop assigns: one name, names to unpack into, or a namespace's attribute.
struct AssignTarget {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;  // non-empty: `names[0].attribute`
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: none
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // Text: the output; Macro: its name
  ExprPtr expr;      // Print / Set value, For iterable
  ExprPtr filter;    // For: the `if` after the iterable
  AssignTarget target;
  std::vector<std::pair<ExprPtr, Body>> branches;  // If / elif conditions and bodies
  Body body;       // For / Macro / SetBlock / Block
  Body else_body;  // If / For
  std::vector<MacroParam> params;
};

}  // namespace nextn::serve::jinja
