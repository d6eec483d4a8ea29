#include "engine/structured/matcher.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/error.h"

namespace nextn::structured {
namespace {

bool is_ws(int b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }
bool is_digit(int b) { return b >= '0' && b <= '9'; }
bool is_hex(int b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// kNumber phases (JSON's number grammar): which accept the end of the number.
// An exponent has at most two digits: with at most kMaxNumberBytes digits before it, no number overflows a
// double (a parser would refuse 1e999 or read it as infinity).
enum NumberPhase : uint8_t { kStart, kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigit, kExpDigits2 };
bool number_complete(uint8_t phase) {
  return phase == kZero || phase == kInt || phase == kFrac || phase == kExpDigit || phase == kExpDigits2;
}

// kString escape states (Frame::a): after a backslash, then the four hex digits of \u (a surrogate's
// D800-DFFF refused: a lone one is not valid UTF-8 once decoded).
enum EscapeState : uint8_t { kPlain, kBackslash, kHex1, kHex2, kHex3, kHex4, kHex2Low };
// kString UTF-8 state (Frame::c): continuation bytes still to come (low 2 bits) and the range the next one must
// be in (bits 2-4): 0 80-BF, 1 A0-BF (after E0), 2 80-9F (after ED), 3 90-BF (after F0), 4 80-8F (after F4).
bool continuation_ok(uint32_t c, int b) {
  switch (c >> 2) {
    case 1: return b >= 0xA0 && b <= 0xBF;
    case 2: return b >= 0x80 && b <= 0x9F;
    case 3: return b >= 0x90 && b <= 0xBF;
    case 4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

StringByte string_byte(StringPos& p, uint8_t byte) {
  if (p.utf8 != 0) {  // inside a UTF-8 sequence
    if (!continuation_ok(p.utf8, byte)) return StringByte::kRefused;
    p.utf8 = uint8_t((p.utf8 & 3) - 1);  // the later continuations take 80-BF
    return StringByte::kInside;
  }
  switch (p.escape) {
    case kPlain:
      break;
    case kBackslash:
      if (byte == 'u') {
        p.escape = kHex1;
      } else if (byte == '"' || byte == '\\' || byte == '/' || byte == 'b' || byte == 'f' || byte == 'n' ||
                 byte == 'r' || byte == 't') {
        p.escape = kPlain;
      } else {
        return StringByte::kRefused;
      }
      return StringByte::kInside;
    case kHex1:
      if (!is_hex(byte)) return StringByte::kRefused;
      p.escape = (byte == 'd' || byte == 'D') ? kHex2Low : kHex2;
      return StringByte::kInside;
    case kHex2Low:
      if (byte < '0' || byte > '7') return StringByte::kRefused;
      p.escape = kHex3;
      return StringByte::kInside;
    default:  // kHex2..kHex4
      if (!is_hex(byte)) return StringByte::kRefused;
      p.escape = p.escape == kHex4 ? uint8_t(kPlain) : uint8_t(p.escape + 1);
      return StringByte::kInside;
  }
  if (byte == '"') return StringByte::kClose;
  if (byte < 0x20 || (byte >= 0x80 && byte < 0xC2) || byte > 0xF4) return StringByte::kRefused;
  if (byte == '\\') p.escape = kBackslash;
  else if (byte >= 0xF0) p.utf8 = uint8_t(3 | (byte == 0xF0 ? 3u << 2 : byte == 0xF4 ? 4u << 2 : 0u));
  else if (byte >= 0xE0) p.utf8 = uint8_t(2 | (byte == 0xE0 ? 1u << 2 : byte == 0xED ? 2u << 2 : 0u));
  else if (byte >= 0xC2) p.utf8 = 1;
  return StringByte::kCodePoint;
}

Matcher::Matcher(Grammar grammar) : g_(std::move(grammar)) {
  if (g_.nodes.empty() || g_.root < 0 || size_t(g_.root) >= g_.nodes.size())
    throw Error("structured output: the grammar has no root");
  auto add = [&](Node n) {
    g_.nodes.push_back(std::move(n));
    return int(g_.nodes.size()) - 1;
  };
  any_ = add(Node{});
  Node o;
  o.kind = Kind::kObject;
  o.free_keys = true;
  o.additional = any_;
  any_object_ = add(std::move(o));
  Node a;
  a.kind = Kind::kArray;
  a.items = any_;
  any_array_ = add(std::move(a));
  Node s;
  s.kind = Kind::kString;
  any_string_ = add(std::move(s));
  Node num;
  num.kind = Kind::kNumber;
  any_number_ = add(std::move(num));
  Node lit;
  lit.kind = Kind::kLiteral;
  lit.literals = {"true", "false", "null"};
  any_literal_ = add(std::move(lit));
  if (g_.nodes.size() > 0xFFFF) throw Error("structured output: the grammar has too many nodes");
  for (Node& n : g_.nodes) {  // sorted, so that the literals sharing a prefix are a range
    std::sort(n.literals.begin(), n.literals.end());
    n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
    if (n.literals.size() >= (1u << 20)) throw Error("structured output: more than 2^20 enum values in one schema");
    for (const std::string& l : n.literals)
      if (l.size() >= 4096) throw Error("structured output: an enum or const value of 4096 bytes or more");
  }
  min_nesting_ = min_nesting(g_);
  for (const Node& n : g_.nodes)
    for (const std::string& l : n.literals)
      if (l.empty()) throw Error("structured output: an empty literal");
}

Matcher::State Matcher::start() const {
  State s;
  Frame f;
  f.node = uint16_t(g_.root);
  f.op = Op::kValue;
  s.frames.push_back(f);
  s.ends.push_back(1);
  return s;
}

void Matcher::keep(const Stack& st, State& out) {
  // Identical stacks (anyOf alternatives that met again) are kept once.
  size_t begin = 0;
  for (uint32_t end : out.ends) {
    if (end - begin == size_t(st.n) &&
        (st.n == 0 || std::memcmp(out.frames.data() + begin, st.f, sizeof(Frame) * size_t(st.n)) == 0))
      return;
    begin = end;
  }
  if (out.ends.size() >= kMaxStacks) return;
  out.frames.insert(out.frames.end(), st.f, st.f + st.n);
  out.ends.push_back(uint32_t(out.frames.size()));
}

int Matcher::nesting(const Stack& st) const {
  int d = 0;
  for (int i = 0; i < st.n; ++i) {
    const Op op = st.f[i].op;
    d += op == Op::kObjOpen || op == Op::kObjColon || op == Op::kObjNext || op == Op::kObjKey || op == Op::kArrOpen ||
         op == Op::kArrNext;
  }
  return d;
}

bool Matcher::push(Stack& st, Frame f) const {
  if (st.n >= kMaxFrames) return false;
  st.f[st.n++] = f;
  return true;
}

bool Matcher::required_left(const Node& n, uint32_t from) const {
  for (size_t j = from; j < n.properties.size(); ++j)
    if (n.properties[j].required) return true;
  return false;
}

// A value of `node` starts with `byte` (the top frame is its kValue, whitespace handled).
void Matcher::value(Stack& st, const Node& node, int byte, State& out) const {
  Frame& top = st.f[st.n - 1];
  const uint16_t id = top.node;
  auto become = [&](Op op, uint16_t n) {
    top = Frame{};
    top.node = n;
    top.op = op;
  };
  switch (node.kind) {
    case Kind::kAnyOf:
      for (int alt : node.alternatives) {
        Stack fork = st;
        fork.f[fork.n - 1].node = uint16_t(alt);
        advance(fork, byte, out);
      }
      return;
    case Kind::kAny: {
      const int to = byte == '{' ? any_object_ : byte == '[' ? any_array_ : byte == '"' ? any_string_
                     : (byte == '-' || is_digit(byte)) ? any_number_ : any_literal_;
      st.f[st.n - 1].node = uint16_t(to);
      return advance(st, byte, out);
    }
    case Kind::kObject:
      if (byte != '{' || nesting(st) + min_nesting_[id] > kMaxNesting) return;
      become(Op::kObjOpen, id);
      return keep(st, out);
    case Kind::kArray:
      if (byte != '[' || nesting(st) + min_nesting_[id] > kMaxNesting) return;
      become(Op::kArrOpen, id);
      return keep(st, out);
    case Kind::kString:
      if (byte != '"') return;
      become(Op::kString, id);
      return keep(st, out);
    case Kind::kNumber:
    case Kind::kInteger:
      if (byte != '-' && !is_digit(byte)) return;
      become(Op::kNumber, id);
      return advance(st, byte, out);
    case Kind::kLiteral:
      become(Op::kLiteral, id);
      return literal_step(st, node, 0, uint32_t(node.literals.size()), 0, byte, out);
  }
}

void Matcher::literal_step(Stack& st, const Node& node, uint32_t lo, uint32_t hi, uint32_t pos, int byte,
                           State& out) const {
  const std::vector<std::string>& lits = node.literals;
  // Byte pos of each literal in the range, -1 for one that has ended: non-decreasing over the sorted range.
  auto at = [&](uint32_t i) { return lits[i].size() > pos ? int(uint8_t(lits[i][pos])) : -1; };
  auto first = [&](int key) {
    uint32_t a = lo, b = hi;
    while (a < b) {
      const uint32_t m = a + (b - a) / 2;
      if (at(m) < key) a = m + 1;
      else b = m;
    }
    return a;
  };
  uint32_t nlo = first(byte), nhi = first(byte + 1);
  if (nlo == nhi) return;
  ++pos;
  if (lits[nlo].size() == pos) {  // a literal ends with this byte: its value is complete
    Stack done = st;
    --done.n;
    keep(done, out);
    if (++nlo == nhi) return;
  }
  Frame& f = st.f[st.n - 1];
  f.b = nlo | pos << 20;
  f.c = nhi;
  keep(st, out);
}

// One stack over one byte (or the end, byte < 0): its successors into out.
void Matcher::advance(Stack st, int byte, State& out) const {
  if (st.n == 0) {
    if (byte < 0) keep(st, out);  // a complete output may end; nothing follows it
    return;
  }
  Frame& top = st.f[st.n - 1];
  const Node& node = g_.nodes[top.node];
  auto whitespace = [&]() {
    if (top.a >= kMaxWhitespaceRun) return;
    ++top.a;
    keep(st, out);
  };
  auto pop_and_continue = [&](bool refeed) {
    --st.n;
    if (refeed) return advance(st, byte, out);
    keep(st, out);
  };
  if (byte < 0) {  // the end: only a complete root number may still be open
    if (top.op == Op::kNumber && number_complete(top.a) && st.n == 1) pop_and_continue(true);
    return;
  }
  switch (top.op) {
    case Op::kValue:
      if (is_ws(byte)) {
        if (st.n == 1) return;  // the output starts with its value (whitespace only between tokens)
        return whitespace();
      }
      return value(st, node, byte, out);

    case Op::kObjOpen:
    case Op::kObjKey:
      if (is_ws(byte)) return whitespace();
      if (byte == '}' && top.op == Op::kObjOpen && (node.free_keys || !required_left(node, top.b)))
        return pop_and_continue(false);
      if (byte != '"') return;
      top.a = 0;
      top.op = Op::kObjColon;
      if (node.free_keys) {
        Frame key;
        key.node = uint16_t(any_string_);
        key.op = Op::kString;
        if (push(st, key)) keep(st, out);
        return;
      }
      // A declared key: any property from the next one up to and including the first required one.
      for (uint32_t j = top.b; j < node.properties.size(); ++j) {
        Stack fork = st;
        Frame& obj = fork.f[fork.n - 1];
        obj.c = j;
        obj.b = j + 1;
        Frame key;
        key.node = obj.node;
        key.op = Op::kKey;
        key.b = j;
        if (push(fork, key)) keep(fork, out);
        if (node.properties[j].required) break;
      }
      return;

    case Op::kKey: {
      const std::string& k = node.properties[top.b].key;
      if (top.c >= k.size() || uint8_t(k[top.c]) != byte) return;
      if (++top.c == k.size()) return pop_and_continue(false);
      return keep(st, out);
    }

    case Op::kObjColon: {
      if (byte != ':') return;  // (no whitespace between a key and its colon)
      const int v = node.free_keys ? node.additional : node.properties[top.c].node;
      top.a = 0;
      top.op = Op::kObjNext;
      Frame f;
      f.node = uint16_t(v);
      f.op = Op::kValue;
      if (push(st, f)) keep(st, out);
      return;
    }

    case Op::kObjNext:
      if (is_ws(byte)) {  // (only before the closing brace)
        if (node.free_keys || !required_left(node, top.b)) whitespace();
        return;
      }
      if (byte == '}' && (node.free_keys || !required_left(node, top.b))) return pop_and_continue(false);
      if (byte == ',' && top.a == 0 && (node.free_keys || top.b < node.properties.size())) {
        top.a = 0;
        top.op = Op::kObjKey;
        keep(st, out);
      }
      return;

    case Op::kArrOpen:
    case Op::kArrNext: {
      const bool open = top.op == Op::kArrOpen;
      if (is_ws(byte)) {  // (after an item, only before the closing bracket)
        if (open || int64_t(top.b) >= node.min_items) whitespace();
        return;
      }
      if (byte == ']') {
        if (int64_t(top.b) >= node.min_items) pop_and_continue(false);
        return;
      }
      if (!open && (byte != ',' || top.a > 0)) return;
      if (node.max_items >= 0 && int64_t(top.b) >= node.max_items) return;
      ++top.b;
      top.a = 0;
      top.op = Op::kArrNext;
      Frame f;
      f.node = uint16_t(node.items);
      f.op = Op::kValue;
      if (!push(st, f)) return;
      if (open) return advance(st, byte, out);  // that byte starts the first item
      return keep(st, out);
    }

    case Op::kString: {
      StringPos p{top.a, uint8_t(top.c)};
      switch (string_byte(p, uint8_t(byte))) {
        case StringByte::kRefused:
          return;
        case StringByte::kClose:
          if (int64_t(top.b) >= node.min_length) pop_and_continue(false);
          return;
        case StringByte::kCodePoint:  // within maxLength?
          if (node.max_length >= 0 && int64_t(top.b) >= node.max_length) return;
          ++top.b;
          break;
        case StringByte::kInside:
          break;
      }
      top.a = p.escape;
      top.c = p.utf8;
      return keep(st, out);
    }

    case Op::kNumber: {
      const bool integer = node.kind == Kind::kInteger;
      uint8_t next = 0xFF;
      switch (top.a) {
        case kStart:
          next = byte == '-' ? kMinus : byte == '0' ? kZero : is_digit(byte) ? kInt : 0xFF;
          break;
        case kMinus:
          next = byte == '0' ? kZero : is_digit(byte) ? kInt : 0xFF;
          break;
        case kZero:
        case kInt:
          if (is_digit(byte) && top.a == kInt) next = kInt;
          else if (byte == '.' && !integer) next = kDot;
          else if ((byte == 'e' || byte == 'E') && !integer) next = kExp;
          break;
        case kDot:
        case kFrac:
          if (is_digit(byte)) next = kFrac;
          else if ((byte == 'e' || byte == 'E') && top.a == kFrac) next = kExp;
          break;
        case kExp:
          next = (byte == '+' || byte == '-') ? kExpSign : is_digit(byte) ? kExpDigit : 0xFF;
          break;
        case kExpSign:
          if (is_digit(byte)) next = kExpDigit;
          break;
        case kExpDigit:
          if (is_digit(byte)) next = kExpDigits2;
          break;
        default:  // kExpDigits2: the exponent is whole
          break;
      }
      if (next != 0xFF) {
        // (a phase that needs one more byte to be a number, only where that byte still fits)
        if (top.b + 1 + (number_complete(next) ? 0 : 1) > uint32_t(kMaxNumberBytes)) return;
        top.a = next;
        ++top.b;
        return keep(st, out);
      }
      if (number_complete(top.a)) pop_and_continue(true);  // the byte belongs to what follows the number
      return;
    }

    case Op::kLiteral:
      return literal_step(st, node, top.b & 0xFFFFF, top.c, top.b >> 20, byte, out);
  }
}

bool Matcher::step(const State& s, uint8_t byte, State& next) const {
  next.clear();
  Stack st;
  size_t begin = 0;
  for (uint32_t end : s.ends) {
    st.n = int(end - begin);
    if (st.n > 0) std::memcpy(st.f, s.frames.data() + begin, sizeof(Frame) * size_t(st.n));
    advance(st, byte, next);
    begin = end;
  }
  return !next.dead();
}

bool Matcher::feed(State& s, std::string_view bytes, State& scratch) const {
  for (char c : bytes) {
    if (!step(s, uint8_t(c), scratch)) {
      s.clear();
      return false;
    }
    std::swap(s, scratch);
  }
  return !s.dead();
}

namespace {
// Calls f(frames, n) for each stack of s (n frames from `frames`) until it returns true; whether one did.
template <class F>
bool any_stack(const Matcher::State& s, F f) {
  size_t begin = 0;
  for (uint32_t end : s.ends) {
    if (f(s.frames.data() + begin, end - begin)) return true;
    begin = end;
  }
  return false;
}
}  // namespace

// (what advance() takes for the end: a whole value, or a root number that may still grow)
bool Matcher::can_end(const State& s) const {
  return any_stack(s, [](const Frame* f, size_t n) {
    return n == 0 || (n == 1 && f[0].op == Op::kNumber && number_complete(f[0].a));
  });
}

bool Matcher::finished(const State& s) const {
  return !s.dead() && !any_stack(s, [](const Frame*, size_t n) { return n != 0; });
}

bool Matcher::in_string(const State& s, std::vector<InString>& out) const {
  out.clear();
  const bool all = !s.dead() && !any_stack(s, [&](const Frame* f, size_t n) {
    if (n == 0 || f[n - 1].op != Op::kString) return true;
    const Frame& top = f[n - 1];
    const Node& node = g_.nodes[top.node];
    InString in;
    in.pos = StringPos{top.a, uint8_t(top.c)};
    in.room = node.max_length < 0 ? INT64_MAX : node.max_length - int64_t(top.b);
    in.needed = std::max<int64_t>(0, node.min_length - int64_t(top.b));
    out.push_back(in);
    return false;
  });
  if (!all) out.clear();
  return all;
}

void Matcher::close_strings(const State& s, uint64_t which, State& out) const {
  out.clear();
  Stack st;
  size_t begin = 0;
  for (size_t i = 0; i < s.ends.size(); begin = s.ends[i++]) {
    if (i >= 64 || !(which >> i & 1)) continue;
    st.n = int(s.ends[i] - begin) - 1;  // (the string's frame popped)
    if (st.n > 0) std::memcpy(st.f, s.frames.data() + begin, sizeof(Frame) * size_t(st.n));
    keep(st, out);
  }
}

}  // namespace nextn::structured
