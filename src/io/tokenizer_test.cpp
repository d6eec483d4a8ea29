#include "io/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GPT-2's byte -> printable character map, written independently of the implementation.
std::string byte_char(int b) {
  int cp = b;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

const std::string G = byte_char(' ');  // "Ġ"

// A byte-level BPE tokenizer: ids 0..255 are the single bytes (id == byte value), then
//   256 he, 257 ll, 258 hell, 259 hello, 260 Ġw, 261 or, 262 Ġwor, 263 ld, 264 Ġworld, 265 aa,
//   266 el   (merges in this rank order),
// added tokens 300 <|end|> (special), 301 <tool>, 302 [X] (lstrip+rstrip), 303 ok (single_word),
// 304 <s> (special); TemplateProcessing "<s> $A".
json tiny_tokenizer(bool pair_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},  {"l", "l"},   {"he", "ll"},   {"hell", "o"}, {G, "w"},  {"o", "r"},
      {G + "w", "or"}, {"l", "d"}, {G + "wor", "ld"}, {"a", "a"},    {"e", "l"}};
  json jm = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    if (pair_merges) {
      jm.push_back(json::array({a, b}));
    } else {
      jm.push_back(a + " " + b);
    }
  }
  auto added = [](int i, const std::string& content, bool special, bool lstrip = false,
                  bool rstrip = false, bool single_word = false) {
    return json{{"id", i},         {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"added_tokens",
       json::array({added(300, "<|end|>", true), added(301, "<tool>", false),
                    added(302, "[X]", false, true, true), added(303, "ok", false, false, false, true),
                    added(304, "<s>", true)})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {304}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                   {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", jm}}}};
}

Tokenizer load(const json& j, const json& config = nullptr) {
  return Tokenizer::from_json(j.dump(), config.is_null() ? std::string() : config.dump(), "tiny");
}

std::string make_test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) /
                 ("nextn_tok_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                  std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// Expects `fn` to throw nextn::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no nextn::Error thrown";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

TEST(Tokenizer, HandComputedMerges) {
  for (bool pairs : {false, true}) {
    SCOPED_TRACE(pairs ? "[a, b] merges" : "\"a b\" merges");
    const Tokenizer t = load(tiny_tokenizer(pairs));
    EXPECT_THAT(t.encode("hello world"), ElementsAre(259, 264));
    // Rank order: h+e (rank 0) beats e+l (rank 10); without h, e+l applies.
    EXPECT_THAT(t.encode("hel"), ElementsAre(256, 'l'));
    EXPECT_THAT(t.encode("xel"), ElementsAre('x', 266));
    // Equal pairs merge leftmost first.
    EXPECT_THAT(t.encode("aaa"), ElementsAre(265, 'a'));
    EXPECT_THAT(t.encode("aaaa"), ElementsAre(265, 265));
    // GPT-2 regex: " world" is one pre-token, "world" (no space) merges differently.
    EXPECT_THAT(t.encode("world"), ElementsAre('w', 261, 263));
    EXPECT_THAT(t.encode("hello  world"), ElementsAre(259, ' ', 264));
    EXPECT_THAT(t.encode(""), ElementsAre());
    EXPECT_EQ(t.decode({259, 264}), "hello world");
    EXPECT_EQ(t.decode(t.encode("hello  world\n\tok?")), "hello  world\n\tok?");
  }
}

TEST(Tokenizer, VocabularyAccessors) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(t.vocab_size(), 305u);
  EXPECT_EQ(t.token_to_id("hello"), 259);
  EXPECT_EQ(t.token_to_id(G + "world"), 264);
  EXPECT_EQ(t.token_to_id("<|end|>"), 300);
  EXPECT_EQ(t.token_to_id("nope"), -1);
  EXPECT_EQ(t.id_to_token(264), G + "world");
  EXPECT_EQ(t.id_to_token(300), "<|end|>");
  EXPECT_EQ(t.id_to_token(280), "");  // a hole in the id space
  EXPECT_EQ(t.id_to_token(-1), "");
  EXPECT_EQ(t.id_to_token(100000), "");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_TRUE(t.is_special(304));
  EXPECT_FALSE(t.is_special(301));
  EXPECT_FALSE(t.is_special(259));
  EXPECT_FALSE(t.is_special(-5));
  EXPECT_EQ(t.bos_id(), -1);  // no tokenizer_config
  EXPECT_EQ(t.eos_id(), -1);
  EXPECT_EQ(t.pad_id(), -1);
}

TEST(Tokenizer, AddedTokensSplitText) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_THAT(t.encode("hello<|end|>world"), ElementsAre(259, 300, 'w', 261, 263));
  EXPECT_THAT(t.encode("<|end|><|end|>"), ElementsAre(300, 300));
  EXPECT_THAT(t.encode("<tool>hello</tool>"), ElementsAre(301, 259, '<', '/', 't', 'o', 'o', 'l', '>'));
  // Partial matches stay text.
  EXPECT_THAT(t.encode("<|end|"), ElementsAre('<', '|', 'e', 'n', 'd', '|'));
  // lstrip + rstrip swallow the surrounding whitespace.
  EXPECT_THAT(t.encode("a  [X]\t b"), ElementsAre('a', 302, 'b'));
  // single_word: only where no word character touches the match.
  EXPECT_THAT(t.encode("ok go"), ElementsAre(303, ' ', 'g', 'o'));
  EXPECT_THAT(t.encode("token"), ElementsAre('t', 'o', 'k', 'e', 'n'));
  EXPECT_THAT(t.encode("(ok)"), ElementsAre('(', 303, ')'));
  // Decoding: added tokens verbatim; skip_special drops special ones only.
  EXPECT_EQ(t.decode({259, 300, 264}), "hello<|end|> world");
  EXPECT_EQ(t.decode({259, 300, 264}, true), "hello world");
  EXPECT_EQ(t.decode({301, 259, 304}, true), "<tool>hello");
  // An id that is not a token is an error naming it and the vocabulary size (ids 0..304, 267..299 a gap).
  expect_error([&] { t.decode({259, 99999}); }, {"99999", "vocabulary size 305"});
  expect_error([&] { t.decode({-3}); }, {"-3", "vocabulary size 305"});
  expect_error([&] { t.decode({259, 280}, true); }, {"280", "vocabulary size 305"});
}

TEST(Tokenizer, AddSpecialUsesTemplateOrConfig) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_THAT(t.encode("hello", true), ElementsAre(304, 259));
  EXPECT_THAT(t.encode("hello", false), ElementsAre(259));

  json j = tiny_tokenizer();
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                         {"use_regex", false}};
  const json cfg = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                    {"eos_token", "<|end|>"},
                    {"pad_token", nullptr},
                    {"add_bos_token", true},
                    {"add_eos_token", true}};
  const Tokenizer c = load(j, cfg);
  EXPECT_EQ(c.bos_id(), 304);
  EXPECT_EQ(c.eos_id(), 300);
  EXPECT_EQ(c.pad_id(), -1);
  EXPECT_THAT(c.encode("hello", true), ElementsAre(304, 259, 300));
  EXPECT_THAT(c.encode("hello"), ElementsAre(259));
}

