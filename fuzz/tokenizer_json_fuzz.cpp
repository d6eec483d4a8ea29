// Fuzzes building a tokenizer from tokenizer.json + tokenizer_config.json (Tokenizer::from_json), then
// tokenizing with it.
//
// Input: TOKENIZER_JSON [SEP TOKENIZER_CONFIG_JSON [SEP TEXT]] (SEP = kPartSeparator).
//
// Bad input must be a nextn::Error (any other exception escapes and fails the run; so does an allocation
// beyond libFuzzer's -malloc_limit_mb, e.g. id tables sized by one absurd id). A tokenizer that loads must
// give ids inside its id space, special ids that are -1 or inside it, and decode to valid UTF-8, the same
// whole or streamed.
#include <algorithm>
#include <climits>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

namespace {

using nextn::Tokenizer;

bool in_id_space(const Tokenizer& tok, int32_t id) { return id >= 0 && static_cast<size_t>(id) < tok.vocab_size(); }

void check_decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string text;
  try {
    text = tok.decode(ids, false);
  } catch (const nextn::Error&) {
    // decode may refuse an id it has no token for, never one it has.
    NEXTN_FUZZ_CHECK(!std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return !tok.token_bytes(id).empty(); }));
    return;
  }
  NEXTN_FUZZ_CHECK(nextn::fuzz::is_valid_utf8(text));
  nextn::StreamingDecoder stream(tok, false);
  std::string pieces;
  for (int32_t id : ids) pieces += stream.push(id);
  NEXTN_FUZZ_CHECK(pieces + stream.flush() == text);
}

void check_tokenizer(const Tokenizer& tok, std::string_view text) {
  for (int32_t special : {tok.bos_id(), tok.eos_id(), tok.pad_id()})
    NEXTN_FUZZ_CHECK(special == -1 || in_id_space(tok, special));
  if (nextn::fuzz::is_valid_utf8(text)) {
    for (bool add_special : {false, true}) {
      std::vector<int32_t> ids;
      try {
        ids = tok.encode(text, add_special);
      } catch (const nextn::Error&) {
        continue;  // e.g. a byte no token covers: refusing is allowed, garbage is not
      }
      for (int32_t id : ids) NEXTN_FUZZ_CHECK(in_id_space(tok, id));
      check_decode(tok, ids);
    }
  }
  // The edges of the id space and beyond: ids outside it have no bytes and no token.
  NEXTN_FUZZ_CHECK(tok.token_bytes(-1).empty() && tok.id_to_token(-1).empty());
  if (tok.vocab_size() == 0 || tok.vocab_size() >= INT32_MAX) return;
  const auto end = static_cast<int32_t>(tok.vocab_size());
  NEXTN_FUZZ_CHECK(tok.token_bytes(end).empty() && tok.id_to_token(end).empty());
  check_decode(tok, {0, end - 1});
  check_decode(tok, {-1, end, INT32_MAX});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = nextn::fuzz::split_parts(data, size, 3);
  const std::string_view config = parts.size() > 1 ? parts[1] : std::string_view{};
  const std::string_view text = parts.size() > 2 ? parts[2] : std::string_view{"def main():\n    return 0\n"};
  try {
    const Tokenizer tok = Tokenizer::from_json(parts[0], config, "fuzz/tokenizer.json");
    check_tokenizer(tok, text);
  } catch (const nextn::Error&) {
  }
  return 0;
}
