#include "serve/chat_template/jinja_eval.h"

#include "serve/chat_template/jinja_builtins.h"

namespace nextn::serve::jinja {

// ---- frames ----------------------------------------------------------------------------------------------

Value* Frame::find(std::string_view name) {
  for (auto& [key, value] : vars)
    if (key == name) return &value;
  return nullptr;
}

void Frame::set(const std::string& name, Value value) {
  if (Value* existing = find(name))
    *existing = std::move(value);
  else
    vars.emplace_back(name, std::move(value));
}

// ---- bounds ----------------------------------------------------------------------------------------------

class Interpreter::DepthGuard {
 public:
  explicit DepthGuard(Interpreter& interp) : interp_(interp) {
    if (++interp_.eval_depth_ > interp_.limits_.max_eval_depth)
      fail("the template recurses deeper than " + std::to_string(interp_.limits_.max_eval_depth) + " levels");
  }
  ~DepthGuard() { --interp_.eval_depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  Interpreter& interp_;
};

void Interpreter::tick(uint64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps)
    fail("the template did more than " + std::to_string(limits_.max_steps) + " steps of work (a runaway loop?)");
}

void Interpreter::check_size(size_t n) const {
  if (n > limits_.max_output_bytes)
    fail("the template built a string or list larger than " + std::to_string(limits_.max_output_bytes) + " bytes/items");
}

void Interpreter::emit(std::string_view text) {
  emitted_ += text.size();
  if (emitted_ > limits_.max_output_bytes)
    fail("the rendered output is larger than " + std::to_string(limits_.max_output_bytes) + " bytes");
  out_->append(text);
}

// ---- statements ------------------------------------------------------------------------------------------

std::string Interpreter::render(const Body& body, const Variables& variables) {
  auto root = std::make_shared<Frame>();
  root->vars = variables;
  std::string output;
  out_ = &output;
  exec_body(body, *root);
  macro_frames_.clear();
  return output;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, Frame& frame) {
  for (const StmtPtr& s : body) {
    const Flow flow = exec(*s, frame);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, Frame& frame) {
  DepthGuard depth(*this);
  tick();
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Text: emit(s.text); break;
    case StmtKind::Print: emit(to_str(eval(*s.expr, frame))); break;
    case StmtKind::If: return exec_if(s, frame);
    case StmtKind::For: exec_for(s, frame); break;
    case StmtKind::Set: exec_set(s, frame); break;
    case StmtKind::SetBlock: return exec_set_block(s, frame);
    case StmtKind::Macro: define_macro(s, frame); break;
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
    case StmtKind::Block: return exec_body(s.body, frame);
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_if(const Stmt& s, Frame& frame) {
  for (const auto& [condition, body] : s.branches) {
    line_ = condition->line;
    if (truthy(eval(*condition, frame))) return exec_body(body, frame);
  }
  return exec_body(s.else_body, frame);
}

std::shared_ptr<Frame> Interpreter::child_of(Frame& frame) {
  auto child = std::make_shared<Frame>();
  child->parent = frame.shared_from_this();
  return child;
}

namespace {

// jinja2's loop variable for item `i` of `items`.
Value loop_info(const std::vector<Value>& items, size_t i) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index = static_cast<int64_t>(i);
  DictData loop;
  loop.entries.reserve(12);
  auto add = [&](const char* key, Value v) { loop.entries.emplace_back(Value::string(key), std::move(v)); };
  add("index", Value::integer(index + 1));
  add("index0", Value::integer(index));
  add("revindex", Value::integer(n - index));
  add("revindex0", Value::integer(n - index - 1));
  add("first", Value::boolean(i == 0));
  add("last", Value::boolean(index == n - 1));
  add("length", Value::integer(n));
  add("depth", Value::integer(1));
  add("depth0", Value::integer(0));
  add("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  add("nextitem", index + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  add("cycle", Value::callable("cycle", [index](Interpreter&, CallArgs& args) {
        if (args.positional.empty()) fail("no items for cycling given");
        return args.positional[static_cast<size_t>(index) % args.positional.size()];
      }));
  return Value::dict(std::move(loop));
}

}  // namespace

