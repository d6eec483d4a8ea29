#include "engine/structured/token_filter.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/error.h"
#include "io/tokenizer.h"

namespace nextn::structured {
int64_t TokenMask::count() const {
  int64_t n = 0;
  for (uint64_t w : bits_) n += __builtin_popcountll(w);
  return n;
}

void TokenMask::exclude_others(float* logits) const {
  for (size_t w = 0; w < bits_.size(); ++w) {
    const uint64_t word = bits_[w];
    if (word == ~uint64_t(0)) continue;
    const int64_t base = int64_t(w) * 64, end = std::min<int64_t>(size_, base + 64);
    for (int64_t id = base; id < end; ++id)
      if (!(word >> (id - base) & 1)) logits[id] = -INFINITY;
  }
}

TokenVocab::TokenVocab(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  if (bytes_.size() > size_t(INT32_MAX)) throw Error("structured output: the vocabulary is too large");
  std::vector<std::pair<std::string_view, int32_t>> all;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const std::string& b = bytes_[i];
    if (b.empty()) continue;
    max_len_ = std::max(max_len_, b.size());
    all.emplace_back(b, int32_t(i));
  }
  all_ = build(std::move(all));
  // Every position a string can be in (from between characters, over any bytes), and its tables.
  string_pos_.push_back(StringPos{});
  for (size_t i = 0; i < string_pos_.size(); ++i)
    for (int b = 0; b < 256; ++b) {
      StringPos p = string_pos_[i];
      const StringByte r = string_byte(p, uint8_t(b));
      if ((r == StringByte::kCodePoint || r == StringByte::kInside) &&
          std::find(string_pos_.begin(), string_pos_.end(), p) == string_pos_.end())
        string_pos_.push_back(p);
    }
  for (StringPos p : string_pos_) add_string_position(p);
}

// All tokens from position p (the trie walked with the string's automaton alone): those that stay inside the
// string, by the characters they add, and those that reach a closing quote, with their bytes after it.
void TokenVocab::add_string_position(StringPos p) {
  constexpr size_t kUptoMasks = 16, kUptoMinTokens = 4096;
  InString in;
  in.stays.clear(size());
  std::vector<std::pair<int32_t, int32_t>> stays;  // (characters, id)
  std::vector<std::pair<std::string_view, int32_t>> after;
  struct Item {
    uint32_t node;
    StringPos pos;
    int32_t chars;
    uint32_t depth;  // the node's bytes
  };
  std::vector<Item> work{{0, p, 0, 0}};
  std::vector<uint32_t> below;
  while (!work.empty()) {
    const Item it = work.back();
    work.pop_back();
    const TrieNode& n = all_.nodes[it.node];
    for (uint32_t c = n.first_child; c < n.first_child + n.children; ++c) {
      const TrieNode& child = all_.nodes[c];
      StringPos q = it.pos;
      const StringByte r = string_byte(q, child.byte);
      if (r == StringByte::kRefused) continue;
      if (r == StringByte::kClose) {  // every token from here on closes the string after it.chars characters
        below.assign(1, c);
        while (!below.empty()) {
          const TrieNode& m = all_.nodes[below.back()];
          below.pop_back();
          for (uint32_t t = m.first_token; t < m.first_token + m.tokens; ++t) {
            const int32_t id = all_.tokens[t];
            after.emplace_back(std::string_view(bytes_[size_t(id)]).substr(it.depth + 1), int32_t(in.closes.size()));
            in.closes.push_back({id, it.chars});
          }
          for (uint32_t k = m.first_child; k < m.first_child + m.children; ++k) below.push_back(k);
        }
        continue;
      }
      const int32_t chars = it.chars + (r == StringByte::kCodePoint);
      for (uint32_t t = child.first_token; t < child.first_token + child.tokens; ++t) {
        stays.emplace_back(chars, all_.tokens[t]);
        in.stays.set(all_.tokens[t]);
      }
      if (child.children) work.push_back({c, q, chars, it.depth + 1});
    }
  }
  // Fewest characters first (a counting sort: a token adds at most as many characters as it has bytes).
  std::vector<size_t> first(max_len_ + 2, 0);
  for (const auto& [chars, id] : stays) ++first[size_t(chars) + 1];
  for (size_t k = 1; k < first.size(); ++k) first[k] += first[k - 1];
  in.stay_ids.resize(stays.size());
  in.stay_chars.resize(stays.size());
  for (const auto& [chars, id] : stays) {
    const size_t at = first[size_t(chars)]++;
    in.stay_ids[at] = id, in.stay_chars[at] = chars;
  }
  if (stays.size() >= kUptoMinTokens) {
    TokenMask upto;
    upto.clear(size());
    size_t i = 0;
    for (size_t k = 0; k < kUptoMasks; ++k) {
      for (; i < stays.size() && size_t(in.stay_chars[i]) <= k; ++i) upto.set(in.stay_ids[i]);
      in.stays_upto.push_back(upto);
    }
  }
  for (const InString::Close& c : in.closes) in.max_close_chars = std::max(in.max_close_chars, c.chars);
  in.after = build(std::move(after));
  strings_.push_back(std::move(in));
}

