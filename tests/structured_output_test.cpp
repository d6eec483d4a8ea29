// Structured output end to end on both bundled models: the text is JSON of the asked shape (whole when the
// sequence stopped, a valid prefix when it ran out of tokens), and speculation changes nothing: greedy output
// token for token the same at every k and with the tuned k, sampled output valid at every k.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_filter.h"
#include "io/tokenizer.h"
#include "models/registry.h"
#include "ops/cuda/cuda_test_util.h"

namespace nextn {
namespace {

using structured::Grammar;
using structured::Matcher;

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":12},
    "size":{"type":"integer"},
    "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3},
    "kind":{"enum":["file","dir",null]}},
  "required":["name","size","kind"]})";

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const structured::TokenVocab> vocab;
};

class StructuredOutput : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { pool_ = new ThreadPool(2); }
  static void TearDownTestSuite() {
    loaded_.clear();
    delete pool_;
  }
  static Loaded& model() {
    Loaded& l = loaded_[GetParam()];
    if (!l.model) {
      const std::string dir = std::string(NEXTN_SOURCE_DIR) + "/models/" + GetParam();
      l.model = load_model(dir, pool_);
      l.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
      l.vocab = structured::TokenVocab::from_tokenizer(*l.tokenizer, l.model->facts().vocab_size);
    }
    return l;
  }
  static OutputFormat format(const Grammar& g) {
    return OutputFormat{std::make_shared<const Matcher>(g), model().vocab};
  }
  static GenerationResult run(const std::string& prompt, const OutputFormat& f, SamplingParams sp, SpecOptions so) {
    Loaded& l = model();
    for (int32_t e : l.model->facts().eos_token_ids) sp.stop_token_ids.push_back(e);
    return Generator(*l.model).generate(l.tokenizer->encode(prompt, true), sp, so, {}, f);
  }
  // The output's text follows the grammar: whole when generation stopped, a prefix when it ran out.
  static void expect_valid(const GenerationResult& r, const Matcher& m, const std::string& what) {
    std::vector<int32_t> ids = r.ids;
    for (int32_t e : model().model->facts().eos_token_ids)
      if (!ids.empty() && ids.back() == e) ids.pop_back();
    const std::string text = model().tokenizer->decode(ids);
    Matcher::State s = m.start(), scratch;
    ASSERT_TRUE(m.feed(s, text, scratch)) << what << ": " << text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(m.can_end(s)) << what << ": " << text;
      EXPECT_TRUE(nlohmann::json::accept(text)) << what << ": " << text;
    } else {
      EXPECT_EQ(r.finish_reason, "length") << what;
    }
  }
  static ThreadPool* pool_;
  static std::map<std::string, Loaded> loaded_;
};
ThreadPool* StructuredOutput::pool_ = nullptr;
std::map<std::string, Loaded> StructuredOutput::loaded_;

const char* kPrompts[] = {"def load_config(path):\n    return ", "settings = ", "# the record\nrecord = {"};

TEST_P(StructuredOutput, GreedySpeculationEqualsPlainAndTheTextIsTheSchemasJson) {
  const Grammar grammars[] = {Grammar::any_object(), Grammar::from_schema(nlohmann::ordered_json::parse(kSchema))};
  int stopped = 0;
  for (const Grammar& g : grammars) {
    const OutputFormat f = format(g);
    for (const char* prompt : kPrompts) {
      SamplingParams sp;
      sp.max_tokens = 40;
      SpecOptions plain;
      plain.enabled = false;
      const GenerationResult ref = run(prompt, f, sp, plain);
      expect_valid(ref, *f.matcher, "plain");
      stopped += ref.finish_reason == "stop";
      int64_t accepted = 0;
      for (int k = 1; k <= 5; ++k) {
        for (bool tuned : {false, true}) {
          if (tuned && k != 3) continue;
          SpecOptions so;
          so.num_speculative_tokens = k;
          so.tune_k = tuned;
          const GenerationResult r = run(prompt, f, sp, so);
          EXPECT_EQ(r.ids, ref.ids) << "k = " << k << (tuned ? " tuned" : "") << ", prompt '" << prompt << "'";
          EXPECT_EQ(r.finish_reason, ref.finish_reason);
          accepted += r.stats.num_accepted_tokens;
        }
      }
      EXPECT_GT(accepted, 0) << "drafts masked like the target's rows are accepted";
    }
  }
  EXPECT_GT(stopped, 0) << "some outputs should close their value within 40 tokens";
}