void Interpreter::exec_for(const Stmt& s, Frame& frame) {
  std::vector<Value> items = iterate(eval(*s.expr, frame));
  tick(items.size());
  if (s.filter) {  // `for x in xs if cond`: the loop (and loop.length) sees only the items that pass
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = child_of(frame);
      assign(s.target, item, *probe);
      if (truthy(eval(*s.filter, *probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  // jinja2 runs the else block unless some iteration reached the end of the body: after no items, and also
  // when every iteration left early through break or continue.
  bool an_iteration_completed = false;
  for (size_t i = 0; i < items.size(); ++i) {
    auto iteration = child_of(frame);
    assign(s.target, items[i], *iteration);
    iteration->set("loop", loop_info(items, i));
    const Flow flow = exec_body(s.body, *iteration);
    if (flow == Flow::Normal) an_iteration_completed = true;
    if (flow == Flow::Break) break;
  }
  if (!an_iteration_completed) exec_body(s.else_body, frame);
}

void Interpreter::assign(const AssignTarget& target, const Value& value, Frame& frame) {
  if (!target.unpack) {
    frame.set(target.names[0], value);
    return;
  }
  const bool iterable = value.is_undefined() || value.is_string() || value.is_list() || value.is_dict();
  if (!iterable) fail("cannot unpack non-iterable " + type_name(value) + " object");
  const std::vector<Value> parts = iterate(value);
  const size_t expected = target.names.size();
  if (parts.size() < expected)
    fail("not enough values to unpack (expected " + std::to_string(expected) + ", got " + std::to_string(parts.size()) + ")");
  if (parts.size() > expected) fail("too many values to unpack (expected " + std::to_string(expected) + ")");
  for (size_t i = 0; i < expected; ++i) frame.set(target.names[i], parts[i]);
}

void Interpreter::exec_set(const Stmt& s, Frame& frame) {
  Value value = eval(*s.expr, frame);
  if (s.target.attribute.empty()) {
    assign(s.target, value, frame);
    return;
  }
  const Value object = lookup(s.target.names[0], frame);
  if (object.kind() != Value::Kind::Namespace) fail("cannot assign attribute on non-namespace object");
  object.as_namespace().attributes.set(Value::string(s.target.attribute), std::move(value));
}

std::string Interpreter::capture(const Body& body, Frame& frame, Flow* flow) {
  std::string buffer;
  std::string* const saved = out_;
  out_ = &buffer;
  try {
    const Flow result = exec_body(body, frame);
    if (flow) *flow = result;
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

// {% set x %}...{% endset %}. A break or continue inside leaves the enclosing loop before x is assigned,
// as in jinja2's generated code.
Interpreter::Flow Interpreter::exec_set_block(const Stmt& s, Frame& frame) {
  Flow flow = Flow::Normal;
  std::string text = capture(s.body, *child_of(frame), &flow);
  if (flow == Flow::Normal) frame.set(s.target.names[0], Value::string(std::move(text)));
  return flow;
}

void Interpreter::define_macro(const Stmt& s, Frame& frame) {
  macro_frames_.push_back(frame.shared_from_this());
  Frame* closure = &frame;
  const Stmt* macro = &s;
  frame.set(s.text, Value::callable(s.text, [macro, closure](Interpreter& interp, CallArgs& args) {
              return interp.call_macro(*macro, *closure, args);
            }, true));
}

void Interpreter::bind_macro_arguments(const Stmt& macro, Frame& frame, CallArgs& args) {
  const std::string& name = macro.text;
  if (args.positional.size() > macro.params.size())
    fail("macro '" + name + "' takes not more than " + std::to_string(macro.params.size()) + " argument(s)");
  std::vector<bool> bound(macro.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    frame.set(macro.params[i].name, std::move(args.positional[i]));
    bound[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < macro.params.size() && macro.params[i].name != key) ++i;
    // jinja2 words a keyword for an argument already given positionally the same way as an unknown one.
    if (i == macro.params.size() || bound[i]) fail("macro '" + name + "' takes no keyword argument '" + key + "'");
    frame.set(key, std::move(value));
    bound[i] = true;
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (bound[i]) continue;
    const MacroParam& p = macro.params[i];
    frame.set(p.name, p.default_value ? eval(*p.default_value, frame)
                                      : Value::undefined("parameter '" + p.name + "' was not provided"));
  }
}

Value Interpreter::call_macro(const Stmt& macro, Frame& closure, CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth)
    fail("macro calls nest deeper than " + std::to_string(limits_.max_call_depth) + " levels (runaway recursion?)");
  ++call_depth_;
  const int caller_line = line_;
  try {
    auto frame = child_of(closure);
    bind_macro_arguments(macro, *frame, args);
    Value result = Value::string(capture(macro.body, *frame));
    --call_depth_;
    line_ = caller_line;
    return result;
  } catch (...) {
    --call_depth_;
    throw;
  }
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.kind() == Value::Kind::Callable) return callee.as_callable().call(*this, args);
  if (callee.is_undefined()) fail(callee.undefined_reason());
  std::string message = "'";  // built by appending: GCC 12 -O2 warns falsely (-Wrestrict) on "..." + string
  message += type_name(callee);
  fail(message + "' object is not callable");
}

// ---- expressions -----------------------------------------------------------------------------------------

Value Interpreter::lookup(const std::string& name, Frame& frame) const {
  for (Frame* f = &frame; f; f = f->parent.get())
    if (const Value* v = f->find(name)) return *v;
  Value global = global_function(name);
  return global.is_undefined() ? Value::undefined("'" + name + "' is undefined") : global;
}

Value Interpreter::eval(const Expr& e, Frame& frame) {
  DepthGuard depth(*this);
  tick();
  switch (e.kind) {
    case ExprKind::Literal: return e.literal;
    case ExprKind::Name: return lookup(e.name, frame);
    case ExprKind::Attribute: return get_attribute(eval(*e.a, frame), e.name);
    case ExprKind::Item: return eval_item(e, frame);
    case ExprKind::SliceSpec: fail("a slice is only valid inside []");
    case ExprKind::Call: return eval_call(e, frame);
    case ExprKind::Filter: {
      const Value operand = eval(*e.a, frame);
      CallArgs args = eval_args(e.args, frame);
      line_ = e.line;
      return e.filter(*this, operand, args);
    }
    case ExprKind::Test: {
      const Value operand = eval(*e.a, frame);
      CallArgs args = eval_args(e.args, frame);
      line_ = e.line;
      return Value::boolean(e.test(*this, operand, args) != e.negated);
    }
    case ExprKind::Not: return Value::boolean(!truthy(eval(*e.a, frame)));
    case ExprKind::Negate:
    case ExprKind::Plus: {
      const Value operand = eval(*e.a, frame);
      if (operand.is_undefined()) fail(operand.undefined_reason());
      if (!operand.is_number())
        fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::Negate ? "-" : "+") + ": '" +
             type_name(operand) + "'");
      if (operand.kind() == Value::Kind::Float) return Value::number(e.kind == ExprKind::Plus ? operand.as_float() : -operand.as_float());
      if (e.kind == ExprKind::Plus) return Value::integer(operand.as_int());
      return arithmetic(BinaryOp::Subtract, Value::integer(0), operand, *this);
    }
    case ExprKind::Binary: {
      const Value a = eval(*e.a, frame);
      const Value b = eval(*e.b, frame);
      line_ = e.line;
      return arithmetic(e.binary_op, a, b, *this);
    }
    case ExprKind::And: {
      Value left = eval(*e.a, frame);
      return truthy(left) ? eval(*e.b, frame) : left;
    }
    case ExprKind::Or: {
      Value left = eval(*e.a, frame);
      return truthy(left) ? left : eval(*e.b, frame);
    }
    case ExprKind::Compare: return eval_compare(e, frame);
    case ExprKind::Concat: return eval_concat(e, frame);
    case ExprKind::Conditional: return eval_conditional(e, frame);
    case ExprKind::List:
    case ExprKind::Tuple:
    case ExprKind::Dict: return eval_collection(e, frame);
  }
  fail("unknown expression");
}

Value Interpreter::eval_item(const Expr& e, Frame& frame) {
  const Value object = eval(*e.a, frame);
  const Expr& index = *e.b;
  if (index.kind != ExprKind::SliceSpec) {
    const Value key = eval(index, frame);
    line_ = e.line;
    return get_item(object, key);
  }
  const Value start = index.b ? eval(*index.b, frame) : Value();
  const Value stop = index.c ? eval(*index.c, frame) : Value();
  const Value step = index.d ? eval(*index.d, frame) : Value();
  line_ = e.line;
  return get_slice(object, start, stop, step);
}

CallArgs Interpreter::eval_args(const Arguments& args, Frame& frame) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& arg : args.positional) out.positional.push_back(eval(*arg, frame));
  for (const auto& [key, arg] : args.keyword) out.keyword.emplace_back(key, eval(*arg, frame));
  return out;
}

