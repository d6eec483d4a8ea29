// TEMPORARY STUB (the server's author, so the server builds before the real Jinja renderer lands; the
// chat-template helper replaces this file and chat_template.cpp with the real ones, keeping this API).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace nextn::serve {
class ChatTemplate {
 public:
  static std::optional<ChatTemplate> from_checkpoint(const std::string& dir);
  static ChatTemplate from_source(const std::string& source, const std::string& origin, const std::string& bos_token,
                                  const std::string& eos_token);
  std::string render(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& tools = nullptr,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  std::string bos_, eos_;
};
}  // namespace nextn::serve