TEST(Tokenizer, FromDirReadsConfig) {
  const std::string dir = make_test_dir();
  write_file(dir + "/tokenizer.json", tiny_tokenizer().dump());
  write_file(dir + "/tokenizer_config.json",
             json{{"bos_token", "<s>"}, {"eos_token", "<|end|>"}, {"pad_token", "<|end|>"}}.dump());
  const Tokenizer t = Tokenizer::from_dir(dir);
  EXPECT_EQ(t.bos_id(), 304);
  EXPECT_EQ(t.eos_id(), 300);
  EXPECT_EQ(t.pad_id(), 300);
  EXPECT_THAT(t.encode("hello world"), ElementsAre(259, 264));
  // Without tokenizer_config.json: no bos/eos/pad.
  fs::remove(dir + "/tokenizer_config.json");
  EXPECT_EQ(Tokenizer::from_dir(dir).eos_id(), -1);
  const Tokenizer f = Tokenizer::from_file(dir + "/tokenizer.json");
  EXPECT_THAT(f.encode("hello world"), ElementsAre(259, 264));
}

TEST(Tokenizer, PrefixSpaceAndNfc) {
  json j = tiny_tokenizer();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}})}};
  const Tokenizer t = load(j);
  EXPECT_THAT(t.encode("hello"), ElementsAre(' ', 259));
  // e + COMBINING ACUTE composes to U+00E9 = C3 A9.
  EXPECT_THAT(t.encode("e\xCC\x81"), ElementsAre(' ', 0xC3, 0xA9));
  // Added tokens are cut out before normalization and prefix insertion.
  EXPECT_THAT(t.encode("<|end|>hello"), ElementsAre(300, ' ', 259));
}

