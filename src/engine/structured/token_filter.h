// From bytes to token ids: which tokens of the vocabulary a Matcher state allows, and a sequence's constraint
// (its state after the emitted tokens, and a second one run ahead over a round's drafts).
//
// The vocabulary is a byte trie walked depth-first with the matcher's state, so a byte refused at a node
// prunes every token below it (outside strings almost all of them after the first byte). Inside a string, what
// a token does up to a closing quote depends only on the position in the string (escape and UTF-8 state,
// matcher.h's StringPos), so the vocabulary precomputes it for each position: the tokens that stay inside the
// string (a mask, and the characters each adds, for maxLength), and the tokens that reach a closing quote (the
// characters before it, for minLength and maxLength, and a trie of their bytes after it). A mask inside a
// string is then that mask, trimmed to the string's lengths, plus the closing tokens whose bytes after the
// quote the matcher takes from the state after the string: the only walk left, over a few hundred trie nodes.
// Masks are cached by state: a round's verify rows meet the states its drafts were masked in.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/structured/matcher.h"

namespace nextn {
class Tokenizer;
}

namespace nextn::structured {

// A set of token ids as bits (a mask of a 150k vocabulary is 19 KB).
class TokenMask {
 public:
  void clear(int64_t size) { size_ = size, bits_.assign(size_t((size + 63) / 64), 0); }
  void set(int32_t id) { bits_[size_t(id) >> 6] |= uint64_t(1) << (id & 63); }
  bool test(int32_t id) const { return bits_[size_t(id) >> 6] >> (id & 63) & 1; }
  void reset(int32_t id) { bits_[size_t(id) >> 6] &= ~(uint64_t(1) << (id & 63)); }
  int64_t size() const { return size_; }
  int64_t count() const;
  // logits[id] = -inf for every id not in the set (logits: [size()]).
  void exclude_others(float* logits) const;

 private:
  int64_t size_ = 0;
  std::vector<uint64_t> bits_;
};

class TokenVocab {
 public:
  // bytes[id]: what token id decodes to; empty for ids never allowed (special and unused ids).
  explicit TokenVocab(std::vector<std::string> bytes);
  // The model's ids [0, vocab): the tokenizer's bytes, special tokens excluded.
  static std::shared_ptr<const TokenVocab> from_tokenizer(const Tokenizer& tokenizer, int64_t vocab);

  int64_t size() const { return int64_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }

 private:
  friend class TokenFilter;
  struct TrieNode {
    uint32_t first_child = 0, children = 0;  // children are contiguous, by byte
    uint32_t first_token = 0, tokens = 0;    // ids ending here: trie_tokens_[first_token, +tokens)
    uint8_t byte = 0;
  };
  struct Trie {
    std::vector<TrieNode> nodes;  // [0]: the root
    std::vector<int32_t> tokens;
  };
  static Trie build(std::vector<std::pair<std::string_view, int32_t>> entries);

  // The vocabulary inside a string from one StringPos, for any string: what depends on the string's minLength
  // and maxLength (and the characters it has) is kept as character counts, compared when masking.
  struct InString {
    TokenMask stays;                    // the tokens whose bytes all stay inside the string
    std::vector<int32_t> stay_ids;      // the same, fewest characters first
    std::vector<int32_t> stay_chars;    // [i]: the characters stay_ids[i] adds
    std::vector<TokenMask> stays_upto;  // [k]: those adding at most k characters (large sets only)
    struct Close {
      int32_t id = 0, chars = 0;  // chars: before the closing quote
    };
    std::vector<Close> closes;  // the tokens that reach a closing quote
    int32_t max_close_chars = 0;
    Trie after;  // their bytes after the quote (a token of this trie: an index into closes)
  };
  void add_string_position(StringPos p);
  const InString* in_string(StringPos p) const;

  std::vector<std::string> bytes_;
  Trie all_;
  std::vector<InString> strings_;      // one per StringPos a string can be in
  std::vector<StringPos> string_pos_;  // [i]: the position of strings_[i]
  size_t max_len_ = 0;
};

// Allowed tokens of one state. Holds the walk's scratch states (one per trie depth): not thread-safe.
class TokenFilter {
 public:
  TokenFilter(std::shared_ptr<const Matcher> matcher, std::shared_ptr<const TokenVocab> vocab,
              std::vector<int32_t> end_ids);
  // The tokens that may come next in state s (an end id when the output may end there); returns how many.
  int64_t allowed(const Matcher::State& s, TokenMask& allowed);
  const Matcher& matcher() const { return *matcher_; }
  const TokenVocab& vocab() const { return *vocab_; }
  bool is_end(int32_t id) const;

 private:
  template <class OnToken>
  void walk(const TokenVocab::Trie& trie, uint32_t node, size_t depth, OnToken& on_token);
  // s inside a string (every stack; stacks_ filled by Matcher::in_string): the mask from the vocabulary's
  // InString table of their position. False (allowed unset) where the stacks are at different positions.
  bool allowed_in_string(const Matcher::State& s, TokenMask& allowed);
  // The tokens of `in` that stay inside the string, with at most `room` characters, into out (a copy).
  static void stays_within(const TokenVocab::InString& in, int64_t room, TokenMask& out);

  std::shared_ptr<const Matcher> matcher_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<int32_t> end_ids_;
  std::vector<Matcher::State> depth_;                // [max token length + 1]
  std::vector<Matcher::InString> stacks_;  // allowed_in_string's: each stack's string,
  std::vector<uint64_t> closed_by_;        // [closing token]: the stacks it closes (bit i: stack i),
  std::vector<uint64_t> groups_;           // the distinct closed_by_ values
};

// One sequence's structured output: the state after its emitted tokens, and a draft state run ahead over
// the drafts of a round. Greedy and sampled rows are masked alike, so speculation keeps the output exactly
// what plain decoding under the same constraint gives.
class OutputConstraint {
 public:
  OutputConstraint(std::shared_ptr<const Matcher> matcher, std::shared_ptr<const TokenVocab> vocab,
                   std::vector<int32_t> end_ids);

  // Disallowed tokens' logits -> -inf for the state after the emitted tokens. Throws nextn::Error when the
  // vocabulary has no token that can continue (a grammar the tokenizer cannot spell).
  void mask(float* logits) { apply(now_, logits, /*draft=*/false); }
  // An emitted token (allowed by mask); returns false for a token the grammar refuses (a caller's bug).
  bool advance(int32_t token);
  // The output is complete and nothing may follow it: generation ends with this token.
  bool finished() const { return filter_.matcher().finished(now_); }

  // A round's drafts: begin_draft() copies the state, then mask_draft / advance_draft per draft step. A
  // draft state with nothing allowed (past the end of the output) masks nothing out: such drafts are never
  // verified, as the output ends before them.
  void begin_draft();
  void mask_draft(float* logits);
  void advance_draft(int32_t token);

 private:
  void apply(const Matcher::State& s, float* logits, bool draft);
  bool step_token(Matcher::State& s, int32_t token);

  TokenFilter filter_;
  Matcher::State now_, draft_, scratch_;
  bool draft_dead_ = false;
  // Masks by state: a few most recent (a round's drafts, then its verify rows in the same states).
  struct Entry {
    Matcher::State state;
    TokenMask allowed;
    int64_t count = 0;
    uint64_t used = 0;
  };
  std::vector<Entry> cache_;
  Entry* cached(const Matcher::State& s);  // the entry of state s, or null
  uint64_t uses_ = 0;
};

}  // namespace nextn::structured
