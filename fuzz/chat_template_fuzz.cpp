// Fuzzes the Jinja subset: the input is a chat template, parsed and rendered with a fixed conversation.
//
// A template we cannot run must be a nextn::Error (at parse time for syntax and unsupported constructs, at
// render time for raise_exception and type errors); any other exception, a crash, a hang or an allocation
// past libFuzzer's limit fails the run (the renderer bounds recursion and output).
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "serve/chat_template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json messages = nlohmann::json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write a stack class."},
    {"role": "assistant", "content": "class Stack:\n    pass", "reasoning_content": "short"},
    {"role": "user", "content": [{"type": "text", "text": "and a queue"}]}
  ])");
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const auto t = nextn::serve::ChatTemplate::from_source(source, "fuzz", "<|bos|>", "<|eos|>");
    t.render(messages, true);
    t.render(messages, false, nlohmann::json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}}));
  } catch (const nextn::Error&) {
  }
  return 0;
}
