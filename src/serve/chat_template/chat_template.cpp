// TEMPORARY STUB (see chat_template.h).
#include "serve/chat_template/chat_template.h"

#include "core/error.h"

namespace nextn::serve {
std::optional<ChatTemplate> ChatTemplate::from_checkpoint(const std::string&) { return std::nullopt; }
ChatTemplate ChatTemplate::from_source(const std::string&, const std::string& origin, const std::string&,
                                       const std::string&) {
  throw Error(origin + ": chat templates are not implemented yet");
}
std::string ChatTemplate::render(const nlohmann::json&, bool, const nlohmann::json&, const nlohmann::json&) const {
  throw Error("chat templates are not implemented yet");
}
}  // namespace nextn::serve
