// TextStream (streaming text, stop strings) and logprobs_json with the bundled model's tokenizer.
#include "engine/text_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

namespace nextn {
namespace {

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_dir(std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny");
  return t;
}

// The token whose bytes are exactly `b` (a byte-level BPE vocabulary has one for each of the 256 bytes).
int32_t byte_token(unsigned char b) {
  static const std::array<int32_t, 256> ids = [] {
    std::array<int32_t, 256> m;
    m.fill(-1);
    for (size_t id = 0; id < tok().vocab_size(); ++id) {
      const std::string_view bytes = tok().token_bytes(static_cast<int32_t>(id));
      if (bytes.size() == 1 && m[static_cast<unsigned char>(bytes[0])] < 0 &&
          !tok().is_special(static_cast<int32_t>(id)))
        m[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
    }
    return m;
  }();
  if (ids[b] < 0) throw std::runtime_error("the bundled tokenizer has no token for byte " + std::to_string(b));
  return ids[b];
}

// One token per byte of `s`: stop strings and characters then span as many tokens as they have bytes.
std::vector<int32_t> byte_tokens(const std::string& s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(byte_token(static_cast<unsigned char>(c)));
  return ids;
}

// Pushes `ids` until a stop string is hit; returns each push's text.
std::vector<std::string> push_all(TextStream& ts, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) {
    auto d = ts.push(id);
    out.push_back(d.text);
    if (d.stopped) break;
  }
  return out;
}

std::string concat(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

// Every piece is whole UTF-8 characters: it starts with no continuation byte and ends with a complete
// sequence (checked by the tokenizer's encode(), which refuses invalid UTF-8, round-tripping it).
void expect_whole_characters(const std::string& piece) {
  if (piece.empty()) return;
  EXPECT_NE(static_cast<unsigned char>(piece[0]) & 0xC0, 0x80) << piece;
  EXPECT_EQ(tok().decode(tok().encode(piece)), piece);
}

TEST(TextStream, BundledTokenizerHasByteTokens) {
  // The tests below build text byte by byte; make sure those tokens are what they claim.
  for (int b : {int('a'), int(' '), int('\n'), 0xC3, 0xA9, 0xF0, 0x80}) {
    const int32_t id = byte_token(static_cast<unsigned char>(b));
    EXPECT_EQ(tok().token_bytes(id), std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(tok().decode(byte_tokens("héllo 😀")), "héllo 😀");
}

TEST(TextStream, StopStringSpanningSeveralTokens) {
  TextStream ts(&tok(), {"STOP"});
  const auto pieces = push_all(ts, byte_tokens("abc STOP def"));
  // 'a' 'b' 'c' ' ' 'S' 'T' 'O' 'P': stopped at the P, nothing of "STOP" ever shown.
  ASSERT_EQ(pieces.size(), 8u);
  EXPECT_EQ(concat(pieces), "abc ");
  for (size_t i = 4; i < pieces.size(); ++i) EXPECT_EQ(pieces[i], "") << i;
  EXPECT_TRUE(ts.stopped_on_text());
  EXPECT_EQ(ts.stop_index(), 0);
  EXPECT_EQ(ts.text(), "abc ");
  // Later tokens are ignored, and nothing is left for finish().
  const auto after = ts.push(byte_token('x'));
  EXPECT_EQ(after.text, "");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(ts.finish(), "");
  EXPECT_EQ(ts.text(), "abc ");
}

// min_tokens (vLLM's): a stop string that ends before the min_tokens-th token does not stop the text; one that
// ends at or after it does, even when it began before.
TEST(TextStream, StopStringsApplyFromTheMinTokensThToken) {
  TextStream ts(&tok(), {"ab"}, /*min_tokens=*/4);
  const auto pieces = push_all(ts, byte_tokens("abxab"));  // "ab" ends at token 2 (ignored), then at token 5
  ASSERT_EQ(pieces.size(), 5u);
  EXPECT_EQ(concat(pieces), "abx");
  EXPECT_TRUE(ts.stopped_on_text());
  TextStream spanning(&tok(), {"STOP"}, /*min_tokens=*/3);
  EXPECT_EQ(concat(push_all(spanning, byte_tokens("xSTOPy"))), "x");  // began at token 2, ends at token 5
  TextStream early(&tok(), {"ab"}, /*min_tokens=*/3);
  const std::string pushed = concat(push_all(early, byte_tokens("abxyz")));
  EXPECT_EQ(pushed + early.finish(), "abxyz");
  EXPECT_FALSE(early.stopped_on_text());
}

TEST(TextStream, StopStringAcrossRealBpeTokens) {
  const std::string text = "def fibonacci(n):\n    return fibonacci(n - 1) + fibonacci(n - 2)\n";
  const std::string stop = "return fib";
  const std::vector<int32_t> ids = tok().encode(text);
  // Precondition: the stop string is not inside any one token, so the match has to span tokens.
  for (int32_t id : ids) ASSERT_EQ(std::string(tok().token_bytes(id)).find(stop), std::string::npos);
  TextStream ts(&tok(), {stop});
  const auto pieces = push_all(ts, ids);
  EXPECT_LT(pieces.size(), ids.size());  // stopped before the end
  EXPECT_EQ(concat(pieces), "def fibonacci(n):\n    ");
  EXPECT_TRUE(ts.stopped_on_text());
  EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, StopStringAtTheVeryStart) {
  const std::vector<int32_t> ids = tok().encode("Hello world");
  TextStream ts(&tok(), {"Hello"});
  const auto pieces = push_all(ts, ids);
  EXPECT_EQ(concat(pieces), "");
  EXPECT_TRUE(ts.stopped_on_text());
  EXPECT_EQ(ts.text(), "");
  EXPECT_EQ(ts.finish(), "");

  // The very first byte is a whole stop string.
  TextStream one(&tok(), {"H"});
  const auto d = one.push(byte_token('H'));
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(one.text(), "");
}

TEST(TextStream, HoldBackReleasesTextOnceItCannotBeAStopString) {
  TextStream ts(&tok(), {"Hello world"});
  // "Hel" could still become the stop string: held.
  EXPECT_EQ(ts.push(byte_token('H')).text, "");
  EXPECT_EQ(ts.push(byte_token('e')).text, "");
  EXPECT_EQ(ts.push(byte_token('l')).text, "");
  // "Help" cannot (and no tail of it starts the stop string): all of it comes out at once.
  const auto d = ts.push(byte_token('p'));
  EXPECT_EQ(d.text, "Help");
  EXPECT_FALSE(d.stopped);
  // Only the tail that could start the stop string is held: "HeH" shows "He" and keeps the "H".
  EXPECT_EQ(ts.push(byte_token(' ')).text, " ");
  EXPECT_EQ(ts.push(byte_token('H')).text, "");
  EXPECT_EQ(ts.push(byte_token('e')).text, "");
  EXPECT_EQ(ts.push(byte_token('H')).text, "He");
  EXPECT_EQ(ts.emitted_size(), std::string("Help He").size());
  EXPECT_EQ(ts.text(), "Help HeH");  // the held tail is part of the text so far
  EXPECT_EQ(ts.push(byte_token('e')).text, "");
  EXPECT_EQ(ts.push(byte_token('y')).text, "Hey");
  EXPECT_FALSE(ts.stopped_on_text());
  // Generation ends with a prefix of the stop string pending: finish() releases it.
  for (char c : std::string("Hello wor")) EXPECT_EQ(ts.push(byte_token(static_cast<unsigned char>(c))).text, "");
  EXPECT_EQ(ts.finish(), "Hello wor");
  EXPECT_EQ(ts.text(), "Help HeHeyHello wor");
  EXPECT_FALSE(ts.stopped_on_text());
}

TEST(TextStream, MultiByteCharactersSplitAcrossTokensAreNeverHalfShown) {
  TextStream ts(&tok(), {});
  // é = C3 A9, 😀 = F0 9F 98 80, 日 = E6 97 A5, one token per byte.
  const std::string text = "aé😀日b";
  const std::vector<int32_t> ids = byte_tokens(text);
  ASSERT_EQ(ids.size(), text.size());
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(ts.push(id).text);
  const std::vector<std::string> expected = {"a", "", "é", "", "", "", "😀", "", "", "日", "b"};
  EXPECT_EQ(pieces, expected);
  EXPECT_EQ(ts.finish(), "");
  EXPECT_EQ(ts.text(), text);

  // With stop strings whose prefixes are held back, the cut still falls between characters.
  TextStream st(&tok(), {"日本語", "é!"});
  std::string shown;
  for (int32_t id : byte_tokens("xé日本é日本語")) {
    const auto d = st.push(id);
    expect_whole_characters(d.text);
    shown += d.text;
    if (d.stopped) break;
  }
  EXPECT_TRUE(st.stopped_on_text());
  EXPECT_EQ(st.stop_index(), 0);
  EXPECT_EQ(shown, "xé日本é");
}

TEST(TextStream, SeveralStopStringsEarliestMatchWins) {
  // Both are completed by the same token ('d'); "abcd" starts earlier although it is listed second.
  TextStream ts(&tok(), {"cd", "abcd"});
  const auto pieces = push_all(ts, byte_tokens("xabcdef"));
  EXPECT_EQ(concat(pieces), "x");
  EXPECT_EQ(ts.stop_index(), 1);
  EXPECT_EQ(ts.text(), "x");

  // The first one completed ends generation, even when a longer one listed first would match later.
  TextStream first(&tok(), {"world peace", "lo w"});
  const auto p2 = push_all(first, byte_tokens("hello world peace"));
  EXPECT_EQ(concat(p2), "hel");
  EXPECT_EQ(first.stop_index(), 1);

  // One token of several characters completing two stop strings at once: the earlier start wins.
  int32_t word = -1;  // the first token of 4+ lowercase letters (no 'z')
  for (size_t id = 0; id < tok().vocab_size() && word < 0; ++id) {
    const std::string_view b = tok().token_bytes(static_cast<int32_t>(id));
    if (b.size() >= 4 && std::all_of(b.begin(), b.end(), [](char c) { return c >= 'a' && c < 'z'; }))
      word = static_cast<int32_t>(id);
  }
  ASSERT_GE(word, 0) << "no token of 4+ letters in the bundled vocabulary";
  const std::string w(tok().token_bytes(word));
  TextStream multi(&tok(), {w.substr(w.size() - 2), "z" + w.substr(0, 1)});
  EXPECT_EQ(concat(push_all(multi, byte_tokens("zz"))), "z");  // the second 'z' could start "z" + w[0]
  const auto d = multi.push(word);
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(multi.text(), "z");
  EXPECT_EQ(multi.stop_index(), 1);
}

TEST(TextStream, WithoutTokenizerThereIsNoText) {
  TextStream ts(nullptr, {});
  EXPECT_FALSE(ts.has_tokenizer());
  for (int32_t id : {1, 2, 3, 100000}) {
    const auto d = ts.push(id);
    EXPECT_EQ(d.text, "");
    EXPECT_FALSE(d.stopped);
  }
  EXPECT_EQ(ts.finish(), "");
  EXPECT_EQ(ts.text(), "");
  EXPECT_FALSE(ts.stopped_on_text());
  // Stop strings need text to match.
  EXPECT_THROW(TextStream(nullptr, {"x"}), Error);
  EXPECT_TRUE(TextStream(&tok(), {}).has_tokenizer());
}

TEST(TextStream, FinishFlushesTheRest) {
  // An incomplete character at the end becomes U+FFFD.
  TextStream ts(&tok(), {});
  EXPECT_EQ(ts.push(byte_token('o')).text, "o");
  EXPECT_EQ(ts.push(byte_token('k')).text, "k");
  EXPECT_EQ(ts.push(byte_token(0xF0)).text, "");
  EXPECT_EQ(ts.push(byte_token(0x9F)).text, "");
  EXPECT_EQ(ts.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(ts.text(), "ok\xEF\xBF\xBD");
  EXPECT_TRUE(ts.finished());
  EXPECT_EQ(ts.finish(), "");  // once
  EXPECT_THROW(ts.push(byte_token('x')), Error);

  // Text held back for a stop string comes out at the end, together with the decoder's pending bytes.
  TextStream held(&tok(), {"END"});
  EXPECT_EQ(held.push(byte_token('a')).text, "a");
  EXPECT_EQ(held.push(byte_token('E')).text, "");
  EXPECT_EQ(held.push(byte_token('N')).text, "");
  EXPECT_EQ(held.push(byte_token(0xC3)).text, "");
  EXPECT_EQ(held.finish(), "EN\xEF\xBF\xBD");
  EXPECT_EQ(held.text(), "aEN\xEF\xBF\xBD");
  EXPECT_FALSE(held.stopped_on_text());

  // Stop strings apply to the flushed text too.
  TextStream cut(&tok(), {"x\xEF\xBF\xBD"});
  EXPECT_EQ(cut.push(byte_token('a')).text, "a");
  EXPECT_EQ(cut.push(byte_token('x')).text, "");
  EXPECT_EQ(cut.push(byte_token(0xE6)).text, "");
  EXPECT_EQ(cut.finish(), "");
  EXPECT_TRUE(cut.stopped_on_text());
  EXPECT_EQ(cut.text(), "a");
}

TEST(TextStream, StreamedTextIsTheDecodedTextWhenNoStopMatches) {
  const std::string text = "héllo 😀 wörld <|eos|> 日本 ok\n\tend of the story, the end";
  const std::vector<int32_t> ids = tok().encode(text);
  // Stop strings whose prefixes occur all the time ("the", " e"), so text is held and released often.
  TextStream ts(&tok(), {"the ending", " ex", "日本語"});
  std::string streamed;
  for (int32_t id : ids) {
    const auto d = ts.push(id);
    EXPECT_FALSE(d.stopped);
    expect_whole_characters(d.text);
    streamed += d.text;
    EXPECT_EQ(streamed.size(), ts.emitted_size());
    EXPECT_EQ(ts.text().substr(0, streamed.size()), streamed);
  }
  EXPECT_NE(streamed, ts.text());  // "the end" was held as a possible "the ending"
  streamed += ts.finish();
  EXPECT_EQ(streamed, tok().decode(ids, /*skip_special=*/true));
  EXPECT_EQ(streamed, ts.text());
  EXPECT_EQ(streamed.find("<|eos|>"), std::string::npos);  // special tokens skipped
}

TEST(TextStream, RefusesBadStopStrings) {
  EXPECT_THROW(TextStream(&tok(), {"ok", ""}), Error);
  EXPECT_THROW(TextStream(&tok(), {"\xA9"}), Error);          // a lone continuation byte
  EXPECT_THROW(TextStream(&tok(), {"caf\xC3"}), Error);       // a truncated character
  EXPECT_THROW(TextStream(&tok(), {"\xC0\xAF"}), Error);      // overlong
  EXPECT_THROW(TextStream(&tok(), {"\xED\xA0\x80"}), Error);  // a surrogate
  try {
    TextStream(&tok(), {"fine", "\xFF"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stop string #2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(TextStream(&tok(), {"é", "😀", "日本語", "\n"}));
  // A token that is not in the vocabulary is an error, as for decode().
  TextStream ts(&tok(), {});
  EXPECT_THROW(ts.push(static_cast<int32_t>(tok().vocab_size()) + 5), Error);
}

TEST(LogprobsJson, MatchesTheCliFormat) {
  EXPECT_EQ(logprobs_json({}).dump(), "[]");
  std::vector<TokenLogprob> lps;
  lps.push_back({5, -0.5f, {{5, -0.5f}, {7, -1.25f}}});
  lps.push_back({9, -2.0f, {}});
  EXPECT_EQ(logprobs_json(lps).dump(),
            R"([{"logprob":-0.5,"token":5,"top":[{"logprob":-0.5,"token":5},{"logprob":-1.25,"token":7}]},)"
            R"({"logprob":-2.0,"token":9,"top":[]}])");
  // Floats go in as floats (the CLI always printed them so), and -inf as JSON null.
  lps = {{1, -0.1f, {{1, -std::numeric_limits<float>::infinity()}}}};
  const nlohmann::json j = logprobs_json(lps);
  EXPECT_EQ(j[0]["logprob"].get<double>(), static_cast<double>(-0.1f));
  EXPECT_EQ(j.dump(), R"([{"logprob":-0.10000000149011612,"token":1,"top":[{"logprob":null,"token":1}]}])");
}

}  // namespace
}  // namespace nextn
