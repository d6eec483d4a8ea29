// The OpenAI response bodies and stream chunks the server sends, from what the engine produced.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"
#include "io/tokenizer.h"
#include "serve/openai_request.h"

namespace nextn::serve {

// What one choice has produced so far (or in all, once finished).
struct ChoiceOutput {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;  // "" while running; "stop" | "length" | "abort" | "error"
  std::string error;          // finish_reason "error": what went wrong
  SpecStats stats;
  double time_to_first_token = 0;  // seconds from arrival
};

// The identity every chunk and response of one request repeats.
struct ResponseHeader {
  std::string id;      // "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
};

// nextn's extension object: speculation stats summed over `choices`.
nlohmann::json nextn_stats(const std::vector<const ChoiceOutput*>& choices);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// logprobs of tokens [from, to) of a choice, in the endpoint's shape (completions: tokens / token_logprobs /
// top_logprobs / text_offset, `text_offset0` the offset of token `from`'s text; chat: {"content": [...]}).
nlohmann::json completion_logprobs(const std::vector<TokenLogprob>& lp, size_t from, size_t to,
                                   const Tokenizer* tok, int64_t text_offset0);
nlohmann::json chat_logprobs(const std::vector<TokenLogprob>& lp, size_t from, size_t to, const Tokenizer* tok);

// The whole response of a finished request (choice i is choices[i]; prompt_tokens summed over choices).
nlohmann::json final_response(const ApiRequest& r, const ResponseHeader& h, const std::vector<ChoiceOutput>& choices,
                              int64_t prompt_tokens, const Tokenizer* tok);

// One stream chunk of choice `index`: its new text and the logprobs of tokens [from, to); `finish`: its
// finish_reason and nextn stats (the choice's last chunk).
nlohmann::json stream_chunk(const ApiRequest& r, const ResponseHeader& h, size_t index, const std::string& text,
                            const ChoiceOutput& c, size_t from, size_t to, int64_t text_offset0, bool first,
                            bool finish, const Tokenizer* tok);
// The chunk stream_options.include_usage asks for: no choices, the usage and the request's nextn stats.
nlohmann::json usage_chunk(const ApiRequest& r, const ResponseHeader& h, const std::vector<ChoiceOutput>& choices,
                           int64_t prompt_tokens);

}  // namespace nextn::serve
