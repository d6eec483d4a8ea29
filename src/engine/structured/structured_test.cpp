// Structured output's pieces: schema compilation (refusals by name), the byte matcher against nlohmann's JSON
// parser (everything it accepts parses; everything dump() writes within its limits is accepted) and the token
// filter's trie walk against a token-by-token check.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_filter.h"

namespace nextn::structured {
namespace {

using ojson = nlohmann::ordered_json;

Matcher schema(const char* text) { return Matcher(Grammar::from_schema(ojson::parse(text))); }

// The whole text is a complete output.
bool accepts(const Matcher& m, std::string_view text) {
  Matcher::State s = m.start(), scratch;
  return m.feed(s, text, scratch) && m.can_end(s);
}
// The text can be continued into an output (or is one).
bool prefix_ok(const Matcher& m, std::string_view text) {
  Matcher::State s = m.start(), scratch;
  return m.feed(s, text, scratch);
}

std::string schema_error(const char* text) {
  try {
    Grammar::from_schema(ojson::parse(text), "response_format.json_schema.schema");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StructuredGrammar, RefusesWhatItWouldNotEnforceNamingTheKeywordAndWhere) {
  EXPECT_EQ(schema_error(R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})"),
            "response_format.json_schema.schema at /properties/age/minimum: the keyword 'minimum' is not supported "
            "(it would not be enforced)");
  EXPECT_NE(schema_error(R"({"type":"string","pattern":"^a"})").find("'pattern'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"string","format":"date-time"})").find("'format'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"objekt"})").find("unknown type 'objekt'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})").find("'b' is required"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"https://example.com/s.json"})").find("only references within"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"#/$defs/missing"})").find("does not name a schema"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"string","minLength":-1})").find("/minLength: must be a non-negative"),
            std::string::npos);
  EXPECT_NE(schema_error(R"(false)").find("allows no value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"integer","maxItems":3})").find("does not apply to type 'integer'"),
            std::string::npos);
  // A chain of required objects deeper than the matcher's nesting limit could never be generated.
  EXPECT_NE(schema_error(R"({"$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},"required":["n"]}},
                             "$ref":"#/$defs/n"})")
                .find("nests deeper"),
            std::string::npos);
  // Annotations are fine.
  EXPECT_EQ(schema_error(R"({"title":"T","description":"d","type":"string","default":"x","examples":["y"]})"), "");
  // A schema past the grammar's node limit is refused by name, before its nodes are all built.
  std::string wide = R"({"anyOf":[)";
  for (int i = 0; i < 40000; ++i) wide += std::string(i ? "," : "") + R"({"type":"null"})";
  wide += "]}";
  EXPECT_EQ(schema_error(wide.c_str()),
            "response_format.json_schema.schema: the schema is too large (more than 32768 value nodes)");
}

// The documents of one grammar (GrammarBuilder, as tool_choice "required" joins the tools' parameters) each
// resolve "#/..." within themselves: the same pointer names a different schema in each, recursion included.
TEST(StructuredGrammar, EachDocumentOfABuilderResolvesItsOwnReferences) {
  GrammarBuilder b;
  const int tree = b.schema(ojson::parse(R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v"]}},"$ref":"#/$defs/t"})"), "a");
  const int list = b.schema(ojson::parse(R"({"type":"object","properties":{"xs":{"type":"array",
      "items":{"$ref":"#/$defs/t"}}},"required":["xs"],"$defs":{"t":{"type":"string","maxLength":3}}})"), "b");
  const int root = b.any_of({b.object({{"name", b.literal("tree")}, {"arguments", tree}}),
                             b.object({{"name", b.literal("list")}, {"arguments", list}})});
  const Matcher m(std::move(b).finish(root, "tools"));
  EXPECT_TRUE(accepts(m, R"({"name":"tree","arguments":{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}})"));
  EXPECT_TRUE(accepts(m, R"({"name":"list","arguments":{"xs":["ab","c"]}})"));
  EXPECT_FALSE(accepts(m, R"({"name":"list","arguments":{"xs":[{"v":1}]}})"));
  EXPECT_FALSE(accepts(m, R"({"name":"tree","arguments":{"v":1,"kids":["ab"]}})"));
  EXPECT_FALSE(accepts(m, R"({"name":"list","arguments":{"xs":["abcd"]}})"));
  EXPECT_FALSE(accepts(m, R"({"arguments":{"xs":[]},"name":"list"})"));
  // A pointer into another document is an error naming the document that holds the reference.
  GrammarBuilder c;
  c.schema(ojson::parse(R"({"$defs":{"t":{"type":"string"}},"type":"string"})"), "a");
  try {
    c.schema(ojson::parse(R"({"$ref":"#/$defs/t"})"), "b");
    ADD_FAILURE() << "resolved a pointer into another document";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "b at /$ref: '#/$defs/t' does not name a schema in the document");
  }
  // The joined grammar's root is checked as from_schema checks a document's: a value must fit the nesting limit.
  GrammarBuilder d;
  const int endless = d.schema(ojson::parse(R"({"$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},
      "required":["n"]}},"$ref":"#/$defs/n"})"), "a");
  const int calls = d.any_of({d.object({{"arguments", endless}})});
  try {
    std::move(d).finish(calls, "tools");
    ADD_FAILURE() << "a grammar no value of which fits the nesting limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools: every value of this schema nests deeper"), std::string::npos);
  }
}

