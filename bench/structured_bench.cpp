// Structured output's per-token cost: one vocabulary mask (TokenFilter::allowed) on Qwen3's 151k-token
// vocabulary (tests/tokenizer/qwen3), in the states a JSON output spends its tokens in. A decode step of a
// constrained sequence pays one mask per row it samples (cached by state: a verify row whose state a draft
// step met pays none).
//
//   ./build/bin/nextn_bench_kernels --benchmark_filter=StructuredMask
#include <benchmark/benchmark.h>
#include <zlib.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_filter.h"
#include "io/tokenizer.h"

namespace nextn {
namespace {

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, size_t(n));
  gzclose(f);
  return out;
}

Tokenizer qwen3_tokenizer() {
  return Tokenizer::from_json(gunzip(std::string(NEXTN_SOURCE_DIR) + "/tests/tokenizer/qwen3/tokenizer.json.gz"));
}

const std::shared_ptr<const structured::TokenVocab>& qwen3_vocab() {
  static const auto vocab = [] {
    const Tokenizer tok = qwen3_tokenizer();
    return structured::TokenVocab::from_tokenizer(tok, int64_t(tok.vocab_size()));
  }();
  return vocab;
}

// state 0: after '{' (any object: a key comes); 1: inside a string value; 2: inside a number; 3: inside a string
// of at most 40 characters; 4: after a backslash in a string; 5: inside a UTF-8 character in a string; 6: inside
// a key of any object; 7: inside a string that two anyOf alternatives read (two stacks).
struct MaskCase {
  int schema;  // 0: any object; 1..3: kSchemas
  const char* prefix;
};
const char* kSchemas[] = {
    nullptr, R"({"type":"object","properties":{"name":{"type":"string"},"size":{"type":"number"}}})",
    R"({"type":"object","properties":{"title":{"type":"string","maxLength":40},"name":{"type":"string"}}})",
    R"({"type":"object","properties":{"v":{"anyOf":[{"type":"string","maxLength":60},{"type":"string"}]}}})"};
const MaskCase kCases[] = {{0, "{"},
                           {1, "{\"name\": \"The quick"},
                           {1, "{\"size\": 12"},
                           {2, "{\"title\": \"The quick"},
                           {2, "{\"name\": \"The quick\\"},
                           {2, "{\"name\": \"The caf\xC3"},
                           {0, "{\"The quick"},
                           {3, "{\"v\": \"The quick"}};

void BM_StructuredMask(benchmark::State& state) {
  const MaskCase& c = kCases[state.range(0)];
  auto matcher = std::make_shared<const structured::Matcher>(
      c.schema == 0 ? structured::Grammar::any_object()
                    : structured::Grammar::from_schema(nlohmann::ordered_json::parse(kSchemas[c.schema])));
  structured::TokenFilter filter(matcher, qwen3_vocab(), {151643});
  structured::Matcher::State s = matcher->start(), scratch;
  const std::string prefix = c.prefix;
  if (!matcher->feed(s, prefix, scratch)) throw std::runtime_error("bad prefix");
  structured::TokenMask allowed;
  int64_t n = 0;
  for (auto _ : state) benchmark::DoNotOptimize(n = filter.allowed(s, allowed));
  state.counters["allowed"] = double(n);
  state.counters["vocab"] = double(qwen3_vocab()->size());
  state.SetLabel(std::string("after '") + prefix + "'");
}
BENCHMARK(BM_StructuredMask)->DenseRange(0, 7)->ArgName("state")->Unit(benchmark::kMicrosecond);

void BM_StructuredVocabBuild(benchmark::State& state) {
  const Tokenizer tok = qwen3_tokenizer();
  for (auto _ : state) benchmark::DoNotOptimize(structured::TokenVocab::from_tokenizer(tok, int64_t(tok.vocab_size())));
}
BENCHMARK(BM_StructuredVocabBuild)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace nextn