TEST_P(StructuredOutput, TheMaskBindsWhereTheModelWouldWriteSomethingElse) {
  SamplingParams sp;
  sp.max_tokens = 12;
  SpecOptions so;
  const GenerationResult free_text = run(kPrompts[0], OutputFormat{}, sp, so);
  const GenerationResult json = run(kPrompts[0], format(Grammar::any_object()), sp, so);
  EXPECT_NE(free_text.ids, json.ids);
  const std::string text = model().tokenizer->decode(json.ids);
  EXPECT_EQ(text.substr(text.find_first_not_of(" \n\r\t"), 1), "{") << text;
}

TEST_P(StructuredOutput, SampledOutputIsValidWithAndWithoutSpeculation) {
  const OutputFormat f = format(Grammar::from_schema(nlohmann::ordered_json::parse(kSchema)));
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (int k : {0, 2, 4}) {
      SamplingParams sp;
      sp.max_tokens = 48;
      sp.temperature = 0.9f;
      sp.top_p = 0.95f;
      sp.seed = seed;
      SpecOptions so;
      so.enabled = k > 0;
      so.num_speculative_tokens = std::max(k, 1);
      const GenerationResult r = run(kPrompts[int(seed) % 3], f, sp, so);
      expect_valid(r, *f.matcher, "seed " + std::to_string(seed) + ", k = " + std::to_string(k));
    }
  }
}

// Constrained and free sequences share each forward (the free ones' rows come back as argmax ids, the
// constrained ones' whole): each output is what it is alone.
TEST_P(StructuredOutput, ConstrainedAndFreeSequencesInOneBatchEachGiveTheirOwnOutput) {
  Loaded& l = model();
  const OutputFormat formats[] = {format(Grammar::any_object()), OutputFormat{},
                                  format(Grammar::from_schema(nlohmann::ordered_json::parse(kSchema))), OutputFormat{}};
  std::vector<GenerationResult> alone;
  Engine engine(*l.model);
  for (size_t i = 0; i < 4; ++i) {
    SamplingParams sp;
    sp.max_tokens = 32;
    for (int32_t e : l.model->facts().eos_token_ids) sp.stop_token_ids.push_back(e);
    SpecOptions so;
    so.num_speculative_tokens = 2 + int(i % 2);
    const std::vector<int32_t> prompt = l.tokenizer->encode(kPrompts[i % 3], true);
    alone.push_back(Generator(*l.model).generate(prompt, sp, so, {}, formats[i]));
    engine.submit(Request{prompt, sp, so, {}, formats[i]});
  }
  engine.run();
  auto finished = engine.take_finished();
  ASSERT_EQ(finished.size(), 4u);
  for (auto& [id, r] : finished) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 4);
    EXPECT_EQ(r.ids, alone[size_t(id)].ids) << "request " << id;
  }
}

// On the GPU (constrained rows come back whole, the others' as argmax ids): the CPU's output, token for token.
TEST_P(StructuredOutput, CudaGivesTheCpusConstrainedOutput) {
  NEXTN_SKIP_WITHOUT_CUDA();
  Loaded& l = model();
  const std::string dir = std::string(NEXTN_SOURCE_DIR) + "/models/" + GetParam();
  std::unique_ptr<Model> gpu = load_model(dir, pool_);
  gpu->use_device(Device::kCuda);
  const OutputFormat f = format(Grammar::from_schema(nlohmann::ordered_json::parse(kSchema)));
  for (const char* prompt : kPrompts) {
    for (bool tuned : {false, true}) {
      SamplingParams sp;
      sp.max_tokens = 40;
      for (int32_t e : l.model->facts().eos_token_ids) sp.stop_token_ids.push_back(e);
      SpecOptions so;
      so.tune_k = tuned;
      const std::vector<int32_t> ids = l.tokenizer->encode(prompt, true);
      const GenerationResult cpu = Generator(*l.model).generate(ids, sp, so, {}, f);
      const GenerationResult cuda = Generator(*gpu).generate(ids, sp, so, {}, f);
      EXPECT_EQ(cuda.ids, cpu.ids) << prompt << (tuned ? " (tuned k)" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bundled, StructuredOutput, ::testing::Values("nextn-hy4-tiny", "nextn-qwen4exp-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace nextn
