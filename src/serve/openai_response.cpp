#include "serve/openai_response.h"

#include <tuple>
#include <utility>

#include "serve/api_error.h"

namespace nextn::serve {
namespace {

using nlohmann::json;

// A token's text as logprobs show it: its bytes (a byte-level piece may be part of a character: those bytes
// show as U+FFFD), and the bytes themselves as integers (chat's "bytes").
std::string token_text(const Tokenizer* tok, int32_t id) {
  return tok ? utf8_lossy(tok->token_bytes(id)) : "token_id:" + std::to_string(id);
}

json token_bytes(const Tokenizer* tok, int32_t id) {
  json out = json::array();
  if (tok)
    for (unsigned char c : tok->token_bytes(id)) out.push_back(int(c));
  return out;
}

const char* object_name(const ApiRequest& r, bool chunk) {
  if (!r.chat) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

// "abort" (the client went away) is nobody's business but the metrics'; clients see "stop".
std::string api_finish_reason(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

// A forced tool call's id: the same in every chunk of the choice.
std::string tool_call_id(const ResponseHeader& h, size_t index) {
  const size_t dash = h.id.find('-');
  return "call_" + (dash == std::string::npos ? h.id : h.id.substr(dash + 1)) + "_" + std::to_string(index);
}

// (stream chunks number their calls with "index"; a message's list does not)
json tool_call_json(const ResponseHeader& h, size_t index, const std::string& name, const std::string& arguments,
                    bool chunk) {
  json call = {{"id", tool_call_id(h, index)},
               {"type", "function"},
               {"function", {{"name", name}, {"arguments", arguments}}}};
  if (chunk) call["index"] = 0;
  return call;
}

// The message (or final delta) of a finished choice under a forced tool call, and its finish_reason: a named
// function's call carries the generated text as its arguments (finish_reason "stop", as OpenAI answers a
// forced function; "length" when max_tokens cut the arguments); "required" parses {"name", "arguments"}
// (finish_reason "tool_calls"; cut short, the text stays content, finish_reason "length").
std::pair<json, std::string> tool_call_message(const ApiRequest& r, const ResponseHeader& h, size_t index,
                                               const ChoiceOutput& c, bool chunk) {
  json msg = {{"role", "assistant"}, {"content", nullptr}};
  const std::string reason = api_finish_reason(c.finish_reason);
  if (r.tool_call.mode == ForcedToolCall::Mode::kNamed) {
    msg["tool_calls"] = json::array({tool_call_json(h, index, r.tool_call.name, c.text, chunk)});
    return {msg, reason};
  }
  const json call = json::parse(c.text, nullptr, /*allow_exceptions=*/false);
  if (reason != "stop" || !call.is_object() || !call.contains("name") || !call.contains("arguments")) {
    msg["content"] = c.text;
    return {msg, reason};
  }
  msg["tool_calls"] =
      json::array({tool_call_json(h, index, call["name"].get<std::string>(), call["arguments"].dump(), chunk)});
  return {msg, "tool_calls"};
}

}  // namespace

json error_body(const ApiError& e) {
  std::string type = e.type;
  if (type.empty()) type = e.status == 429 ? "rate_limit_error" : e.status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error",
           {{"message", e.what()},
            {"type", type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json nextn_stats(const std::vector<const ChoiceOutput*>& choices) {
  SpecStats sum;
  double ttft = 0, decode_seconds = 0;
  int64_t decode_tokens = 0;
  for (const ChoiceOutput* c : choices) {
    const SpecStats& s = c->stats;
    sum.num_drafts += s.num_drafts;
    sum.num_draft_tokens += s.num_draft_tokens;
    sum.num_accepted_tokens += s.num_accepted_tokens;
    if (sum.accepted_per_position.size() < s.accepted_per_position.size())
      sum.accepted_per_position.resize(s.accepted_per_position.size(), 0);
    for (size_t i = 0; i < s.accepted_per_position.size(); ++i) sum.accepted_per_position[i] += s.accepted_per_position[i];
    if (sum.rounds_at_k.size() < s.rounds_at_k.size()) sum.rounds_at_k.resize(s.rounds_at_k.size(), 0);
    for (size_t k = 0; k < s.rounds_at_k.size(); ++k) sum.rounds_at_k[k] += s.rounds_at_k[k];
    ttft = std::max(ttft, c->time_to_first_token);
    decode_seconds += s.decode_seconds;
    decode_tokens += std::max<int64_t>(0, s.num_generated - 1);
  }
  return {{"num_drafts", sum.num_drafts},
          {"num_draft_tokens", sum.num_draft_tokens},
          {"num_accepted_tokens", sum.num_accepted_tokens},
          {"mean_acceptance_length", sum.mean_acceptance_length()},
          {"accepted_per_position", sum.accepted_per_position},
          {"rounds_at_k", sum.rounds_at_k},
          {"decode_tokens_per_second", decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0.0},
          {"time_to_first_token_s", ttft}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_logprobs(const std::vector<TokenLogprob>& lp, size_t from, size_t to, const Tokenizer* tok,
                         int64_t text_offset0) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  int64_t offset = text_offset0;
  for (size_t i = from; i < to && i < lp.size(); ++i) {
    const std::string text = token_text(tok, lp[i].token);
    tokens.push_back(text);
    values.push_back(lp[i].logprob);
    json top = json::object();
    for (const auto& [id, l] : lp[i].top) top[token_text(tok, id)] = l;
    // (the sampled token is always there, as OpenAI's legacy completions and vLLM give it: up to N + 1 entries)
    if (!top.contains(text)) top[text] = lp[i].logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += tok ? int64_t(tok->token_bytes(lp[i].token).size()) : 0;
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const std::vector<TokenLogprob>& lp, size_t from, size_t to, const Tokenizer* tok) {
  json content = json::array();
  for (size_t i = from; i < to && i < lp.size(); ++i) {
    json top = json::array();
    for (const auto& [id, l] : lp[i].top)
      top.push_back({{"token", token_text(tok, id)}, {"logprob", l}, {"bytes", token_bytes(tok, id)}});
    content.push_back({{"token", token_text(tok, lp[i].token)},
                       {"logprob", lp[i].logprob},
                       {"bytes", token_bytes(tok, lp[i].token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json final_response(const ApiRequest& r, const ResponseHeader& h, const std::vector<ChoiceOutput>& choices,
                    int64_t prompt_tokens, const Tokenizer* tok) {
  json out_choices = json::array();
  int64_t completion_tokens = 0;
  std::vector<const ChoiceOutput*> all;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    all.push_back(&c);
    completion_tokens += int64_t(c.ids.size());
    json lp = nullptr;
    if (r.logprobs >= 0)
      lp = r.chat ? chat_logprobs(c.logprobs, 0, c.logprobs.size(), tok)
                  : completion_logprobs(c.logprobs, 0, c.logprobs.size(), tok, 0);
    json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", api_finish_reason(c.finish_reason)}};
    if (r.chat && r.tool_call.mode != ForcedToolCall::Mode::kNone)
      std::tie(choice["message"], choice["finish_reason"]) = tool_call_message(r, h, i, c, /*chunk=*/false);
    else if (r.chat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    if (r.return_token_ids) choice["token_ids"] = c.ids;
    out_choices.push_back(std::move(choice));
  }
  return {{"id", h.id},
          {"object", object_name(r, false)},
          {"created", h.created},
          {"model", h.model},
          {"choices", out_choices},
          {"usage", usage_json(prompt_tokens, completion_tokens)},
          {"nextn", nextn_stats(all)}};
}

json stream_chunk(const ApiRequest& r, const ResponseHeader& h, size_t index, const std::string& text,
                  const ChoiceOutput& c, size_t from, size_t to, int64_t text_offset0, bool first, bool finish,
                  const Tokenizer* tok) {
  json lp = nullptr;
  if (r.logprobs >= 0 && to > from)
    lp = r.chat ? chat_logprobs(c.logprobs, from, to, tok) : completion_logprobs(c.logprobs, from, to, tok, text_offset0);
  json choice = {{"index", index},
                 {"logprobs", lp},
                 {"finish_reason", finish ? json(api_finish_reason(c.finish_reason)) : json(nullptr)}};
  if (r.chat && r.tool_call.mode == ForcedToolCall::Mode::kNamed) {
    // The call from the first chunk, its arguments' text as it comes (OpenAI's streamed tool calls).
    json delta = json::object();
    if (first) {
      delta = {{"role", "assistant"}, {"content", nullptr},
               {"tool_calls", json::array({tool_call_json(h, index, r.tool_call.name, text, /*chunk=*/true)})}};
    } else if (!text.empty()) {
      delta["tool_calls"] = json::array({{{"index", 0}, {"function", {{"arguments", text}}}}});
    }
    choice["delta"] = delta;
  } else if (r.chat && r.tool_call.mode == ForcedToolCall::Mode::kRequired) {
    // The function's name is known only once generated: the call comes whole with the last chunk.
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (finish) {
      auto [msg, reason] = tool_call_message(r, h, index, c, /*chunk=*/true);
      for (const char* k : {"content", "tool_calls"})
        if (msg.contains(k) && !msg[k].is_null()) delta[k] = msg[k];
      choice["finish_reason"] = reason;
    }
    choice["delta"] = delta;
  } else if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (r.return_token_ids) choice["token_ids"] = std::vector<int32_t>(c.ids.begin() + from, c.ids.begin() + to);
  if (finish) choice["nextn"] = nextn_stats({&c});
  return {{"id", h.id},
          {"object", object_name(r, true)},
          {"created", h.created},
          {"model", h.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const ApiRequest& r, const ResponseHeader& h, const std::vector<ChoiceOutput>& choices,
                 int64_t prompt_tokens) {
  int64_t completion_tokens = 0;
  std::vector<const ChoiceOutput*> all;
  for (const ChoiceOutput& c : choices) {
    completion_tokens += int64_t(c.ids.size());
    all.push_back(&c);
  }
  return {{"id", h.id},
          {"object", object_name(r, true)},
          {"created", h.created},
          {"model", h.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens)},
          {"nextn", nextn_stats(all)}};
}

}  // namespace nextn::serve