Value Interpreter::eval_call(const Expr& e, Frame& frame) {
  const Expr& callee = *e.a;
  if (callee.kind == ExprKind::Attribute) {  // obj.method(...): a Python method, else a callable attribute
    const Value object = eval(*callee.a, frame);
    if (object.is_undefined()) fail(object.undefined_reason());
    CallArgs args = eval_args(e.args, frame);
    line_ = e.line;
    if (std::optional<Value> result = call_method(*this, object, callee.name, args)) return std::move(*result);
    return call(get_attribute(object, callee.name), args);
  }
  const Value function = eval(callee, frame);
  CallArgs args = eval_args(e.args, frame);
  line_ = e.line;
  return call(function, args);
}

namespace {
bool compare_one(CompareKind kind, const Value& left, const Value& right) {
  switch (kind) {
    case CompareKind::Equal: return equal(left, right);
    case CompareKind::NotEqual: return !equal(left, right);
    case CompareKind::Less: return compare(left, right, CompareOp::Less);
    case CompareKind::LessEqual: return compare(left, right, CompareOp::LessEqual);
    case CompareKind::Greater: return compare(left, right, CompareOp::Greater);
    case CompareKind::GreaterEqual: return compare(left, right, CompareOp::GreaterEqual);
    case CompareKind::In: return contains(right, left);
    case CompareKind::NotIn: return !contains(right, left);
  }
  return false;
}
}  // namespace

