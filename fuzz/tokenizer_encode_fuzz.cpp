// Fuzzes encode / decode / StreamingDecoder of the committed tokenizers (bundled model, Qwen3, DeepSeek-V3).
//
// Input: byte 0 picks the tokenizer, byte 1 holds flags (bit 0: add_special, bit 1: skip_special on decode,
// bit 2: the rest is token ids, 3 bytes each, instead of text); the rest is the text or the ids.
//
// Invariants, beyond "only nextn::Error escapes":
//  * text that is not UTF-8 is an Error; UTF-8 text encodes to known ids that each have bytes;
//  * decode(encode(x)) == x (these are byte-level BPE tokenizers; for the NFC ones x must already be NFC);
//  * encode(x, add_special) holds encode(x) as one run (the template adds tokens around it);
//  * decode always returns valid UTF-8, and the StreamingDecoder's pieces add up to decode's text.
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <memory>

#include "committed_tokenizers.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

namespace {

using nextn::Tokenizer;
using nextn::fuzz::is_valid_utf8;

enum class Normalizer { kIdentity, kNfc, kOther };

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  Normalizer normalizer = Normalizer::kOther;
};

Normalizer normalizer_of(const nlohmann::json& tokenizer_json) {
  const auto n = tokenizer_json.find("normalizer");
  if (n == tokenizer_json.end() || n->is_null()) return Normalizer::kIdentity;
  const std::string type = n->value("type", "");
  if (type == "NFC") return Normalizer::kNfc;
  if (type == "Sequence" && n->value("normalizers", nlohmann::json::array()).empty()) return Normalizer::kIdentity;
  return Normalizer::kOther;
}

// Loaded on first use: the Qwen3 and DeepSeek vocabularies take a while under the sanitizers.
const Loaded& tokenizer(size_t which) {
  static std::vector<nextn::fuzz::CommittedTokenizer> files = nextn::fuzz::committed_tokenizers();
  static std::vector<Loaded> loaded(files.size());
  Loaded& l = loaded[which % files.size()];
  if (!l.tokenizer) {
    const auto& f = files[which % files.size()];
    const std::string json_text = nextn::testing::read_fixture_file(f.json_path);
    l.tokenizer = std::make_unique<Tokenizer>(
        Tokenizer::from_json(json_text, nextn::testing::read_fixture_file(f.config_path), f.json_path));
    l.normalizer = normalizer_of(nlohmann::json::parse(json_text));
  }
  return l;
}

bool is_nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  const bool normalized = nfc->isNormalized(u, status);
  return U_SUCCESS(status) && normalized;
}

bool contains_run(const std::vector<int32_t>& haystack, const std::vector<int32_t>& run) {
  return run.empty() || std::search(haystack.begin(), haystack.end(), run.begin(), run.end()) != haystack.end();
}

bool is_known(const Tokenizer& tok, int32_t id) { return !tok.token_bytes(id).empty(); }

// decode's text is valid UTF-8 and what the streaming decoder produces piece by piece. decode may refuse
// ids the tokenizer does not know (with an Error), never ones it knows.
void check_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  std::string text;
  try {
    text = tok.decode(ids, skip_special);
  } catch (const nextn::Error&) {
    NEXTN_FUZZ_CHECK(!std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return is_known(tok, id); }));
    return;
  }
  NEXTN_FUZZ_CHECK(is_valid_utf8(text));
  nextn::StreamingDecoder stream(tok, skip_special);
  std::string pieces;
  for (int32_t id : ids) pieces += stream.push(id);
  pieces += stream.flush();
  NEXTN_FUZZ_CHECK(pieces == text);
}

void check_text(const Loaded& l, std::string_view text, bool add_special, bool skip_special) {
  const Tokenizer& tok = *l.tokenizer;
  if (!is_valid_utf8(text)) {
    bool threw = false;
    try {
      tok.encode(text, add_special);
    } catch (const nextn::Error&) {
      threw = true;
    }
    NEXTN_FUZZ_CHECK(threw);
    return;
  }
  const std::vector<int32_t> ids = tok.encode(text, false);
  for (int32_t id : ids) NEXTN_FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < tok.vocab_size() && is_known(tok, id));
  if (l.normalizer == Normalizer::kIdentity || (l.normalizer == Normalizer::kNfc && is_nfc(text)))
    NEXTN_FUZZ_CHECK(tok.decode(ids, false) == text);
  if (add_special) NEXTN_FUZZ_CHECK(contains_run(tok.encode(text, true), ids));
  check_decode(tok, ids, skip_special);
}

// Any ids, known or not: 3 bytes each, spread a little past the id space.
void check_ids(const Loaded& l, std::string_view bytes, bool skip_special) {
  const Tokenizer& tok = *l.tokenizer;
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) | static_cast<uint8_t>(bytes[i + 1]) << 8 |
                       static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 2])) << 16;
    ids.push_back(static_cast<int32_t>(v % (tok.vocab_size() + 16)));
  }
  check_decode(tok, ids, skip_special);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const Loaded& l = tokenizer(data[0]);
  const bool add_special = data[1] & 1, skip_special = data[1] & 2, ids_mode = data[1] & 4;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (ids_mode)
    check_ids(l, rest, skip_special);
  else
    check_text(l, rest, add_special, skip_special);
  return 0;
}