TEST(StructuredMatcher, AnyObjectAcceptsJsonObjectsOnly) {
  const Matcher m(Grammar::any_object());
  for (const char* ok : {"{}", "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\n\"]}", "{ \"a\": {\"b\":{}} }",
                         "{\"\":0,\"\":-0.0E+1}", "{\"k\":\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"}"})
    EXPECT_TRUE(accepts(m, ok)) << ok;
  for (const char* bad : {"[]", "1", "{\"a\":}", "{\"a\":1,}", "{'a':1}", "{\"a\":01}", "{\"a\":\"\x01\"}",
                          "{\"a\":\"\\ud800\"}", "{\"a\":\"\xC0\xAF\"}", "{\"a\":\"\xED\xA0\x80\"}", "{\"a\":1}}",
                          "{\"a\":1} ", "{\"a\" :1}", "{\"a\":1 ,\"b\":2}", "[1 ,2]", "{\"a\":tru}", "{\"a\":.5}",
                          "{\"a\":1.}", "{\"a\":1e}", "{\"a\" 1}"})
    EXPECT_FALSE(accepts(m, bad)) << bad;
  EXPECT_TRUE(prefix_ok(m, "{\"a\":tr"));
  EXPECT_FALSE(prefix_ok(m, "\n"));  // (the output starts with its value: whitespace only between tokens)
}

TEST(StructuredMatcher, SchemaObjectsKeepTheirPropertiesInOrderAndTheirTypes) {
  const Matcher m = schema(R"({"type":"object","properties":{
      "name":{"type":"string","minLength":1,"maxLength":5},
      "nick":{"type":"string"},
      "age":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2},
      "ok":{"type":["boolean","null"]}},
    "required":["name","age","tags"]})");
  for (const char* ok : {R"({"name":"Bob","age":3,"tags":["a"]})", R"({"name":"Bob","nick":"B","age":-3,"tags":[]})",
                         R"({"name":"é€😀ab","age":0,"tags":["a","b"],"ok":null})",
                         R"({ "name": "x", "age":  1,
  "tags": [ "b" ],
  "ok": false
})"})
    EXPECT_TRUE(accepts(m, ok)) << ok;
  for (const char* bad : {R"({"age":3,"name":"Bob","tags":["a"]})", R"({"name":"Bob","age":3.5,"tags":["a"]})",
                          R"({"name":"Bobbie","age":3,"tags":["a"]})", R"({"name":"","age":3,"tags":["a"]})",
                          R"({"name":"Bob","age":3,"tags":["a","b","a"]})", R"({"name":"Bob","age":3})",
                          R"({"name":"Bob","age":3,"tags":["c"]})", R"({"name":"Bob","age":3,"tags":[],"x":1})",
                          R"({"name":"Bob","age":3,"tags":[],"ok":1})"})
    EXPECT_FALSE(accepts(m, bad)) << bad;
}

TEST(StructuredMatcher, ReferencesAnyOfAndLiterals) {
  const Matcher tree = schema(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"anyOf":[{"type":"number"},{"type":"string","maxLength":2}]},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
    "$ref":"#/$defs/node"})");
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":"ab"},{"v":2.5,"kids":[]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{"v":"abc"}]})"));
  EXPECT_FALSE(accepts(tree, R"({"kids":[]})"));
  const Matcher e = schema(R"({"enum":[1,12,"x",{"a":[true]},null]})");
  for (const char* ok : {"1", "12", "\"x\"", "{\"a\":[true]}", "null"}) EXPECT_TRUE(accepts(e, ok)) << ok;
  for (const char* bad : {"2", "123", "\"y\"", "{\"a\": [true]}", "true"}) EXPECT_FALSE(accepts(e, bad)) << bad;
  const Matcher c = schema(R"({"const":"caf\u00e9"})");
  EXPECT_TRUE(accepts(c, "\"caf\xC3\xA9\""));
}