const TokenVocab::InString* TokenVocab::in_string(StringPos p) const {
  for (size_t i = 0; i < string_pos_.size(); ++i)
    if (string_pos_[i] == p) return &strings_[i];
  return nullptr;
}

std::shared_ptr<const TokenVocab> TokenVocab::from_tokenizer(const Tokenizer& tokenizer, int64_t vocab) {
  std::vector<std::string> bytes(size_t(std::max<int64_t>(vocab, 0)));
  const int64_t known = std::min<int64_t>(vocab, int64_t(tokenizer.vocab_size()));
  for (int64_t id = 0; id < known; ++id)
    if (!tokenizer.is_special(int32_t(id))) bytes[size_t(id)] = std::string(tokenizer.token_bytes(int32_t(id)));
  return std::make_shared<const TokenVocab>(std::move(bytes));
}

// The trie of entries, children contiguous and in byte order: entries sorted, then each node's range split
// by the byte at its depth (tokens that end at the node come first in its range).
TokenVocab::Trie TokenVocab::build(std::vector<std::pair<std::string_view, int32_t>> entries) {
  std::sort(entries.begin(), entries.end());
  Trie t;
  t.nodes.emplace_back();
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Pending> work{{0, 0, entries.size(), 0}};
  while (!work.empty()) {
    const Pending p = work.back();
    work.pop_back();
    size_t i = p.lo;
    TrieNode& node = t.nodes[p.node];
    node.first_token = uint32_t(t.tokens.size());
    for (; i < p.hi && entries[i].first.size() == p.depth; ++i) t.tokens.push_back(entries[i].second);
    node.tokens = uint32_t(t.tokens.size()) - node.first_token;
    // children: runs of equal byte at p.depth
    std::vector<Pending> kids;
    for (size_t j = i; j < p.hi;) {
      const char c = entries[j].first[p.depth];
      size_t k = j;
      while (k < p.hi && entries[k].first[p.depth] == c) ++k;
      kids.push_back({0, j, k, p.depth + 1});
      j = k;
    }
    const uint32_t first = uint32_t(t.nodes.size());
    t.nodes[p.node].first_child = first;
    t.nodes[p.node].children = uint32_t(kids.size());
    for (size_t c = 0; c < kids.size(); ++c) {
      TrieNode child;
      child.byte = uint8_t(entries[kids[c].lo].first[p.depth]);
      t.nodes.push_back(child);
      kids[c].node = first + uint32_t(c);
      work.push_back(kids[c]);
    }
  }
  return t;
}

TokenFilter::TokenFilter(std::shared_ptr<const Matcher> matcher, std::shared_ptr<const TokenVocab> vocab,
                         std::vector<int32_t> end_ids)
    : matcher_(std::move(matcher)), vocab_(std::move(vocab)), end_ids_(std::move(end_ids)) {
  depth_.resize(vocab_->max_len_ + 1);
}

bool TokenFilter::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

template <class OnToken>
void TokenFilter::walk(const TokenVocab::Trie& trie, uint32_t node, size_t depth, OnToken& on_token) {
  const TokenVocab::TrieNode& n = trie.nodes[node];
  for (uint32_t c = n.first_child; c < n.first_child + n.children; ++c) {
    const TokenVocab::TrieNode& child = trie.nodes[c];
    if (!matcher_->step(depth_[depth], child.byte, depth_[depth + 1])) continue;
    for (uint32_t t = child.first_token; t < child.first_token + child.tokens; ++t) on_token(trie.tokens[t]);
    if (child.children) walk(trie, c, depth + 1, on_token);
  }
}

void TokenFilter::stays_within(const TokenVocab::InString& in, int64_t room, TokenMask& out) {
  const size_t n = in.stay_ids.size();
  if (n == 0 || room >= in.stay_chars.back()) {
    out = in.stays;  // (a copy into the kept buffer)
    return;
  }
  if (room < int64_t(in.stays_upto.size())) {
    out = in.stays_upto[size_t(room)];
    return;
  }
  // Fewest characters first: the tokens within room are a prefix of stay_ids.
  const size_t within = size_t(std::upper_bound(in.stay_chars.begin(), in.stay_chars.end(), room) -
                               in.stay_chars.begin());
  if (within <= n - within) {
    out.clear(in.stays.size());
    for (size_t i = 0; i < within; ++i) out.set(in.stay_ids[i]);
  } else {
    out = in.stays;
    for (size_t i = within; i < n; ++i) out.reset(in.stay_ids[i]);
  }
}

