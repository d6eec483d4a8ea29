#include "serve/openai_request.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "engine/structured/grammar.h"
#include "serve/api_error.h"
#include "serve/chat_template/chat_template.h"

namespace nextn::serve {
namespace {

using nlohmann::json;

// The field, or null when it is absent or JSON null (OpenAI treats both as "not given").
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string range_text(double lo, double hi) { return json(lo).dump() + " and " + json(hi).dump(); }

double number(const json& body, const char* name, double def, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) throw bad_field(name, std::string("'") + name + "' must be a number, got " + v->dump());
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_field(name, std::string("'") + name + "' must be between " + range_text(lo, hi) + ", got " + v->dump());
  return x;
}

int64_t integer(const json& body, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)))
    throw bad_field(name, std::string("'") + name + "' must be an integer, got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw bad_field(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                              std::to_string(hi) + ", got " + v->dump());
  return x;
}

bool boolean(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) throw bad_field(name, std::string("'") + name + "' must be true or false, got " + v->dump());
  return v->get<bool>();
}

void check_object(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
}

void check_model(const json& body, const ServedModel& m) {
  const json* v = field(body, "model");
  if (!v) return;
  if (!v->is_string()) throw bad_field("model", "'model' must be a string, got " + v->dump());
  if (v->get<std::string>() != m.id)
    throw ApiError(404, "The model '" + v->get<std::string>() + "' does not exist; this server serves '" + m.id + "'",
                   "model", "invalid_request_error", "model_not_found");
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  std::vector<std::string> out;
  if (!v) return out;
  auto add = [&](const json& s) {
    if (!s.is_string()) throw bad_field("stop", "'stop' must be a string or an array of strings, got " + v->dump());
    if (s.get<std::string>().empty()) throw bad_field("stop", "'stop' strings must not be empty");
    out.push_back(s.get<std::string>());
  };
  if (v->is_array()) {
    if (v->size() > 64) throw bad_field("stop", "'stop' holds " + std::to_string(v->size()) + " strings; at most 64");
    for (const json& s : *v) add(s);
  } else {
    add(*v);
  }
  return out;
}

// response_format (structured/grammar.h's grammar_of_response_format), read from the ordered body when there is
// one: a schema's properties come out in the order the client wrote them.
OutputFormat output_format(const json& body, const ServedModel& m, const nlohmann::ordered_json* ordered) {
  const json* rf = field(body, "response_format");
  if (!rf) return {};
  std::optional<structured::Grammar> g;
  try {
    g = structured::grammar_of_response_format(ordered ? ordered->at("response_format") : nlohmann::ordered_json(*rf),
                                               "response_format");
  } catch (const Error& e) {
    throw bad_field("response_format", e.what());
  }
  if (!g) return {};
  if (!m.vocab)
    throw bad_field("response_format", "'response_format' " + rf->at("type").get<std::string>() +
                                           " needs the model's tokenizer; this model has none");
  return OutputFormat{std::make_shared<const structured::Matcher>(std::move(*g)), m.vocab};
}

// The ids of the JSON array `ids`, each a token of the model (else a 400 naming the field `name`).
std::vector<int32_t> token_ids_of(const json& ids, const ServedModel& m, const char* name) {
  std::vector<int32_t> out;
  for (const json& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.facts->vocab_size)
      throw bad_field(name, std::string("'") + name + "' holds " + t.dump() + ", not a token id of this model (0.." +
                                std::to_string(m.facts->vocab_size - 1) + ")");
    out.push_back(t.get<int32_t>());
  }
  return out;
}

// vLLM's request extensions that would change the output and nextn does not implement: a 400 naming the field
// instead of an output that silently ignores it (each may still be given at its default, as clients send them).
void refuse_unsupported_extensions(const json& body) {
  const auto refuse = [](const char* name) {
    throw bad_field(name, std::string("'") + name + "' is not supported by this server");
  };
  for (const char* name : {"bad_words", "allowed_token_ids", "prompt_logprobs", "guided_json", "guided_regex",
                           "guided_choice", "guided_grammar", "structured_outputs", "truncate_prompt_tokens"})
    if (field(body, name)) refuse(name);
  if (boolean(body, "include_stop_str_in_output", false)) refuse("include_stop_str_in_output");
  if (!boolean(body, "skip_special_tokens", true)) refuse("skip_special_tokens");
  if (boolean(body, "use_beam_search", false)) refuse("use_beam_search");
}

}  // namespace

