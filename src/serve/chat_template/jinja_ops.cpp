// Python's binary arithmetic on template values, with Python's TypeError / ZeroDivisionError messages
// (a chat template's errors reach the API client, and the oracle compares them with jinja2's).
#include <cmath>
#include <limits>

#include "serve/chat_template/jinja_eval.h"

namespace nextn::serve::jinja {
namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

int64_t checked(bool overflowed, int64_t result) {
  if (overflowed) fail("integer overflow (the result does not fit in 64 bits)");
  return result;
}

bool is_sequence(const Value& v) {
  return v.is_string() || (v.is_list() && v.as_list().flavor <= ListFlavor::Tuple);
}

Value add(const Value& a, const Value& b, const Interpreter& interp) {
  if (a.is_integral() && b.is_integral()) {
    int64_t sum = 0;
    const bool overflowed = __builtin_add_overflow(a.as_int(), b.as_int(), &sum);
    return Value::integer(checked(overflowed, sum));
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() + b.as_float());
  if (a.is_string() && b.is_string()) {
    interp.check_size(a.as_string().size() + b.as_string().size());
    return Value::string(a.as_string() + b.as_string());
  }
  const bool same_sequence_type = a.is_list() && b.is_list() && a.as_list().flavor == b.as_list().flavor;
  if (same_sequence_type && a.as_list().flavor <= ListFlavor::Tuple) {
    interp.check_size(a.as_list().items.size() + b.as_list().items.size());
    std::vector<Value> items = a.as_list().items;
    items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
    return Value::list(std::move(items), a.as_list().flavor);
  }
  if (a.is_string() || (a.is_list() && a.as_list().flavor <= ListFlavor::Tuple))
    fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
  unsupported("+", a, b);
}

Value subtract(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    int64_t difference = 0;
    const bool overflowed = __builtin_sub_overflow(a.as_int(), b.as_int(), &difference);
    return Value::integer(checked(overflowed, difference));
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() - b.as_float());
  unsupported("-", a, b);
}

Value repeat(const Value& sequence, int64_t times, const Interpreter& interp) {
  const int64_t n = std::max<int64_t>(times, 0);
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (!s.empty() && n > 0) interp.check_size(s.size() * std::min<uint64_t>(uint64_t(n), SIZE_MAX / s.size()));
    std::string out;
    for (int64_t i = 0; i < n && !s.empty(); ++i) out += s;
    return Value::string(std::move(out));
  }
  const std::vector<Value>& items = sequence.as_list().items;
  if (!items.empty() && n > 0) interp.check_size(items.size() * std::min<uint64_t>(uint64_t(n), SIZE_MAX / items.size()));
  std::vector<Value> out;
  for (int64_t i = 0; i < n && !items.empty(); ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), sequence.as_list().flavor);
}

Value multiply(const Value& a, const Value& b, const Interpreter& interp) {
  if (a.is_integral() && b.is_integral()) {
    int64_t product = 0;
    const bool overflowed = __builtin_mul_overflow(a.as_int(), b.as_int(), &product);
    return Value::integer(checked(overflowed, product));
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() * b.as_float());
  if (is_sequence(a) && b.is_integral()) return repeat(a, b.as_int(), interp);
  if (is_sequence(b) && a.is_integral()) return repeat(b, a.as_int(), interp);
  if (is_sequence(a)) fail("can't multiply sequence by non-int of type '" + type_name(b) + "'");
  if (is_sequence(b)) fail("can't multiply sequence by non-int of type '" + type_name(a) + "'");
  unsupported("*", a, b);
}

Value divide(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("/", a, b);
  if (b.as_float() == 0) fail(a.is_integral() && b.is_integral() ? "division by zero" : "float division by zero");
  return Value::number(a.as_float() / b.as_float());
}

// Python's floor division and modulo of floats (CPython's float_divmod).
std::pair<double, double> float_divmod(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div = 0;
  if (div != 0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, x / y);
  }
  return {floor_div, mod};
}

int64_t int_floor_div(int64_t x, int64_t y) {
  if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow (the result does not fit in 64 bits)");
  const int64_t q = x / y;
  return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
}

int64_t int_mod(int64_t x, int64_t y) {
  if (y == -1) return 0;
  const int64_t r = x % y;
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}

Value floor_divide(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("//", a, b);
  if (a.is_integral() && b.is_integral()) {
    if (b.as_int() == 0) fail("integer division or modulo by zero");
    return Value::integer(int_floor_div(a.as_int(), b.as_int()));
  }
  if (b.as_float() == 0) fail("float floor division by zero");
  return Value::number(float_divmod(a.as_float(), b.as_float()).first);
}

Value modulo(const Value& a, const Value& b) {
  if (a.is_string()) fail("unsupported: printf-style string formatting ('%' on a str)");
  if (!a.is_number() || !b.is_number()) unsupported("%", a, b);
  if (a.is_integral() && b.is_integral()) {
    if (b.as_int() == 0) fail("integer modulo by zero");
    return Value::integer(int_mod(a.as_int(), b.as_int()));
  }
  if (b.as_float() == 0) fail("float modulo");
  return Value::number(float_divmod(a.as_float(), b.as_float()).second);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (a.is_integral() && b.is_integral() && b.as_int() >= 0) {
    int64_t result = 1, base = a.as_int();
    for (int64_t e = b.as_int(); e > 0; e >>= 1) {  // square and multiply, each step overflow-checked
      if ((e & 1) && __builtin_mul_overflow(result, base, &result)) checked(true, 0);
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) checked(true, 0);
    }
    return Value::integer(result);
  }
  const double x = a.as_float(), y = b.as_float();
  if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y)) fail("unsupported: a negative number to a fractional power (a complex number)");
  return Value::number(std::pow(x, y));
}

}  // namespace

Value arithmetic(BinaryOp op, const Value& a, const Value& b, const Interpreter& interp) {
  // An undefined operand raises its own error first, as jinja2's Undefined does in every operator.
  if (a.is_undefined()) fail(a.undefined_reason());
  if (b.is_undefined()) fail(b.undefined_reason());
  switch (op) {
    case BinaryOp::Add: return add(a, b, interp);
    case BinaryOp::Subtract: return subtract(a, b);
    case BinaryOp::Multiply: return multiply(a, b, interp);
    case BinaryOp::Divide: return divide(a, b);
    case BinaryOp::FloorDivide: return floor_divide(a, b);
    case BinaryOp::Modulo: return modulo(a, b);
    case BinaryOp::Power: return power(a, b);
  }
  fail("unknown operator");
}

}  // namespace nextn::serve::jinja