// a < b < c is (a < b) and (b < c), each operand evaluated once, stopping at the first false.
Value Interpreter::eval_compare(const Expr& e, Frame& frame) {
  Value left = eval(*e.a, frame);
  for (const auto& [kind, operand] : e.comparisons) {
    Value right = eval(*operand, frame);
    line_ = e.line;
    if (!compare_one(kind, left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_concat(const Expr& e, Frame& frame) {
  std::string out;
  for (const ExprPtr& item : e.items) {
    out += to_str(eval(*item, frame));
    check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value Interpreter::eval_conditional(const Expr& e, Frame& frame) {
  if (truthy(eval(*e.b, frame))) return eval(*e.a, frame);
  if (e.c) return eval(*e.c, frame);
  return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                          " evaluated to false and no else section was defined.");
}

Value Interpreter::eval_collection(const Expr& e, Frame& frame) {
  if (e.kind == ExprKind::Dict) {
    DictData d;
    for (const auto& [key, value] : e.pairs) {
      Value k = eval(*key, frame);
      d.set(std::move(k), eval(*value, frame));
    }
    return Value::dict(std::move(d));
  }
  std::vector<Value> items;
  items.reserve(e.items.size());
  for (const ExprPtr& item : e.items) items.push_back(eval(*item, frame));
  return Value::list(std::move(items), e.kind == ExprKind::Tuple ? ListFlavor::Tuple : ListFlavor::List);
}

}  // namespace nextn::serve::jinja