bool TokenFilter::allowed_in_string(const Matcher::State& s, TokenMask& allowed) {
  // Stacks inside strings are all at one position: they read the same bytes since their strings opened (a quote
  // that opened one string closes another, or follows a backslash in it, which no stack reads outside a
  // string). Were they not, the caller walks the whole trie.
  const TokenVocab::InString* table = vocab_->in_string(stacks_[0].pos);
  int64_t room = 0;
  for (const Matcher::InString& at : stacks_) {
    if (!(at.pos == stacks_[0].pos)) return false;
    room = std::max(room, at.room);
  }
  if (!table) return false;
  const TokenVocab::InString& in = *table;
  // The tokens that stay inside the string: those some stack's maxLength allows.
  stays_within(in, room, allowed);
  // The tokens that reach a closing quote: the strings read their bytes before it alike, so the state after
  // the quote is that of the stacks whose lengths allow the characters before it, their strings closed. Tokens
  // that close the same stacks continue from the same state: their bytes after the quote are walked from it
  // (one walk in all for one stack, or where every stack's lengths allow every closing token).
  const size_t n = stacks_.size();
  const uint64_t every = n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
  bool all_fit = true;
  for (const Matcher::InString& at : stacks_) all_fit &= at.needed == 0 && at.room >= in.max_close_chars;
  groups_.assign(1, every);
  if (!all_fit) {
    closed_by_.resize(in.closes.size());
    groups_.clear();
    for (size_t c = 0; c < in.closes.size(); ++c) {
      const int32_t chars = in.closes[c].chars;
      uint64_t g = 0;
      for (size_t i = 0; i < n; ++i) g |= uint64_t(chars <= stacks_[i].room && chars >= stacks_[i].needed) << i;
      closed_by_[c] = g;
      if (g && std::find(groups_.begin(), groups_.end(), g) == groups_.end()) groups_.push_back(g);
    }
  }
  const TokenVocab::TrieNode& root = in.after.nodes[0];
  for (uint64_t g : groups_) {
    auto on_token = [&](int32_t index) {
      if (all_fit || closed_by_[size_t(index)] == g) allowed.set(in.closes[size_t(index)].id);
    };
    for (uint32_t t = root.first_token; t < root.first_token + root.tokens; ++t) on_token(in.after.tokens[t]);
    if (root.children == 0) continue;
    matcher_->close_strings(s, g, depth_[0]);
    walk(in.after, 0, 0, on_token);
  }
  return true;
}

int64_t TokenFilter::allowed(const Matcher::State& s, TokenMask& allowed) {
  const TokenVocab& v = *vocab_;
  if (s.dead()) {
    allowed.clear(v.size());
    return 0;
  }
  if (!matcher_->in_string(s, stacks_) || !allowed_in_string(s, allowed)) {
    allowed.clear(v.size());
    depth_[0] = s;
    auto on_token = [&](int32_t id) { allowed.set(id); };
    walk(v.all_, 0, 0, on_token);
  }
  if (matcher_->can_end(s))
    for (int32_t e : end_ids_)
      if (e >= 0 && e < v.size()) allowed.set(e);
  return allowed.count();
}

OutputConstraint::OutputConstraint(std::shared_ptr<const Matcher> matcher, std::shared_ptr<const TokenVocab> vocab,
                                   std::vector<int32_t> end_ids)
    : filter_(matcher, std::move(vocab), std::move(end_ids)), now_(matcher->start()) {}

bool OutputConstraint::step_token(Matcher::State& s, int32_t token) {
  if (filter_.is_end(token)) return filter_.matcher().can_end(s);
  if (token < 0 || token >= filter_.vocab().size()) return false;
  const std::string& b = filter_.vocab().bytes(token);
  return !b.empty() && filter_.matcher().feed(s, b, scratch_);
}

bool OutputConstraint::advance(int32_t token) { return step_token(now_, token); }

void OutputConstraint::begin_draft() {
  draft_ = now_;
  draft_dead_ = false;
}

void OutputConstraint::advance_draft(int32_t token) {
  if (draft_dead_) return;
  if (filter_.is_end(token) || !step_token(draft_, token)) draft_dead_ = true;
}

void OutputConstraint::mask_draft(float* logits) {
  if (!draft_dead_) apply(draft_, logits, /*draft=*/true);
}

OutputConstraint::Entry* OutputConstraint::cached(const Matcher::State& s) {
  ++uses_;
  for (Entry& e : cache_)
    if (e.state.ends == s.ends && e.state.frames == s.frames) {
      e.used = uses_;
      return &e;
    }
  return nullptr;
}

void OutputConstraint::apply(const Matcher::State& s, float* logits, bool draft) {
  constexpr size_t kCacheEntries = 10;  // a round of up to 8 drafts and its verify rows
  Entry* entry = cached(s);
  if (!entry) {
    if (cache_.size() < kCacheEntries) cache_.emplace_back();
    entry = &cache_.front();  // the least recently used
    for (Entry& e : cache_)
      if (e.used < entry->used) entry = &e;
    entry->state = s;
    entry->count = filter_.allowed(s, entry->allowed);
    entry->used = uses_;
  }
  if (entry->count == 0) {
    if (draft) return;  // (see mask_draft)
    throw Error("structured output: no token of the vocabulary can continue the output here (the tokenizer cannot "
                "spell what the schema requires next)");
  }
  entry->allowed.exclude_others(logits);
}

}  // namespace nextn::structured
