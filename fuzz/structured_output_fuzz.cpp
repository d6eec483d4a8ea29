// Fuzzes structured output: the input is a JSON Schema, then (after kPartSeparator) an output text.
//
// A schema either compiles or is refused with nextn::Error (never another exception, a crash or a hang); a
// compiled one gives a matcher whose every accepted prefix can still be completed (some byte continues it,
// or it may end there), and whose vocabulary mask over a small byte vocabulary is exactly the tokens a
// token-by-token check accepts.
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_filter.h"
#include "fuzz_util.h"

namespace {

using nextn::structured::Grammar;
using nextn::structured::Matcher;

// Every single byte, and some JSON pieces: id 0 is the end token (no bytes).
std::shared_ptr<const nextn::structured::TokenVocab> vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes{""};
    for (int b = 1; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", " \"", "12", "\\u00", "\xC3\xA9", "\xE2\x82",
                          "}]",
                          // inside strings: quotes after characters, escapes, partial UTF-8 before a quote
                          "ab\"", "a\":1}", "\\\"", "\\\\\"", "\\u00e9\"", "\xA9\"}", "\x82\xAC", "\xC3\xA9\xC3",
                          "\\n\",\"", "\xF0\x9F\x98\x80"})
      bytes.push_back(t);
    return std::make_shared<const nextn::structured::TokenVocab>(std::move(bytes));
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = nextn::fuzz::split_parts(data, size, 2);
  const auto schema = nlohmann::ordered_json::parse(parts[0], nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  std::shared_ptr<const Matcher> m;
  try {
    m = std::make_shared<const Matcher>(Grammar::from_schema(schema));
  } catch (const nextn::Error& e) {
    NEXTN_FUZZ_CHECK(std::string(e.what()).size() > 0);
    return 0;
  }
  const std::string_view text = parts.size() > 1 ? parts[1].substr(0, 256) : std::string_view();
  Matcher::State s = m->start(), next;
  for (char c : text) {
    if (!m->step(s, uint8_t(c), next)) break;
    std::swap(s, next);
  }
  // No corner: the prefix taken continues or ends.
  bool continues = m->can_end(s);
  for (int b = 0; b < 256 && !continues; ++b) continues = m->step(s, uint8_t(b), next);
  NEXTN_FUZZ_CHECK(continues);
  // The trie walk's mask is the token-by-token one.
  nextn::structured::TokenFilter filter(m, vocab(), {0});
  nextn::structured::TokenMask allowed;
  filter.allowed(s, allowed);
  Matcher::State scratch;
  for (int32_t id = 0; id < vocab()->size(); ++id) {
    Matcher::State t = s;
    const bool ok = id == 0 ? m->can_end(s) : m->feed(t, vocab()->bytes(id), scratch);
    NEXTN_FUZZ_CHECK(allowed.test(id) == ok);
  }
  return 0;
}
