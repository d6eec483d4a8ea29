// The interpreter of the Jinja subset: walks a parsed template (jinja_ast.h) with jinja2's scoping rules.
// A for loop's body runs in a fresh scope each iteration (a `set` inside it is gone at the next one: that is
// why templates use namespace()); if-blocks share their enclosing scope; a macro sees the scope it was
// defined in as it is when the macro is called.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/chat_template/jinja.h"
#include "serve/chat_template/jinja_ast.h"

namespace nextn::serve::jinja {

struct Frame : std::enable_shared_from_this<Frame> {
  std::shared_ptr<Frame> parent;
  Variables vars;
  Value* find(std::string_view name);
  void set(const std::string& name, Value value);
};

class Interpreter {
 public:
  explicit Interpreter(const Limits& limits) : limits_(limits) {}
  std::string render(const Body& body, const Variables& variables);

  // What builtins need: the bounds, and calling a value.
  const Limits& limits() const { return limits_; }
  int line() const { return line_; }
  void tick(uint64_t steps = 1);
  void check_size(size_t bytes_or_items) const;  // a string or list a template builds
  Value call(const Value& callee, CallArgs& args);

 private:
  enum class Flow { Normal, Break, Continue };
  class DepthGuard;

  Flow exec_body(const Body& body, Frame& frame);
  Flow exec(const Stmt& s, Frame& frame);
  Flow exec_if(const Stmt& s, Frame& frame);
  void exec_for(const Stmt& s, Frame& frame);
  void exec_set(const Stmt& s, Frame& frame);
  void define_macro(const Stmt& s, Frame& frame);
  Value call_macro(const Stmt& macro, Frame& closure, CallArgs& args);
  void bind_macro_arguments(const Stmt& macro, Frame& frame, CallArgs& args);
  Flow exec_set_block(const Stmt& s, Frame& frame);
  std::string capture(const Body& body, Frame& frame, Flow* flow = nullptr);
  void assign(const AssignTarget& target, const Value& value, Frame& frame);
  std::shared_ptr<Frame> child_of(Frame& frame);

  Value eval(const Expr& e, Frame& frame);
  Value eval_item(const Expr& e, Frame& frame);
  Value eval_call(const Expr& e, Frame& frame);
  Value eval_compare(const Expr& e, Frame& frame);
  Value eval_concat(const Expr& e, Frame& frame);
  Value eval_conditional(const Expr& e, Frame& frame);
  Value eval_collection(const Expr& e, Frame& frame);
  CallArgs eval_args(const Arguments& args, Frame& frame);
  Value lookup(const std::string& name, Frame& frame) const;
  void emit(std::string_view text);

  const Limits& limits_;
  std::string* out_ = nullptr;
  size_t emitted_ = 0;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  int line_ = 0;
  // Frames a macro was defined in: macros point at them without owning them (no reference cycles), so they
  // live until the render ends.
  std::vector<std::shared_ptr<Frame>> macro_frames_;
};

// Python's arithmetic on template values; `check_size` bounds strings and lists the operation builds.
Value arithmetic(BinaryOp op, const Value& a, const Value& b, const Interpreter& interp);

}  // namespace nextn::serve::jinja