// Thousands of enum values sharing their quote are one stack (a sorted range), every one of them reachable.
TEST(StructuredMatcher, ALargeEnumIsOneStackAndEveryValueIsReachable) {
  ojson values = ojson::array();
  for (int i = 0; i < 3000; ++i) {
    std::string v = "v";  // (not "v" + to_string: GCC 12 warns falsely on it, -Wrestrict)
    v += std::to_string(i);
    values.push_back(v);
  }
  values.push_back("v1x");
  const Matcher m(Grammar::from_schema(ojson{{"enum", values}}));
  Matcher::State s = m.start(), scratch;
  ASSERT_TRUE(m.feed(s, "\"v1", scratch));
  EXPECT_EQ(s.stacks(), 1u);
  for (const char* ok : {"\"v0\"", "\"v1\"", "\"v1x\"", "\"v2999\"", "\"v1234\""}) EXPECT_TRUE(accepts(m, ok)) << ok;
  for (const char* bad : {"\"v3000\"", "\"v\"", "\"v1y\"", "\"w1\""}) EXPECT_FALSE(accepts(m, bad)) << bad;
  // Numbers as literals: 1 is whole at once and 12 may still follow (two stacks, as they can end apart).
  const Matcher n(Grammar::from_schema(ojson::parse(R"({"enum":[12,1,123]})")));
  s = n.start();
  ASSERT_TRUE(n.feed(s, "1", scratch));
  EXPECT_TRUE(n.can_end(s));
  EXPECT_FALSE(n.finished(s));
  ASSERT_TRUE(n.feed(s, "2", scratch));
  EXPECT_TRUE(n.can_end(s));
  ASSERT_TRUE(n.feed(s, "3", scratch));
  EXPECT_TRUE(n.finished(s));
}

TEST(StructuredMatcher, BoundsWhitespaceNestingAndNumbers) {
  const Matcher m(Grammar::any_value());
  EXPECT_TRUE(accepts(m, "[" + std::string(kMaxWhitespaceRun, ' ') + "1]"));
  EXPECT_FALSE(accepts(m, "[" + std::string(kMaxWhitespaceRun + 1, ' ') + "1]"));
  EXPECT_TRUE(accepts(m, std::string(kMaxNesting, '[') + std::string(kMaxNesting, ']')));
  EXPECT_FALSE(prefix_ok(m, std::string(kMaxNesting + 1, '[')));
  EXPECT_TRUE(accepts(m, std::string(kMaxNumberBytes, '1')));
  EXPECT_FALSE(prefix_ok(m, std::string(kMaxNumberBytes + 1, '1')));
  // A byte that needs another after it (an exponent's 'e') only where that one still fits.
  EXPECT_TRUE(prefix_ok(m, std::string(kMaxNumberBytes - 2, '1') + "e"));
  EXPECT_FALSE(prefix_ok(m, std::string(kMaxNumberBytes - 1, '1') + "e"));
  // A root number may end or grow; a closed object may only end.
  Matcher::State s = m.start(), scratch;
  ASSERT_TRUE(m.feed(s, "12", scratch));
  EXPECT_TRUE(m.can_end(s));
  EXPECT_FALSE(m.finished(s));
  s = m.start();
  ASSERT_TRUE(m.feed(s, "{\"a\":1}", scratch));
  EXPECT_TRUE(m.finished(s));
}

