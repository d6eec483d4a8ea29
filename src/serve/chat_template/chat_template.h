// A checkpoint's HuggingFace chat template, rendered as transformers' apply_chat_template renders it (through
// our Jinja subset, jinja.h): what `POST /v1/chat/completions` turns `messages` into before tokenizing.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/chat_template/jinja.h"

namespace nextn::serve {

class ChatTemplate {
 public:
  // The checkpoint's template: `DIR/chat_template.jinja` if present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {"name", "template"} of which "default" is used).
  // bos_token / eos_token from tokenizer_config.json (a string, or an object with "content"), and the other
  // special tokens transformers passes (unk, sep, pad, cls, mask, additional_special_tokens).
  // Returns std::nullopt when the checkpoint has none. Throws nextn::Error naming the file and the construct
  // when the template uses something unsupported or does not parse.
  static std::optional<ChatTemplate> from_checkpoint(const std::string& dir);
  // A template given directly (e.g. --chat-template FILE); `origin` names it in error messages. An empty
  // token leaves that variable undefined in the template (as transformers does for a token the tokenizer lacks).
  static ChatTemplate from_source(const std::string& source, const std::string& origin,
                                  const std::string& bos_token, const std::string& eos_token);
  // A template file (e.g. --chat-template FILE) given the special tokens of the checkpoint in `checkpoint_dir`
  // (from its tokenizer_config.json, when there is one), whether or not the checkpoint has a template itself.
  static ChatTemplate from_file(const std::string& file, const std::string& checkpoint_dir);

  // Renders OpenAI-style `messages` (a JSON array of {role, content, ...}; content may be a string or a list of
  // {type:"text", text} parts, which is joined with "\n" to a string before rendering, as vLLM does), with
  // add_generation_prompt, optional `tools` (JSON array or null) and extra variables (e.g. enable_thinking).
  // Everything else in a message (tool_calls with their arguments, reasoning_content, ...) reaches the template
  // as given, as transformers passes it. The template sees: messages, tools (None when absent), documents
  // (None), add_generation_prompt, the special tokens, and each key of `extra`.
  // Throws nextn::Error for malformed input and jinja::RenderError (a nextn::Error) when the template fails,
  // e.g. calls raise_exception; its detail() is the template's own message.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& tools = nullptr,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same for JSON parsed with nlohmann::ordered_json, which keeps each object's key order: templates print
  // tool definitions with `tojson`, and transformers keeps the request's order, while nlohmann::json sorts keys.
  // Parse request bodies with ordered_json to render exactly what transformers renders.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& origin() const { return template_.origin(); }
  // The bos / eos token the template is given ("" when the tokenizer has none).
  std::string bos_token() const { return special_token("bos_token"); }
  std::string eos_token() const { return special_token("eos_token"); }
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(jinja::Template t, std::string source, nlohmann::ordered_json special_tokens)
      : template_(std::move(t)), source_(std::move(source)), special_tokens_(std::move(special_tokens)) {}

  std::string special_token(const char* name) const {
    return special_tokens_.contains(name) ? special_tokens_[name].get<std::string>() : std::string();
  }

  jinja::Template template_;
  std::string source_;
  nlohmann::ordered_json special_tokens_;  // {"bos_token": "...", ...}: transformers' special_tokens_map
};

}  // namespace nextn::serve
