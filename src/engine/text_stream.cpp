#include "engine/text_stream.h"

#include <algorithm>

#include "core/error.h"

namespace nextn {
namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > n) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t j = 2; j < len; ++j)
      if (!is_continuation(static_cast<char>(p[i + j]))) return false;
    i += len;
  }
  return true;
}

}  // namespace

TextStream::TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings, int64_t min_tokens)
    : tok_(tokenizer), stop_(std::move(stop_strings)), min_tokens_(min_tokens) {
  if (!stop_.empty() && !tok_) throw Error("stop strings need a tokenizer (ids-only generation has no text)");
  for (size_t i = 0; i < stop_.size(); ++i) {
    if (stop_[i].empty()) throw Error("stop string #" + std::to_string(i + 1) + " is empty");
    if (!valid_utf8(stop_[i])) throw Error("stop string #" + std::to_string(i + 1) + " is not valid UTF-8");
  }
  if (tok_) dec_ = std::make_unique<StreamingDecoder>(*tok_, /*skip_special=*/true);
}

TextStream::Delta TextStream::push(int32_t token) {
  if (finished_) throw Error("TextStream: push() after finish()");
  if (stop_index_ >= 0) return {"", true};
  if (!tok_) return {};
  const size_t old_size = text_.size();
  text_ += dec_->push(token);
  if (++tokens_ >= min_tokens_ && find_stop(old_size)) return {take(text_.size()), true};
  return {take(text_.size() - holdback()), false};
}

std::string TextStream::finish() {
  if (finished_) return "";
  finished_ = true;
  if (!tok_) return "";
  if (stop_index_ < 0) {
    const size_t old_size = text_.size();
    text_ += dec_->flush();
    if (tokens_ >= min_tokens_) find_stop(old_size);
  }
  return take(text_.size());
}

bool TextStream::find_stop(size_t old_size) {
  size_t best = std::string::npos;
  int which = -1;
  for (size_t i = 0; i < stop_.size(); ++i) {
    const std::string& s = stop_[i];
    // The text before old_size held no stop string, so a new match ends past it.
    const size_t from = old_size >= s.size() - 1 ? old_size - (s.size() - 1) : 0;
    const size_t at = text_.find(s, from);
    if (at < best) {
      best = at;
      which = static_cast<int>(i);
    }
  }
  if (which < 0) return false;
  // What was returned can never be part of a match: holdback() kept every tail that could become one.
  if (best < emitted_) throw Error("internal: a stop string matched text already returned");
  text_.resize(best);
  stop_index_ = which;
  return true;
}

size_t TextStream::holdback() const {
  // The longest tail of the unreturned text that is a proper prefix of some stop string. (A tail that is
  // a whole stop string was cut by find_stop.)
  const std::string_view pending = std::string_view(text_).substr(emitted_);
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t k = std::min(s.size() - 1, pending.size()); k > hold; --k) {
      if (pending.ends_with(std::string_view(s).substr(0, k))) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

std::string TextStream::take(size_t upto) {
  // Never cut inside a UTF-8 character. (The decoder emits whole characters and valid stop strings start
  // at one, so this only guards the invariant.)
  while (upto > emitted_ && upto < text_.size() && is_continuation(text_[upto])) --upto;
  if (upto <= emitted_) return "";
  std::string out = text_.substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return out;
}

nlohmann::json logprobs_json(const std::vector<TokenLogprob>& logprobs) {
  nlohmann::json lps = nlohmann::json::array();
  for (const auto& lp : logprobs) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, l] : lp.top) top.push_back({{"token", id}, {"logprob", l}});
    lps.push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"top", top}});
  }
  return lps;
}

}  // namespace nextn