// No prefix the matcher takes is a corner: from every state some byte continues or the output may end.
// Random walks over the bytes each state allows, through schemas with required contents, item counts,
// string lengths and deep nesting.
TEST(StructuredMatcher, EveryPrefixItTakesCanBeCompleted) {
  const char* schemas[] = {
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"number"},"minItems":2,"maxItems":3},
          "b":{"type":"string","minLength":2,"maxLength":3},"c":{"type":"integer"}},"required":["a","b","c"]})",
      R"({"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/n"}},
          "v":{"type":"object","properties":{"w":{"type":"array","items":{},"minItems":1}},"required":["w"]}},
          "required":["v"]}},"$ref":"#/$defs/n"})",
      R"({"anyOf":[{"type":"number"},{"type":"array","items":{"anyOf":[{"type":"string"},{"type":"null"}]}}]})",
      R"({})"};
  std::mt19937 rng(11);
  for (const char* text : schemas) {
    const Matcher m = schema(text);
    for (int walk = 0; walk < 150; ++walk) {
      Matcher::State s = m.start(), next;
      std::string out;
      for (int i = 0; i < 400 && !m.finished(s); ++i) {
        std::vector<uint8_t> ok;
        for (int b = 0; b < 256; ++b)
          if (m.step(s, uint8_t(b), next)) ok.push_back(uint8_t(b));
        ASSERT_TRUE(!ok.empty() || m.can_end(s)) << "stuck after '" << out << "' in " << text;
        if (ok.empty()) break;
        // Mostly structural bytes: a uniform pick stays inside strings for ever.
        std::vector<uint8_t> structural;
        for (uint8_t b : ok)
          if (std::string_view("{}[],:\"0123456789-.eEtfnrulas ").find(char(b)) != std::string_view::npos)
            structural.push_back(b);
        const auto& pool = structural.empty() || rng() % 8 == 0 ? ok : structural;
        const uint8_t b = pool[rng() % pool.size()];
        ASSERT_TRUE(m.step(s, b, next));
        std::swap(s, next);
        out += char(b);
      }
    }
  }
}

// A random JSON value (bounded depth), with strings drawn from a small alphabet that includes escapes and
// multi-byte characters.
ojson random_value(std::mt19937& rng, int depth) {
  const int kind = int(rng() % (depth > 3 ? 5 : 7));
  const char* pieces[] = {"a", "Z", " ", "\"", "\\", "\n", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "/", "\t"};
  auto str = [&]() {
    std::string s;
    for (int i = int(rng() % 6); i > 0; --i) s += pieces[rng() % 11];
    return s;
  };
  switch (kind) {
    case 0: return ojson(nullptr);
    case 1: return ojson(rng() % 2 == 0);
    case 2: return ojson(int64_t(rng() % 2000000) - 1000000);
    case 3: return ojson(double(int64_t(rng() % 200000) - 100000) / 64.0);
    case 4: return ojson(str());
    case 5: {
      ojson a = ojson::array();
      for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      ojson o = ojson::object();
      for (int i = int(rng() % 4); i > 0; --i) o[str()] = random_value(rng, depth + 1);
      return o;
    }
  }
}

TEST(StructuredMatcher, AgreesWithNlohmannOnRandomDocumentsAndTheirMutations) {
  const Matcher m(Grammar::any_value());
  std::mt19937 rng(7);
  int accepted_mutants = 0;
  for (int i = 0; i < 400; ++i) {
    const ojson v = random_value(rng, 0);
    for (const std::string& text : {v.dump(), v.dump(1)}) {
      ASSERT_TRUE(accepts(m, text)) << text;
      // Soundness: a mutated text the matcher takes whole must parse.
      for (int j = 0; j < 8; ++j) {
        std::string t = text;
        const size_t at = rng() % t.size();
        const char bytes[] = {'"', '\\', ',', ':', '}', ']', '0', 'e', '-', ' ', '\x80', 'u'};
        if (rng() % 3 == 0) t.erase(at, 1);
        else t[at] = bytes[rng() % sizeof(bytes)];
        if (accepts(m, t)) {
          ++accepted_mutants;
          EXPECT_TRUE(nlohmann::json::accept(t)) << t;
        }
      }
    }
  }
  EXPECT_GT(accepted_mutants, 50) << "the mutations should sometimes stay valid";
}

// A vocabulary with single bytes, JSON pieces, plain words, partial UTF-8 and an end token (id 0).
std::vector<std::string> test_vocab() {
  std::vector<std::string> v{""};  // 0: the end token (no bytes)
  for (int b = 1; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\"]", "true", "false", "null", " \"", "abc", "name", "\xC3\xA9",
                        "\xC3", "\\n", "\\u00", "}\n", "12", ".5", "e-3", "\":\"", "\"name\":", "[{", "}]", "  ",
                        "\n  ", "ab\"", "x\\", "caf\xC3\xA9", "\xE2\x82", "\xAC", "-0", "1e", "\"a"})
    v.push_back(t);
  return v;
}