std::vector<std::pair<int32_t, float>> logit_bias_from_json(const json& v, int64_t vocab) {
  if (!v.is_object()) throw Error("'logit_bias' must be an object mapping token ids to biases, got " + v.dump());
  std::vector<std::pair<int32_t, float>> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0) throw Error("'logit_bias' key '" + key + "' is not a token id");
    if (id >= vocab)
      throw Error("'logit_bias' token id " + key + " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
    const json& b = it.value();
    if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() < -100 || b.get<double>() > 100)
      throw Error("'logit_bias' bias of token " + key + " must be a number between -100 and 100, got " + b.dump());
    out.emplace_back(int32_t(id), b.get<float>());
  }
  return out;
}

namespace {

// Sampling, penalties, n, seed, speculation and streaming: the fields both endpoints share.
void parse_common(const json& body, const ServedModel& m, ApiRequest& r, const nlohmann::ordered_json* ordered) {
  SamplingParams& p = r.params;
  p.temperature = float(number(body, "temperature", 1.0, 0.0, 100.0));
  p.top_p = float(number(body, "top_p", 1.0, 0.0, 1.0));
  if (p.top_p <= 0.0f) throw bad_field("top_p", "'top_p' must be greater than 0, got 0");
  const int64_t top_k = integer(body, "top_k", 0, -1, INT32_MAX);
  p.top_k = top_k < 0 ? 0 : int(top_k);  // -1 (vLLM) and 0: off
  p.min_p = float(number(body, "min_p", 0.0, 0.0, 1.0));
  p.presence_penalty = float(number(body, "presence_penalty", 0.0, -2.0, 2.0));
  p.frequency_penalty = float(number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  p.repetition_penalty = float(number(body, "repetition_penalty", 1.0, 1e-6, 100.0));
  if (const json* lb = field(body, "logit_bias")) {
    try {
      p.logit_bias = logit_bias_from_json(*lb, m.facts->vocab_size);
    } catch (const Error& e) {
      throw bad_field("logit_bias", e.what());
    }
  }
  r.n = int(integer(body, "n", 1, 1, m.max_n));
  if (field(body, "seed")) {
    p.seed = uint64_t(integer(body, "seed", 0, INT64_MIN, INT64_MAX));
  } else {  // (no output to reproduce: a sampled request's k may follow measured speed, SamplingParams)
    std::random_device rd;
    p.seed = (uint64_t(rd()) << 32) ^ rd();
    p.reproducible = false;
  }
  p.stop = stop_strings(body);
  if (!p.stop.empty() && !m.tokenizer) throw bad_field("stop", "'stop' needs a tokenizer; this model has none");
  if (!boolean(body, "ignore_eos", false)) p.stop_token_ids = m.facts->eos_token_ids;
  if (const json* ids = field(body, "stop_token_ids")) {  // (vLLM's: more ids that end the output, emitted as eos)
    if (!ids->is_array()) throw bad_field("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (int32_t t : token_ids_of(*ids, m, "stop_token_ids")) p.stop_token_ids.push_back(t);
  }
  p.min_tokens = int(integer(body, "min_tokens", 0, 0, INT32_MAX));  // (vLLM's; checked against max_tokens below)
  refuse_unsupported_extensions(body);
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad_field("stream_options", "'stream_options' must be an object");
    if (!r.stream) throw bad_field("stream_options", "'stream_options' is only allowed with 'stream': true");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  r.return_token_ids = boolean(body, "return_token_ids", false);

  r.spec = m.default_spec;
  if (field(body, "num_speculative_tokens")) {
    const int k = int(integer(body, "num_speculative_tokens", 0, 0, 8));
    r.spec.enabled = k > 0 && m.facts->num_mtp_layers > 0;
    r.spec.num_speculative_tokens = std::max(k, 1);
    r.spec.tune_k = false;  // an explicit k is kept
  }
  r.format = output_format(body, m, ordered);
}

// max_tokens against the context: absent = what the context leaves after the longest prompt.
void set_max_tokens(const json& body, const char* name, const ServedModel& m, ApiRequest& r) {
  size_t longest = 0;
  for (const auto& p : r.prompts) longest = std::max(longest, p.size());
  const int64_t context = m.facts->context;
  const int64_t left = context - int64_t(longest);
  if (left < 1)
    throw bad_field(r.chat ? "messages" : "prompt",
                    "This model's maximum context length is " + std::to_string(context) + " tokens. However, your " +
                        (r.chat ? "messages" : "prompt") + " resulted in " + std::to_string(longest) +
                        " tokens, leaving no room for the completion.");
  const json* v = field(body, name);
  const int64_t max_tokens = v ? integer(body, name, 0, 1, INT32_MAX) : left;
  if (max_tokens > left)
    throw bad_field(name, "This model's maximum context length is " + std::to_string(context) +
                              " tokens. However, you requested " + std::to_string(int64_t(longest) + max_tokens) +
                              " tokens (" + std::to_string(longest) + " in the " + (r.chat ? "messages" : "prompt") +
                              ", " + std::to_string(max_tokens) + " in the completion). Please reduce the length " +
                              "of the " + (r.chat ? "messages" : "prompt") + " or the completion.");
  r.params.max_tokens = int(max_tokens);
}

void finish_validation(ApiRequest& r) {
  if (r.params.min_tokens > r.params.max_tokens)
    throw bad_field("min_tokens", "'min_tokens' (" + std::to_string(r.params.min_tokens) +
                                      ") must be at most max_tokens (" + std::to_string(r.params.max_tokens) + ")");
  try {
    r.params.validate();
    r.spec.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
}

std::vector<int32_t> token_ids(const json& ids, const ServedModel& m) {
  std::vector<int32_t> out = token_ids_of(ids, m, "prompt");
  if (out.empty()) throw bad_field("prompt", "'prompt' must not be empty");
  return out;
}

std::vector<int32_t> encode_prompt(const std::string& text, const ServedModel& m) {
  if (!m.tokenizer) throw bad_field("prompt", "this model has no tokenizer: give 'prompt' as token ids");
  std::vector<int32_t> ids = m.tokenizer->encode(text, /*add_special=*/true);
  if (ids.empty()) throw bad_field("prompt", "'prompt' must not be empty");
  return ids;
}

// A string, an array of token ids, or an array of either (a batch).
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const ServedModel& m) {
  const json* v = field(body, "prompt");
  if (!v) throw bad_field("prompt", "'prompt' is required");
  if (v->is_string()) return {encode_prompt(v->get<std::string>(), m)};
  if (!v->is_array() || v->empty())
    throw bad_field("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
  if ((*v)[0].is_number()) return {token_ids(*v, m)};
  if (v->size() > size_t(m.max_n))
    throw bad_field("prompt", "'prompt' holds " + std::to_string(v->size()) + " prompts; at most " +
                                  std::to_string(m.max_n));
  std::vector<std::vector<int32_t>> out;
  for (const json& p : *v) {
    if (p.is_string())
      out.push_back(encode_prompt(p.get<std::string>(), m));
    else if (p.is_array())
      out.push_back(token_ids(p, m));
    else
      throw bad_field("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
  }
  return out;
}

void check_messages(const json& messages) {
  if (!messages.is_array() || messages.empty())
    throw bad_field("messages", "'messages' must be a non-empty array of messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& msg = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) throw bad_field("messages", where + " must be an object");
    const auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) throw bad_field("messages", where + ".role must be a string");
    const auto content = msg.find("content");
    if (content != msg.end() && !content->is_null() && !content->is_string() && !content->is_array())
      throw bad_field("messages", where + ".content must be a string or an array of content parts");
    if (content != msg.end() && content->is_array())
      for (const json& part : *content)
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw bad_field("messages", where + ".content: only {\"type\": \"text\", \"text\": ...} parts are supported");
  }
}

// tool_choice: absent, "none" or "auto" (the model may answer in text); "required" or
// {"type": "function", "function": {"name": ...}} force a call.
ForcedToolCall forced_tool_call(const json& body) {
  const json* tc = field(body, "tool_choice");
  ForcedToolCall f;
  if (!tc || (tc->is_string() && (*tc == "none" || *tc == "auto"))) return f;
  if (tc->is_string() && *tc == "required") {
    f.mode = ForcedToolCall::Mode::kRequired;
  } else if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("function") &&
             tc->at("function").is_object() && tc->at("function").contains("name") &&
             tc->at("function").at("name").is_string()) {
    f.mode = ForcedToolCall::Mode::kNamed;
    f.name = tc->at("function").at("name").get<std::string>();
  } else {
    throw bad_field("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  const json* tools = field(body, "tools");
  if (!tools || tools->empty()) throw bad_field("tool_choice", "'tool_choice' forces a call but 'tools' is empty");
  return f;
}

// The grammar of a forced call: the named function's parameters schema (its arguments' JSON), or for
// "required" one {"name": <a tool's name>, "arguments": <its parameters>} object (an anyOf over the tools).
// Each tool's parameters are a document of their own: their "$ref"s resolve within them in both cases.
OutputFormat tool_call_format(const json& body, const ServedModel& m, const ForcedToolCall& f,
                              const nlohmann::ordered_json* ordered) {
  if (!m.vocab) throw bad_field("tool_choice", "forcing a tool call needs the model's tokenizer; this model has none");
  using ojson = nlohmann::ordered_json;
  const ojson tools = ordered ? ordered->at("tools") : ojson(body.at("tools"));
  std::vector<std::pair<std::string, ojson>> functions;  // (name, parameters)
  const ojson* named = nullptr;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string())
      throw bad_field("tools", "'" + at + "' must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
    const std::string name = t["function"]["name"].get<std::string>();
    functions.emplace_back(name, t["function"].contains("parameters") && !t["function"]["parameters"].is_null()
                                     ? t["function"]["parameters"]
                                     : ojson{{"type", "object"}, {"properties", ojson::object()}});
  }
  for (const auto& [name, params] : functions)
    if (f.mode == ForcedToolCall::Mode::kNamed && name == f.name) named = &params;
  if (f.mode == ForcedToolCall::Mode::kNamed && !named)
    throw bad_field("tool_choice", "'tool_choice' names the function '" + f.name + "', which is not among 'tools'");
  try {
    structured::GrammarBuilder b;
    const std::string where = named ? "the parameters of tool '" + f.name + "'" : "tools";
    int root = -1;
    if (named) {
      root = b.schema(*named, where);
    } else {
      std::vector<int> calls;
      for (const auto& [name, params] : functions) {
        const int args = b.schema(params, "the parameters of tool '" + name + "'");
        calls.push_back(b.object({{"name", b.literal(name)}, {"arguments", args}}));
      }
      root = b.any_of(std::move(calls));
    }
    return OutputFormat{std::make_shared<const structured::Matcher>(std::move(b).finish(root, where)), m.vocab};
  } catch (const Error& e) {
    throw bad_field("tools", e.what());
  }
}

}  // namespace

ApiRequest parse_completion_request(const json& body, const ServedModel& m, const nlohmann::ordered_json* ordered) {
  check_object(body);
  check_model(body, m);
  ApiRequest r;
  r.prompts = completion_prompts(body, m);
  parse_common(body, m, r, ordered);
  if (boolean(body, "echo", false)) throw bad_field("echo", "'echo' is not supported");
  if (field(body, "suffix")) throw bad_field("suffix", "'suffix' is not supported");
  if (field(body, "best_of") && integer(body, "best_of", 1, 1, 1) != 1) throw bad_field("best_of", "'best_of' must be 1");
  r.logprobs = int(integer(body, "logprobs", -1, 0, 20));
  set_max_tokens(body, "max_tokens", m, r);
  finish_validation(r);
  return r;
}

ApiRequest parse_chat_request(const json& body, const ServedModel& m, const nlohmann::ordered_json* ordered) {
  check_object(body);
  check_model(body, m);
  ApiRequest r;
  r.chat = true;
  if (!m.chat_template || !m.tokenizer)
    throw ApiError(400, "this model has no chat template (tokenizer_config.json's chat_template or "
                        "chat_template.jinja): use /v1/completions, or start the server with --chat-template FILE");
  const json* messages = field(body, "messages");
  if (!messages) throw bad_field("messages", "'messages' is required");
  for (const char* old : {"functions", "function_call"})  // (OpenAI's deprecated forms: a forced call must not be lost)
    if (field(body, old))
      throw bad_field(old, std::string("'") + old + "' (deprecated by OpenAI) is not supported: give 'tools' and "
                                                     "'tool_choice'");
  check_messages(*messages);
  const json* tools = field(body, "tools");
  if (tools && !tools->is_array()) throw bad_field("tools", "'tools' must be an array");
  r.tool_call = forced_tool_call(body);
  json extra = json::object();
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    extra = *kw;
  }
  const bool add_generation_prompt = boolean(body, "add_generation_prompt", true);
  std::string text;
  try {
    if (ordered) {
      using ojson = nlohmann::ordered_json;
      const auto pick = [&](const char* name, ojson def) {
        const auto it = ordered->find(name);
        return it == ordered->end() || it->is_null() ? def : *it;
      };
      text = m.chat_template->render(pick("messages", ojson::array()), add_generation_prompt, pick("tools", nullptr),
                                     pick("chat_template_kwargs", ojson::object()));
    } else {
      text = m.chat_template->render(*messages, add_generation_prompt, tools ? *tools : json(nullptr), extra);
    }
  } catch (const Error& e) {
    throw bad_field("messages", std::string("the chat template refused the messages: ") + e.what());
  }
  r.prompts = {m.tokenizer->encode(text, /*add_special=*/false)};
  if (r.prompts[0].empty()) throw bad_field("messages", "the rendered conversation is empty");
  parse_common(body, m, r, ordered);
  if (r.tool_call.mode != ForcedToolCall::Mode::kNone) {
    if (r.format.constrained())
      throw bad_field("response_format",
                      "'response_format' cannot be combined with a 'tool_choice' that forces a call");
    r.format = tool_call_format(body, m, r.tool_call, ordered);
  }
  if (boolean(body, "logprobs", false)) r.logprobs = int(integer(body, "top_logprobs", 0, 0, 20));
  else if (field(body, "top_logprobs")) throw bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  set_max_tokens(body, field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", m, r);
  finish_validation(r);
  return r;
}

}  // namespace nextn::serve
