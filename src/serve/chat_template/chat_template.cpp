#include "serve/chat_template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace nextn::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

OrderedJson read_json(const std::string& path) {
  try {
    return OrderedJson::parse(read_file(path));
  } catch (const OrderedJson::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
}

std::string origin_label(const std::string& file) { return "chat template (" + file + ")"; }

// A special token is a string or an AddedToken object {"content": ...}; null or absent means none.
std::optional<std::string> token_text(const OrderedJson& token, const std::string& file, const std::string& field) {
  if (token.is_null()) return std::nullopt;
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string())
    return token["content"].get<std::string>();
  throw Error(file + ": '" + field + "' must be a string or an object with a string \"content\"");
}

// transformers' special_tokens_map: the special tokens the tokenizer has, each passed to the template.
OrderedJson special_tokens_of(const OrderedJson& config, const std::string& file) {
  OrderedJson tokens = OrderedJson::object();
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (config.contains(name))
      if (std::optional<std::string> text = token_text(config[name], file, name)) tokens[name] = *text;
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    OrderedJson extra = OrderedJson::array();
    for (const OrderedJson& token : config["additional_special_tokens"])
      if (std::optional<std::string> text = token_text(token, file, "additional_special_tokens")) extra.push_back(*text);
    if (!extra.empty()) tokens["additional_special_tokens"] = extra;
  }
  return tokens;
}

// tokenizer_config.json's "chat_template": a string, or named templates of which "default" is the one used.
std::optional<std::string> template_in_config(const OrderedJson& config, const std::string& file) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return std::nullopt;
  const OrderedJson& field = config["chat_template"];
  if (field.is_string()) return field.get<std::string>();
  if (!field.is_array()) throw Error(file + ": 'chat_template' must be a string or a list of {name, template}");
  std::string names;
  for (const OrderedJson& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["template"].is_string())
      throw Error(file + ": each entry of 'chat_template' must be an object with a \"name\" and a string \"template\"");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].dump();
  }
  throw Error(file + ": 'chat_template' has no template named \"default\" (it has " + names + ")");
}

jinja::Value text_parts_joined(const OrderedJson& parts, size_t message_index) {
  std::string joined;
  for (size_t j = 0; j < parts.size(); ++j) {
    const OrderedJson& part = parts[j];
    const std::string where = "messages[" + std::to_string(message_index) + "].content[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type")) throw Error(where + " must be an object with a \"type\"");
    if (part["type"] != "text")
      throw Error(where + ": only text content parts are supported (got type " + part["type"].dump() + ")");
    if (!part.contains("text") || !part["text"].is_string()) throw Error(where + ": \"text\" must be a string");
    if (j) joined += "\n";
    joined += part["text"].get<std::string>();
  }
  return jinja::Value::string(std::move(joined));
}

// The messages as the template sees them: as given, except content parts joined into one string.
jinja::Value messages_value(const OrderedJson& messages) {
  if (!messages.is_array()) throw Error("messages must be a JSON array");
  std::vector<jinja::Value> items;
  for (size_t i = 0; i < messages.size(); ++i) {
    const OrderedJson& message = messages[i];
    if (!message.is_object()) throw Error("messages[" + std::to_string(i) + "] must be a JSON object");
    jinja::DictData fields;
    for (const auto& [key, value] : message.items()) {
      const bool parts = key == "content" && value.is_array();
      fields.entries.emplace_back(jinja::Value::string(key), parts ? text_parts_joined(value, i) : jinja::Value::from_json(value));
    }
    items.push_back(jinja::Value::dict(std::move(fields)));
  }
  return jinja::Value::list(std::move(items));
}

void set_variable(jinja::Variables& vars, const std::string& name, jinja::Value value) {
  for (auto& [key, existing] : vars)
    if (key == name) {
      existing = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::from_checkpoint(const std::string& dir) {
  const std::string jinja_file = dir + "/chat_template.jinja";
  const std::string config_file = dir + "/tokenizer_config.json";
  const bool has_config = std::filesystem::exists(config_file);
  const OrderedJson config = has_config ? read_json(config_file) : OrderedJson::object();
  if (!config.is_object()) throw Error(config_file + ": must be a JSON object");
  const OrderedJson tokens = special_tokens_of(config, config_file);
  std::string source, origin;
  if (std::filesystem::exists(jinja_file)) {
    source = read_file(jinja_file);
    origin = jinja_file;
  } else if (std::optional<std::string> from_config = template_in_config(config, config_file)) {
    source = std::move(*from_config);
    origin = config_file;
  } else {
    return std::nullopt;
  }
  jinja::Template parsed = jinja::Template::parse(source, origin_label(origin));
  return ChatTemplate(std::move(parsed), std::move(source), tokens);
}

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& origin,
                                       const std::string& bos_token, const std::string& eos_token) {
  OrderedJson tokens = OrderedJson::object();
  if (!bos_token.empty()) tokens["bos_token"] = bos_token;
  if (!eos_token.empty()) tokens["eos_token"] = eos_token;
  return ChatTemplate(jinja::Template::parse(source, origin_label(origin)), source, std::move(tokens));
}

ChatTemplate ChatTemplate::from_file(const std::string& file, const std::string& checkpoint_dir) {
  const std::string config_file = checkpoint_dir + "/tokenizer_config.json";
  const OrderedJson config = std::filesystem::exists(config_file) ? read_json(config_file) : OrderedJson::object();
  if (!config.is_object()) throw Error(config_file + ": must be a JSON object");
  std::string source = read_file(file);
  jinja::Template parsed = jinja::Template::parse(source, origin_label(file));
  return ChatTemplate(std::move(parsed), std::move(source), special_tokens_of(config, config_file));
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& tools, const nlohmann::json& extra) const {
  return render(OrderedJson(messages), add_generation_prompt, OrderedJson(tools), OrderedJson(extra));
}

std::string ChatTemplate::render(const OrderedJson& messages, bool add_generation_prompt, const OrderedJson& tools,
                                 const OrderedJson& extra) const {
  if (!tools.is_null() && !tools.is_array()) throw Error("tools must be a JSON array or null");
  if (!extra.is_null() && !extra.is_object()) throw Error("extra template variables must be a JSON object");
  jinja::Variables vars;
  for (const auto& [name, token] : special_tokens_.items()) vars.emplace_back(name, jinja::Value::from_json(token));
  if (extra.is_object())
    for (const auto& [name, value] : extra.items()) {
      if (name == "messages" || name == "tools" || name == "documents" || name == "add_generation_prompt")
        throw Error("extra template variable '" + name + "' would replace one the chat template is always given");
      set_variable(vars, name, jinja::Value::from_json(value));
    }
  set_variable(vars, "messages", messages_value(messages));
  set_variable(vars, "tools", jinja::Value::from_json(tools));
  set_variable(vars, "documents", jinja::Value::none());
  set_variable(vars, "add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  return template_.render(vars);
}

}  // namespace nextn::serve