TEST(StructuredTokenFilter, TrieWalkMatchesATokenByTokenCheck) {
  auto vocab = std::make_shared<const TokenVocab>(test_vocab());
  const char* schemas[] = {nullptr, R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
      "xs":{"type":"array","items":{"type":"number"}}},"required":["name"]})"};
  const char* texts[] = {R"({"name": "caf\u00e9 \n", "k": [1.5e-3, true, null, {"a": "x"}]})",
                         R"({"name":"ab","xs":[12, -0.5, 1e3]})"};
  for (int g = 0; g < 2; ++g) {
    auto matcher = std::make_shared<const Matcher>(g == 0 ? Grammar::any_object()
                                                          : Grammar::from_schema(ojson::parse(schemas[1])));
    TokenFilter filter(matcher, vocab, {0});
    const std::string text = texts[g];
    Matcher::State s = matcher->start(), scratch;
    TokenMask allowed;
    for (size_t i = 0; i <= text.size(); ++i) {
      const int64_t n = filter.allowed(s, allowed);
      int64_t expect_n = 0;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        bool ok;
        if (id == 0) {
          ok = matcher->can_end(s);
        } else {
          Matcher::State t = s;
          ok = matcher->feed(t, vocab->bytes(id), scratch);
        }
        expect_n += ok;
        ASSERT_EQ(allowed.test(id), ok) << "schema " << g << " after '" << text.substr(0, i)
                                                   << "', token '" << vocab->bytes(id) << "'";
      }
      EXPECT_EQ(n, expect_n);
      if (i < text.size()) {
        ASSERT_TRUE(matcher->feed(s, text.substr(i, 1), scratch)) << text.substr(0, i + 1);
      }
    }
  }
}

// A vocabulary of ~8,000 random tokens (beside the single bytes): plain characters, quotes, escapes (some
// refused, as \ud83d), whole and partial UTF-8, JSON punctuation, some of them longer than 16 characters.
std::vector<std::string> random_vocab(std::mt19937& rng) {
  std::vector<std::string> v = test_vocab();
  const char* pieces[] = {"a",  "Z",    " ",        "0",  "\"",        "\\",           "\\\"", "\\n",
                          "\\u00e9", "\\ud83d", "\\u12", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                          "\xC3", "\xE2\x82", "\x80", "\xA9", "\xF0\x9F", "\x98", ",", ":", "}", "]", "{", "[",
                          "1", "\n", "t", "n", "u", "e", "\x01"};
  const size_t kPieces = sizeof(pieces) / sizeof(pieces[0]);
  std::set<std::string> seen(v.begin(), v.end());
  while (v.size() < 8000) {
    std::string t;
    const int n = rng() % 6 == 0 ? 10 + int(rng() % 20) : 1 + int(rng() % 6);
    for (int i = 0; i < n; ++i) t += pieces[rng() % (rng() % 5 == 0 ? kPieces : 4)];  // mostly plain
    if (seen.insert(t).second) v.push_back(t);
  }
  return v;
}

