// HuggingFace tokenizer.json loader with exact encode/decode for byte-level BPE models
// (Qwen2/Qwen3, DeepSeek-V3, GPT-2 style tokenizers trained with the `tokenizers` library).
//
// Pipeline of encode(), in the order of the `tokenizers` library:
//   1. added tokens whose "normalized" flag is false are cut out of the raw text (leftmost, then
//      longest match; lstrip/rstrip/single_word honoured);
//   2. each remaining section is normalized (NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace,
//      Sequence), then added tokens with normalized=true are cut out of the normalized text;
//   3. pre-tokenization (Sequence of Split / ByteLevel) cuts each section into words;
//   4. each word goes through rank-based BPE (cached);
//   5. with add_special, the post-processor's TemplateProcessing (single) is applied, or, when
//      tokenizer.json has none, tokenizer_config.json's add_bos_token / add_eos_token.
// Regexes are PCRE2 (UTF + UCP, JIT); Unicode normalization is ICU.
//
// See docs/tokenizer.md for the supported subset and known deviations.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nextn {

class Tokenizer {
 public:
  // Loads a tokenizer.json. Throws nextn::Error naming the file and the JSON field at fault on
  // unreadable/invalid JSON or an unsupported/inconsistent configuration.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // DIR/tokenizer.json plus, when present, DIR/tokenizer_config.json (bos_token, eos_token,
  // pad_token, add_bos_token, add_eos_token).
  static Tokenizer from_dir(const std::string& model_dir);
  // The same from in-memory JSON texts (config may be empty); `source` names them in errors.
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {},
                             const std::string& source = "<memory>");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // `text` must be valid UTF-8 (throws nextn::Error otherwise). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // An id that is not a token (negative, past the vocabulary, or a gap in its ids) throws nextn::Error
  // naming the id and the vocabulary size (the `tokenizers` library skips it silently, which hides
  // a wrong id or a mismatched tokenizer). Byte sequences that are not valid UTF-8 come out as U+FFFD
  // (one per maximal invalid subpart, like from_utf8_lossy).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Added tokens first, then the model vocabulary; -1 if none.
  int32_t token_to_id(std::string_view token) const;
  // The vocabulary string (byte-level form, e.g. "Ġthe"), or "" for an unknown id.
  std::string id_to_token(int32_t id) const;
  // Size of the id space: 1 + the largest id of the vocabulary and the added tokens. Loading refuses
  // ids of 2x the number of entries (+ a small margin) or more, so the id tables stay proportional
  // to the file.
  size_t vocab_size() const;
  // From tokenizer_config.json; -1 if none.
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  // An added token flagged "special".
  bool is_special(int32_t id) const;

  // The bytes `id` decodes to (empty for an unknown id). Not necessarily valid UTF-8 alone.
  std::string_view token_bytes(int32_t id) const;

 private:
  friend class StreamingDecoder;  // checks ids as decode() does
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for generation: push() returns the text completed by each new token.
// Never splits a UTF-8 character: an incomplete trailing byte sequence is held back until it is
// completed (or turns out invalid, then it becomes U+FFFD). The concatenation of all push()
// results and flush() equals decode(all ids, skip_special).
// `bytes` as UTF-8 text: each maximal invalid subpart becomes U+FFFD, as decode() does (a token's bytes can
// be part of a character).
std::string utf8_lossy(std::string_view bytes);

class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  // Throws nextn::Error for an id that is not a token, as decode() does.
  std::string push(int32_t id);
  // Emits whatever is held back (an incomplete sequence becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace nextn
