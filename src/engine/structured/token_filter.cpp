#include "engine/structured/token_filter.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/error.h"
#include "io/tokenizer.h"

namespace nextn::structured {
namespace {

// Code points of a token that is plain string content (complete UTF-8 characters, none of them a quote,
// backslash or control character), or -1.
int32_t plain_code_points(std::string_view b) {
  if (b.empty()) return -1;
  int32_t n = 0;
  for (size_t i = 0; i < b.size();) {
    const uint8_t c = uint8_t(b[i]);
    size_t len = 1;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x20 || c == '"' || c == '\\') return -1;
    if (c >= 0x80) {
      if (c >= 0xC2 && c <= 0xDF) len = 2;
      else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      else return -1;
      if (i + len > b.size()) return -1;
      for (size_t j = 1; j < len; ++j) {
        const uint8_t d = uint8_t(b[i + j]);
        if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF)) return -1;
      }
    }
    i += len;
    ++n;
  }
  return n;
}

}  // namespace

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
  plain_chars_.assign(bytes_.size(), -1);
  std::vector<std::pair<std::string_view, int32_t>> all, non_plain;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const std::string& b = bytes_[i];
    if (b.empty()) continue;
    max_len_ = std::max(max_len_, b.size());
    all.emplace_back(b, int32_t(i));
    plain_chars_[i] = plain_code_points(b);
    if (plain_chars_[i] >= 0) plain_.push_back(int32_t(i));
    else non_plain.emplace_back(b, int32_t(i));
  }
  plain_mask_.clear(int64_t(bytes_.size()));
  for (int32_t id : plain_) plain_mask_.set(id);
  all_ = build(std::move(all));
  non_plain_ = build(std::move(non_plain));
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

void TokenFilter::walk(const TokenVocab::Trie& trie, uint32_t node, size_t depth, TokenMask& allowed) {
  const TokenVocab::TrieNode& n = trie.nodes[node];
  for (uint32_t c = n.first_child; c < n.first_child + n.children; ++c) {
    const TokenVocab::TrieNode& child = trie.nodes[c];
    if (!matcher_->step(depth_[depth], child.byte, depth_[depth + 1])) continue;
    for (uint32_t t = child.first_token; t < child.first_token + child.tokens; ++t) allowed.set(trie.tokens[t]);
    if (child.children) walk(trie, c, depth + 1, allowed);
  }
}

int64_t TokenFilter::allowed(const Matcher::State& s, TokenMask& allowed) {
  const TokenVocab& v = *vocab_;
  if (s.dead()) {
    allowed.clear(v.size());
    return 0;
  }
  depth_[0] = s;
  if (matcher_->in_plain_string(s)) {
    const int64_t room = matcher_->plain_room(s);
    if (room == INT64_MAX) {
      allowed = v.plain_mask_;  // (a copy into the kept buffer)
    } else {
      allowed.clear(v.size());
      for (int32_t id : v.plain_)
        if (v.plain_chars_[size_t(id)] <= room) allowed.set(id);
    }
    walk(v.non_plain_, 0, 0, allowed);
  } else {
    allowed.clear(v.size());
    walk(v.all_, 0, 0, allowed);
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