// Inside strings the mask comes from the vocabulary's per-position tables (trimmed to maxLength / minLength)
// and a walk of the closing tokens' bytes after the quote: the same tokens as a token-by-token check, at the
// positions random token-level walks reach in strings with lengths, enums, escapes, multi-byte characters and
// anyOf alternatives (several stacks inside strings at once).
TEST(StructuredTokenFilter, InStringMasksMatchATokenByTokenCheck) {
  std::mt19937 rng(5);
  auto vocab = std::make_shared<const TokenVocab>(random_vocab(rng));
  const char* schemas[] = {
      nullptr,  // any object (strings as keys and values)
      R"({"type":"object","properties":{"s":{"type":"string","maxLength":3},
          "t":{"type":"string","minLength":2,"maxLength":20},"u":{"type":"string","minLength":18},
          "e":{"enum":["a\"b","é€","x","\\"]},"a":{"type":"array","items":{"type":"string","maxLength":5}}},
          "required":["s","t","u","e","a"]})",
      R"({"anyOf":[{"type":"string","maxLength":12},{"type":"string","minLength":4},{"enum":["abc","a\"Z"]}]})",
      R"({"type":"array","items":{"anyOf":[{"type":"string","maxLength":10},
          {"type":"string","minLength":3,"maxLength":30}]}})",
      R"({"type":"string","maxLength":25})",
      R"({"type":"object","properties":{"k":{"type":"string","minLength":1,"maxLength":17}},"required":["k"]})"};
  int in_string = 0, escaped = 0, in_utf8 = 0, several = 0, bounded = 0;
  for (const char* text : schemas) {
    auto matcher = std::make_shared<const Matcher>(text ? Grammar::from_schema(ojson::parse(text))
                                                        : Grammar::any_object());
    TokenFilter filter(matcher, vocab, {0});
    TokenMask allowed;
    std::vector<Matcher::InString> where;
    for (int walk = 0; walk < 10; ++walk) {
      Matcher::State s = matcher->start(), scratch;
      std::string out;
      for (int step = 0; step < 40 && !matcher->finished(s); ++step) {
        const int64_t n = filter.allowed(s, allowed);
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          Matcher::State t = s;
          const bool expect = id == 0 ? matcher->can_end(s) : matcher->feed(t, vocab->bytes(id), scratch);
          ASSERT_EQ(allowed.test(id), expect) << (text ? text : "any object") << " after '" << out << "', token '"
                                              << vocab->bytes(id) << "'";
          if (expect && id != 0) ok.push_back(id);
        }
        ASSERT_EQ(n, int64_t(ok.size()) + (matcher->can_end(s) ? 1 : 0));
        if (matcher->in_string(s, where)) {
          ++in_string;
          several += where.size() > 1;
          for (const Matcher::InString& w : where) {
            EXPECT_TRUE(w.pos == where[0].pos) << "stacks inside strings read the same bytes since their quote";
            escaped += w.pos.escape != 0;
            in_utf8 += w.pos.utf8 != 0;
            bounded += w.room != INT64_MAX || w.needed > 0;
          }
        }
        if (ok.empty()) break;
        const int32_t id = ok[rng() % ok.size()];
        ASSERT_TRUE(matcher->feed(s, vocab->bytes(id), scratch));
        out += vocab->bytes(id);
      }
    }
  }
  // The walks reached what the tables key on.
  EXPECT_GT(in_string, 500);
  EXPECT_GT(escaped, 15);
  EXPECT_GT(in_utf8, 30);
  EXPECT_GT(several, 30);
  EXPECT_GT(bounded, 200);
}

TEST(StructuredTokenFilter, ConstraintMasksRowsAndEndsWithTheValue) {
  auto vocab = std::make_shared<const TokenVocab>(test_vocab());
  auto matcher = std::make_shared<const Matcher>(Grammar::from_schema(ojson::parse(R"({"enum":["ab"]})")));
  OutputConstraint c(matcher, vocab, {0});
  std::vector<float> row(size_t(vocab->size()), 1.0f);
  c.mask(row.data());
  const int32_t quote_a = int32_t(vocab->size()) - 1;
  ASSERT_EQ(vocab->bytes(quote_a), "\"a");
  for (int32_t id : {int32_t('"'), quote_a}) EXPECT_EQ(row[size_t(id)], 1.0f) << vocab->bytes(id);
  for (int32_t id : {0, int32_t('a'), int32_t('{'), int32_t('1'), int32_t(' ')})
    EXPECT_EQ(row[size_t(id)], -INFINITY) << id;
  ASSERT_TRUE(c.advance(quote_a));
  ASSERT_TRUE(c.advance('b'));
  EXPECT_FALSE(c.finished());
  ASSERT_TRUE(c.advance('"'));
  EXPECT_TRUE(c.finished());
  // Drafts run ahead on a state of their own: past the value only the end token may come, and where not even
  // that may (no end token), a draft row is left as it is (such drafts are never verified).
  c.begin_draft();
  std::vector<float> d(size_t(vocab->size()), 1.0f);
  c.mask_draft(d.data());
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[size_t('"')], -INFINITY);
  OutputConstraint no_end(matcher, vocab, {});
  for (char ch : std::string("\"ab\"")) ASSERT_TRUE(no_end.advance(int32_t(uint8_t(ch)))) << ch;
  ASSERT_TRUE(no_end.finished());
  no_end.begin_draft();
  std::fill(d.begin(), d.end(), 1.0f);
  no_end.mask_draft(d.data());
  for (float x : d) EXPECT_EQ(x, 1.0f);
  std::fill(d.begin(), d.end(), 1.0f);
  EXPECT_THROW(no_end.mask(d.data()), Error) << "a target row with nothing allowed is an error";
}

TEST(StructuredMatcher, ExponentsHaveTwoDigitsSoNoNumberOverflows) {
  const Matcher m(Grammar::any_value());
  EXPECT_TRUE(accepts(m, "1e99"));
  EXPECT_TRUE(accepts(m, "-1.5E-07"));
  EXPECT_FALSE(accepts(m, "1e999"));
  EXPECT_TRUE(accepts(m, std::string(kMaxNumberBytes - 3, '9') + "e99"));
}

}  // namespace
}  // namespace nextn::structured
