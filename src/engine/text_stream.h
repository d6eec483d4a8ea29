// The text side of one generation request, shared by the CLI and servers: streaming detokenization, stop
// strings, and the JSON form of logprobs.
//
// TextStream turns the generated token ids into text as they come. Each push() returns only text that is
// safe to show: it never ends inside a UTF-8 character, and it holds back any tail that could still grow
// into a stop string. When a stop string appears, the text is cut just before it (the stop string is not
// part of the output) and the stream reports it, so the caller can end generation.
//
// Stop strings match the text decoded with special tokens skipped, at any position, also across token
// boundaries. When several match in the same step, the one that starts earliest wins. With min_tokens (vLLM's),
// they apply from the min_tokens-th token on: a stop string that ended before it does not stop the text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"  // TokenLogprob
#include "io/tokenizer.h"

namespace nextn {

class TextStream {
 public:
  // `tokenizer` may be null: ids-only mode, where push() and finish() return no text and stop strings are
  // not allowed. The tokenizer must outlive the stream. Throws nextn::Error for an empty stop string, one
  // that is not valid UTF-8 (it could end the text inside a character), or stop strings without a
  // tokenizer; the message names the stop string.
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings, int64_t min_tokens = 0);

  struct Delta {
    std::string text;      // newly printable text (may be empty)
    bool stopped = false;  // a stop string was hit: generation should end; `text` is the last of it
  };
  // The token just generated. Throws nextn::Error for an id that is not a token, as
  // Tokenizer::decode() does. After a stop string was hit, further tokens are ignored ({"", true}).
  // Throws nextn::Error after finish().
  Delta push(int32_t token);
  // The end of generation: returns everything not yet returned (the decoder's incomplete trailing bytes
  // become U+FFFD; stop strings still apply to that text). Later calls return "".
  std::string finish();

  bool has_tokenizer() const { return tok_ != nullptr; }
  // The whole text so far, cut before the stop string if one was hit. Before finish() it can be longer
  // than what push() has returned (the held-back tail).
  const std::string& text() const { return text_; }
  // Bytes of text() returned by push()/finish() so far.
  size_t emitted_size() const { return emitted_; }
  bool stopped_on_text() const { return stop_index_ >= 0; }
  // Index into the stop strings of the one that was hit, or -1.
  int stop_index() const { return stop_index_; }
  bool finished() const { return finished_; }

 private:
  // Looks for a stop string that ends past `old_size` (the text before the latest append); cuts the text
  // at the earliest one. Returns whether one was found.
  bool find_stop(size_t old_size);
  // Bytes at the end of text() that could still become a stop string.
  size_t holdback() const;
  // Returns text()[emitted_, upto) and advances emitted_ (upto moves back to a character boundary).
  std::string take(size_t upto);

  const Tokenizer* tok_;
  std::vector<std::string> stop_;
  std::unique_ptr<StreamingDecoder> dec_;
  std::string text_;
  int64_t min_tokens_ = 0, tokens_ = 0;  // stop strings apply once tokens_ >= min_tokens_
  size_t emitted_ = 0;
  int stop_index_ = -1;
  bool finished_ = false;
};

// The logprobs of generated tokens as a JSON array, the form `nextn generate --json --logprobs N` prints:
// [{"token": id, "logprob": l, "top": [{"token": id, "logprob": l}, ...]}, ...].
nlohmann::json logprobs_json(const std::vector<TokenLogprob>& logprobs);

}  // namespace nextn
