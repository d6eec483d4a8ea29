// OpenAI request bodies (completions, chat completions) -> what the engine runs. Every check names the field
// it refuses (ApiError 400 with `param`), so the official clients show a useful message.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"
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
  int max_n = 16;
};

struct ApiRequest {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // completions: one per prompt; chat: the rendered conversation
  int n = 1;                                  // choices per prompt
  bool stream = false, include_usage = false, return_token_ids = false;
  int logprobs = -1;                          // -1: none; else the number of top alternatives per token
  SamplingParams params;                      // (choice j's seed is params.seed + j)
  SpecOptions spec;
  size_t choices() const { return prompts.size() * size_t(n); }
};

// Throw ApiError (400 naming the field, 404 for an unknown model) for anything the engine could not run as
// asked, including a prompt + max_tokens past the model's context.
ApiRequest parse_completion_request(const nlohmann::json& body, const ServedModel& model);
// `ordered`: the same body parsed as nlohmann::ordered_json, whose messages, tools and chat_template_kwargs
// then reach the template in the request's key order (templates print tool definitions with tojson, and
// transformers keeps that order; nlohmann::json sorts keys).
ApiRequest parse_chat_request(const nlohmann::json& body, const ServedModel& model,
                              const nlohmann::ordered_json* ordered = nullptr);

}  // namespace nextn::serve