TEST(Tokenizer, NormalizersPrependReplaceLowercase) {
  json j = tiny_tokenizer();
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", json::array({json{{"type", "Lowercase"}},
                                   json{{"type", "Replace"},
                                        {"pattern", {{"String", "_"}}},
                                        {"content", " "}},
                                   json{{"type", "Replace"},
                                        {"pattern", {{"Regex", "\\d+"}}},
                                        {"content", "#"}},
                                   json{{"type", "Prepend"}, {"prepend", "_"}}})}};
  const Tokenizer t = load(j);
  // "HELLO_World42" -> "hello world42" -> "hello world#" -> "_hello world#"
  EXPECT_EQ(t.decode(t.encode("HELLO_World42")), "_hello world#");
}

TEST(Tokenizer, StripNormalizerAndWhitespaceSplit) {
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}};
  EXPECT_THAT(load(j).encode(" \t hello \xE3\x80\x80"), ElementsAre(259));  // U+3000 is White_Space
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}};
  EXPECT_THAT(load(j).encode(" hello  "), ElementsAre(' ', 259));
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({json{{"type", "WhitespaceSplit"}},
                                      json{{"type", "ByteLevel"},
                                           {"add_prefix_space", false},
                                           {"use_regex", false}}})}};
  // Whitespace removed: "world" has no leading space to merge with.
  EXPECT_THAT(load(j).encode("hello \n world"), ElementsAre(259, 'w', 261, 263));
}

// A character-level (non byte-level) BPE over {a, b, -} to observe Split behaviors: merges
// "a -" (rank 0), "- b" (rank 1), "- -" (rank 2) only apply within one piece.
json split_tokenizer(const json& pre_tokenizer) {
  return json{{"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"-", 2}, {"a-", 3}, {"-b", 4}, {"--", 5}}},
                {"merges", json::array({"a -", "- b", "- -"})}}},
              {"pre_tokenizer", pre_tokenizer},
              {"added_tokens", json::array()}};
}

json split(const std::string& behavior, bool invert = false) {
  return json{{"type", "Split"},
              {"pattern", {{"String", "-"}}},
              {"behavior", behavior},
              {"invert", invert}};
}

