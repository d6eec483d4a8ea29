// The byte-level recognizer of a Grammar (grammar.h): which bytes may come next after a prefix of the output.
//
// A parse position is a stack of frames (the containers open, the value being read); a State is the set of
// stacks the prefix can be in (more than one where anyOf alternatives, optional properties or enum values
// share a prefix). Each byte moves every stack or drops it; a State with no stack left is a dead prefix.
// Steps write into a caller's State whose vectors keep their capacity, so masking a vocabulary allocates
// nothing once warm.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/structured/grammar.h"

namespace nextn::structured {

enum class Op : uint8_t {
  kValue,     // a value of `node` comes next (whitespace first)
  kObjOpen,   // after '{': a key's quote, or '}' when nothing required remains
  kObjColon,  // after a key: ':'
  kObjNext,   // after a property's value: ',' or '}'
  kObjKey,    // after ',': a key's quote
  kKey,       // inside a declared key: b = the property, c = bytes of its spelling matched
  kArrOpen,   // after '[': ']' or the first item
  kArrNext,   // after an item: ',' or ']'; b = items so far
  kString,    // inside a string: a = escape state, b = code points so far, c = UTF-8 state
  kNumber,    // a = phase, b = bytes so far
  kLiteral,   // the literals [lo, hi) of the node (sorted) that share the pos bytes matched: b = lo | pos << 20, c = hi
};

// (12 bytes, no padding: stacks compare with memcmp.) kObj*: a = whitespace run, b = the next property that
// may come, c = the property whose value is read; kValue / kArr*: a = whitespace run.
struct Frame {
  uint16_t node = 0;
  Op op = Op::kValue;
  uint8_t a = 0;
  uint32_t b = 0, c = 0;
  bool operator==(const Frame&) const = default;
};

// Inside a string (an Op::kString frame): its escape state (Frame::a) and UTF-8 state (Frame::c), and what one
// byte does there. The string's own bytes depend on nothing else (its lengths aside), so the token filter
// (token_filter.h) runs the vocabulary through string_byte once per position and masks inside a string
// without walking the matcher's stacks, except over the bytes after a closing quote.
struct StringPos {
  uint8_t escape = 0;  // 0: between characters; a backslash, then \u's hex digits
  uint8_t utf8 = 0;    // continuation bytes still to come (low 2 bits), the range the next must be in (bits 2-4)
  bool operator==(const StringPos&) const = default;
};
enum class StringByte : uint8_t {
  kRefused,    // not allowed here
  kCodePoint,  // starts a character (counted against maxLength)
  kInside,     // continues one (a UTF-8 continuation byte, an escape's body)
  kClose,      // the closing quote (allowed where minLength is met)
};
// What byte does at p; p is then the position after it (when kCodePoint or kInside).
StringByte string_byte(StringPos& p, uint8_t byte);

constexpr int kMaxFrames = 2 * kMaxNesting + 4;
// The most stacks a State keeps: a schema whose alternatives share long prefixes (thousands of enum values
// after their quote, hundreds of optional properties) would otherwise make every byte, and every token of a
// mask, cost that many steps. Past it the later alternatives are dropped for that prefix: each stack kept can
// still complete, so the output stays valid (a subset of what the schema allows, as elsewhere).
constexpr size_t kMaxStacks = 64;

class Matcher {
 public:
  explicit Matcher(Grammar grammar);

  struct State {
    std::vector<Frame> frames;  // the stacks, one after another
    std::vector<uint32_t> ends; // stack i is frames[ends[i - 1], ends[i])
    size_t stacks() const { return ends.size(); }
    bool dead() const { return ends.empty(); }
    void clear() { frames.clear(), ends.clear(); }
  };

  State start() const;
  // next = the state after `byte` (cleared first); false when no stack survives.
  bool step(const State& s, uint8_t byte, State& next) const;
  // s advanced over `bytes` in place (scratch: a caller's buffer); false (s dead) at the first byte refused.
  bool feed(State& s, std::string_view bytes, State& scratch) const;
  // The output may end here: some stack holds a complete value (a root number may still grow).
  bool can_end(const State& s) const;
  // Nothing may follow: every stack is complete and none can grow.
  bool finished(const State& s) const;
  // Where each stack of s is inside a string: its position, the characters it may still add (INT64_MAX: no
  // maxLength) and those it needs before its closing quote (minLength). False (out cleared) unless every stack
  // of a live s is inside a string.
  struct InString {
    StringPos pos;
    int64_t room = 0, needed = 0;
  };
  bool in_string(const State& s, std::vector<InString>& out) const;
  // out = s after a closing quote of the strings of the stacks in `which` (bit i: stack i), whatever their
  // lengths (each one's string frame popped, as step() does for a quote that closes it; the other stacks
  // dropped): valid when in_string(s).
  void close_strings(const State& s, uint64_t which, State& out) const;

  const Grammar& grammar() const { return g_; }

 private:
  struct Stack {
    int n = 0;
    Frame f[kMaxFrames];
  };
  void advance(Stack st, int byte, State& out) const;  // byte < 0: the end of the output
  void value(Stack& st, const Node& node, int byte, State& out) const;
  bool push(Stack& st, Frame f) const;
  static void keep(const Stack& st, State& out);
  int nesting(const Stack& st) const;
  bool required_left(const Node& n, uint32_t from) const;
  // The literals of [lo, hi) (sharing their first pos bytes) whose byte pos is `byte`, kept as one stack, and
  // the one that ends there (it sorts first) as a completed stack.
  void literal_step(Stack& st, const Node& node, uint32_t lo, uint32_t hi, uint32_t pos, int byte, State& out) const;

  Grammar g_;
  std::vector<int> min_nesting_;  // [node] (grammar.h): a container opens only where its value can still close
  // Nodes the matcher adds for values inside kAny: any object, any array, any string, any number,
  // true / false / null.
  int any_ = 0, any_object_ = 0, any_array_ = 0, any_string_ = 0, any_number_ = 0, any_literal_ = 0;
};

}  // namespace nextn::structured
