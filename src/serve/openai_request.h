// OpenAI request bodies (completions, chat completions) -> what the engine runs. Every check names the field
// it refuses (ApiError 400 with `param`), so the official clients show a useful message.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/request.h"
#include "engine/structured/token_filter.h"
#include "io/tokenizer.h"
#include "models/model.h"

namespace nextn::serve {

class ChatTemplate;

// What parsing needs to know about the served model.
struct ServedModel {
  std::string id;                               // the name clients give as "model"
  const ModelFacts* facts = nullptr;
  const Tokenizer* tokenizer = nullptr;         // null: completions take token-id prompts only
  const ChatTemplate* chat_template = nullptr;  // null: the chat endpoint is refused (400)
  SpecOptions default_spec;                     // k, tuned or not, when a request does not set num_speculative_tokens
  // The vocabulary's bytes for response_format json_object / json_schema (null: refused, no tokenizer).
  std::shared_ptr<const structured::TokenVocab> vocab;
  int max_n = 16;
};

// tool_choice that forces a call (chat): the reply is the call, generated under the tools' schemas.
struct ForcedToolCall {
  enum class Mode { kNone, kNamed, kRequired };
  Mode mode = Mode::kNone;
  std::string name;  // kNamed: the function; the output is its arguments' JSON
                     // (kRequired: the output is {"name": ..., "arguments": {...}} for one of the tools)
};

struct ApiRequest {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // completions: one per prompt; chat: the rendered conversation
  int n = 1;                                  // choices per prompt
  bool stream = false, include_usage = false, return_token_ids = false;
  int logprobs = -1;                          // -1: none; else the number of top alternatives per token
  SamplingParams params;                      // (choice j's seed is params.seed + j)
  SpecOptions spec;
  OutputFormat format;                        // response_format json_object / json_schema, or a forced tool call
  ForcedToolCall tool_call;
  size_t choices() const { return prompts.size() * size_t(n); }
};

// OpenAI's logit_bias, {"<token id>": bias in [-100, 100], ...} -> (id, bias) pairs for SamplingParams, ids inside
// a vocabulary of `vocab` tokens. Throws nextn::Error saying what is wrong (the server's 400 names the field).
std::vector<std::pair<int32_t, float>> logit_bias_from_json(const nlohmann::json& v, int64_t vocab);

// Throw ApiError (400 naming the field, 404 for an unknown model) for anything the engine could not run as
// asked, including a prompt + max_tokens past the model's context.
// `ordered`: the same body as nlohmann::ordered_json (a response_format's schema keeps its properties' order,
// which is the order the output gives them in).
ApiRequest parse_completion_request(const nlohmann::json& body, const ServedModel& model,
                                    const nlohmann::ordered_json* ordered = nullptr);
// `ordered`: the same body parsed as nlohmann::ordered_json, whose messages, tools and chat_template_kwargs
// then reach the template in the request's key order (templates print tool definitions with tojson, and
// transformers keeps that order; nlohmann::json sorts keys), and whose response_format and tool schemas keep
// their properties' order.
ApiRequest parse_chat_request(const nlohmann::json& body, const ServedModel& model,
                              const nlohmann::ordered_json* ordered = nullptr);

}  // namespace nextn::serve