TEST(Tokenizer, SplitBehaviors) {
  EXPECT_THAT(load(split_tokenizer(nullptr)).encode("a-b"), ElementsAre(3, 1));
  EXPECT_THAT(load(split_tokenizer(split("Isolated"))).encode("a-b"), ElementsAre(0, 2, 1));
  EXPECT_THAT(load(split_tokenizer(split("Removed"))).encode("a-b"), ElementsAre(0, 1));
  EXPECT_THAT(load(split_tokenizer(split("MergedWithPrevious"))).encode("a-b"), ElementsAre(3, 1));
  EXPECT_THAT(load(split_tokenizer(split("MergedWithNext"))).encode("a-b"), ElementsAre(0, 4));
  EXPECT_THAT(load(split_tokenizer(split("Isolated"))).encode("a--b"), ElementsAre(0, 2, 2, 1));
  EXPECT_THAT(load(split_tokenizer(split("Contiguous"))).encode("a--b"), ElementsAre(0, 5, 1));
  // Consecutive matches: MergedWithPrevious joins only the first to the text before it.
  EXPECT_THAT(load(split_tokenizer(split("MergedWithPrevious"))).encode("a--b"),
              ElementsAre(3, 2, 1));
  EXPECT_THAT(load(split_tokenizer(split("MergedWithNext"))).encode("a--b"), ElementsAre(0, 2, 4));
  // invert: the non-matches are the delimiters; Removed keeps the matches only.
  EXPECT_THAT(load(split_tokenizer(split("Removed", true))).encode("a-b--a"), ElementsAre(2, 2, 2));
  json runs = split("Removed", true);
  runs["pattern"] = {{"Regex", "-+"}};
  EXPECT_THAT(load(split_tokenizer(runs)).encode("a-b--a"), ElementsAre(2, 5));
  // A Regex pattern inside a Sequence.
  const json seq = {{"type", "Sequence"},
                    {"pretokenizers",
                     json::array({json{{"type", "Split"},
                                       {"pattern", {{"Regex", "-+"}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}}})}};
  EXPECT_THAT(load(split_tokenizer(seq)).encode("a---b"), ElementsAre(0, 5, 2, 1));
  // Characters missing from the vocabulary (no unk token) are dropped.
  EXPECT_THAT(load(split_tokenizer(nullptr)).encode("axb"), ElementsAre(0, 1));
}

// \s follows Unicode White_Space as Oniguruma (the `tokenizers` regex engine) does: U+0085 is
// whitespace, U+180E MONGOLIAN VOWEL SEPARATOR is not (PCRE2's own \s would match it).
TEST(Tokenizer, RegexWhitespaceIsUnicodeWhiteSpace) {
  const std::string mvs = "\xE1\xA0\x8E", nel = "\xC2\x85";
  auto make = [&](const std::string& regex) {
    return load(json{{"model",
                      {{"type", "BPE"},
                       {"vocab", {{"a", 0}, {"b", 1}, {mvs, 2}, {"a" + mvs, 3}, {nel, 4}, {"a" + nel, 5}}},
                       {"merges", json::array({"a " + mvs, "a " + nel})}}},
                     {"pre_tokenizer",
                      {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Removed"}}}});
  };
  for (const std::string re : {"\\s", "[\\s]", "\\s+"}) {
    SCOPED_TRACE(re);
    EXPECT_THAT(make(re).encode("a" + mvs + "b"), ElementsAre(3, 1));
    EXPECT_THAT(make(re).encode("a" + nel + "b"), ElementsAre(0, 1));
  }
  // \S outside a class: U+180E is a non-space character.
  const Tokenizer keep = load(json{{"model",
                                    {{"type", "BPE"},
                                     {"vocab", {{"a", 0}, {mvs, 1}, {"a" + mvs, 2}}},
                                     {"merges", json::array({"a " + mvs})}}},
                                   {"pre_tokenizer",
                                    {{"type", "Split"},
                                     {"pattern", {{"Regex", "\\S+"}}},
                                     {"behavior", "Isolated"}}}});
  EXPECT_THAT(keep.encode("a" + mvs), ElementsAre(2));
  // Escaped backslashes and literal ']' at a class start are left alone.
  EXPECT_THAT(make("\\\\s|[]s]").encode("a" + mvs + "b"), ElementsAre(3, 1));
}

TEST(Tokenizer, IgnoreMerges) {
  json j = {{"model",
             {{"type", "BPE"},
              {"vocab", {{"h", 0}, {"e", 1}, {"l", 2}, {"o", 3}, {"he", 4}, {"hello", 5}}},
              {"merges", json::array({"h e"})}}}};
  EXPECT_THAT(load(j).encode("hello"), ElementsAre(4, 2, 2, 3));
  j["model"]["ignore_merges"] = true;
  EXPECT_THAT(load(j).encode("hello"), ElementsAre(5));
  EXPECT_THAT(load(j).encode("hell"), ElementsAre(4, 2, 2));
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  const Tokenizer t = load(tiny_tokenizer());
  expect_error([&] { t.encode("ab\xC3"); }, {"not valid UTF-8", "byte offset 2"});
  expect_error([&] { t.encode("\xED\xA0\x80"); }, {"not valid UTF-8"});  // surrogate
}

TEST(Tokenizer, DecodeIsLossyOnInvalidBytes) {
  const Tokenizer t = load(tiny_tokenizer());
  // F0 9F = a truncated 4-byte sequence -> one U+FFFD; FF is never valid.
  EXPECT_EQ(t.decode({0xF0, 0x9F}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({0xF0, 0x9F, 'A'}), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(t.decode({0xFF, 'A'}), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(t.decode({0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
}

TEST(StreamingDecoder, HoldsBackIncompleteCharacters) {
  const Tokenizer t = load(tiny_tokenizer());
  StreamingDecoder d(t);
  // 😀 = F0 9F 98 80, one byte token each: nothing until the 4th.
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.push(0x80), "\xF0\x9F\x98\x80");
  // é = C3 A9 after plain text: the text comes out at once, é when complete.
  EXPECT_EQ(d.push(259), "hello");
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(d.push(264), " world");
  // Special tokens are skipped by default.
  EXPECT_EQ(d.push(300), "");
  // A truncated sequence interrupted by ASCII becomes U+FFFD.
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push('x'), "\xEF\xBF\xBD" "x");
  // flush() turns a dangling prefix into U+FFFD.
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push(0xBD), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamingDecoder, RefusesIdsThatAreNotTokens) {
  const Tokenizer t = load(tiny_tokenizer());
  StreamingDecoder d(t);
  EXPECT_EQ(d.push(259), "hello");
  expect_error([&] { d.push(305); }, {"305", "vocabulary size 305"});
  expect_error([&] { d.push(270); }, {"270"});
  EXPECT_EQ(d.push(264), " world");  // the decoder is still usable
}

TEST(StreamingDecoder, MatchesDecodeOnEveryPrefix) {
  const Tokenizer t = load(tiny_tokenizer());
  const std::string text = "héllo 😀 wörld 👨‍👩‍👧 <|end|>日本 ok\t[X] end";
  const std::vector<int32_t> ids = t.encode(text);
  for (bool skip : {false, true}) {
    StreamingDecoder d(t, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = d.push(id);
      // Every piece is complete UTF-8 on its own.
      EXPECT_EQ(t.decode(t.encode(piece)), piece);
      streamed += piece;
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, t.decode(ids, skip));
  }
  StreamingDecoder keep(t, false);
  std::string all;
  for (int32_t id : ids) all += keep.push(id);
  EXPECT_EQ(all + keep.flush(), "héllo 😀 wörld 👨‍👩‍👧 <|end|>日本 ok[X]end");
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  const Tokenizer t = load(tiny_tokenizer());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "hello world aaaa hel xel " + std::to_string(i) + "\n";
  const std::vector<int32_t> ref = t.encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k) {
    th.emplace_back([&, k] {
      for (int r = 0; r < 20; ++r) got[k] = t.encode(text);
    });
  }
  for (auto& x : th) x.join();
  for (const auto& g : got) EXPECT_EQ(g, ref);
}

// ---------------------------------------------------------------------------------------------
// Malformed input

TEST(TokenizerMalformed, MissingFile) {
  expect_error([] { Tokenizer::from_file("/nonexistent/dir/tokenizer.json"); },
               {"/nonexistent/dir/tokenizer.json", "cannot open"});
  expect_error([] { Tokenizer::from_dir("/nonexistent/dir"); }, {"/nonexistent/dir/tokenizer.json"});
}

TEST(TokenizerMalformed, BadJson) {
  const std::string dir = make_test_dir();
  write_file(dir + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_error([&] { Tokenizer::from_file(dir + "/tokenizer.json"); },
               {dir + "/tokenizer.json", "invalid JSON"});
  write_file(dir + "/tokenizer.json", tiny_tokenizer().dump());
  write_file(dir + "/tokenizer_config.json", "{bos_token: 1}");
  expect_error([&] { Tokenizer::from_dir(dir); }, {dir + "/tokenizer_config.json", "invalid JSON"});
  write_file(dir + "/tokenizer_config.json", json{{"bos_token", "<nope>"}}.dump());
  expect_error([&] { Tokenizer::from_dir(dir); },
               {dir + "/tokenizer_config.json", "bos_token", "<nope>"});
}

TEST(TokenizerMalformed, UnknownModelType) {
  const std::string dir = make_test_dir();
  json j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  write_file(dir + "/tokenizer.json", j.dump());
  expect_error([&] { Tokenizer::from_file(dir + "/tokenizer.json"); },
               {dir + "/tokenizer.json", "model.type", "WordPiece"});
}

TEST(TokenizerMalformed, MergeReferencesUnknownToken) {
  const std::string dir = make_test_dir();
  json j = tiny_tokenizer();
  j["model"]["merges"][1] = "l zzz";
  write_file(dir + "/tokenizer.json", j.dump());
  expect_error([&] { Tokenizer::from_file(dir + "/tokenizer.json"); },
               {dir + "/tokenizer.json", "model.merges[1]", "'zzz'"});
  j = tiny_tokenizer(true);
  j["model"]["merges"][2] = json::array({"qq", "ll"});
  expect_error([&] { load(j); }, {"model.merges[2]", "'qq'"});
  j = tiny_tokenizer();
  j["model"]["merges"][0] = "h e x";
  expect_error([&] { load(j); }, {"model.merges[0]", "two tokens"});
  // The merged token must exist too.
  j = split_tokenizer(nullptr);
  j["model"]["merges"] = json::array({"b a"});
  expect_error([&] { load(j); }, {"model.merges[0]", "merged token 'ba'"});
}

TEST(TokenizerMalformed, UnsupportedComponents) {
  json j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({split("Isolated"), json{{"type", "Metaspace"}}})}};
  expect_error([&] { load(j); }, {"tiny", "pre_tokenizer.pretokenizers[1].type", "Metaspace"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error([&] { load(j); }, {"pre_tokenizer.pattern.Regex", "invalid regex"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = split("Sideways");
  expect_error([&] { load(j); }, {"pre_tokenizer.behavior", "Sideways"});
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_error([&] { load(j); }, {"normalizer.type", "BertNormalizer"});
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error([&] { load(j); }, {"decoder.type", "WordPiece"});
  j = tiny_tokenizer();
  j["model"]["byte_fallback"] = true;
  expect_error([&] { load(j); }, {"model.byte_fallback"});
  j = tiny_tokenizer();
  j["model"]["vocab"]["bad"] = "x";
  expect_error([&] { load(j); }, {"model.vocab[\"bad\"]"});
  j = tiny_tokenizer();
  j["added_tokens"][0].erase("id");
  expect_error([&] { load(j); }, {"added_tokens[0].id"});
  j = tiny_tokenizer();
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<missing>";
  expect_error([&] { load(j); }, {"post_processor.single[0].SpecialToken.id", "<missing>"});
  j = tiny_tokenizer();
  j.erase("model");
  expect_error([&] { load(j); }, {"model", "missing"});
}

// Ids index dense tables: an id far beyond the number of entries is refused before anything is sized by
// it (a 10^9 id would otherwise cost tens of GB), naming the entry at fault.
TEST(TokenizerMalformed, IdFarBeyondTheVocabulary) {
  json j = tiny_tokenizer();
  j["added_tokens"][3]["id"] = 1000000000;
  expect_error([&] { load(j); }, {"tiny", "added_tokens[3].id", "1000000000", "far beyond the vocabulary",
                                  "272 entries"});
  j = tiny_tokenizer();
  j["model"]["vocab"]["aa"] = INT32_MAX - 1;
  expect_error([&] { load(j); }, {"model.vocab[\"aa\"]", std::to_string(INT32_MAX - 1), "far beyond"});
  // Gaps of real vocabularies (ids a little past the entries) still load.
  j = tiny_tokenizer();
  j["added_tokens"][4]["id"] = 1500;
  const Tokenizer t = load(j);
  EXPECT_EQ(t.vocab_size(), 1501u);
  EXPECT_EQ(t.token_to_id("<s>"), 1500);
  EXPECT_EQ(t.decode({1500, 259}), "<s>hello");
}

}  // namespace
}  // namespace nextn
