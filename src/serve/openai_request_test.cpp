// Request parsing: every refusal is an ApiError naming the field (OpenAI's `param`), with the status the
// official clients expect; accepted requests set exactly the engine parameters asked for.
#include "serve/openai_request.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "engine/structured/matcher.h"
#include "serve/api_error.h"
#include "serve/chat_template/chat_template.h"

namespace nextn::serve {
namespace {

using nlohmann::json;

class OpenAIRequest : public ::testing::Test {
 protected:
  OpenAIRequest() : tok_(Tokenizer::from_dir(std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny")) {
    facts_.vocab_size = int64_t(tok_.vocab_size());
    facts_.context = 64;
    facts_.num_mtp_layers = 2;
    facts_.eos_token_ids = {2};
    model_.id = "tiny";
    model_.facts = &facts_;
    model_.tokenizer = &tok_;
    model_.default_spec.num_speculative_tokens = 3;
    model_.default_spec.tune_k = true;
  }

  // The ApiError parse_completion_request throws for `body` (fails the test when it accepts it).
  ApiError completion_error(const json& body) {
    try {
      parse_completion_request(body, model_);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "accepted " << body.dump();
    return ApiError(0, "");
  }

  // The bundled model's chat template and vocabulary, and room for a tool call: what chat requests with tools
  // need (false when the template does not load).
  bool serve_chat_with_tools() {
    templ_ = ChatTemplate::from_checkpoint(std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny");
    if (!templ_) return false;
    model_.chat_template = &*templ_;
    model_.vocab = structured::TokenVocab::from_tokenizer(tok_, facts_.vocab_size);
    facts_.context = 4096;
    return true;
  }

  Tokenizer tok_;
  ModelFacts facts_;
  ServedModel model_;
  std::optional<ChatTemplate> templ_;  // (serve_chat_with_tools)
};

TEST_F(OpenAIRequest, CompletionFieldsSetTheEngineParameters) {
  const ApiRequest r = parse_completion_request(
      {{"model", "tiny"}, {"prompt", "def f():"}, {"max_tokens", 5}, {"temperature", 0.5}, {"top_k", -1},
       {"top_p", 0.9}, {"min_p", 0.05}, {"seed", 7}, {"stop", "\n"}, {"n", 2}, {"logprobs", 3},
       {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"stream", true},
       {"stream_options", {{"include_usage", true}}}},
      model_);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], tok_.encode("def f():", true));
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_EQ(r.params.top_k, 0) << "-1 is off, as in vLLM";
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.seed, 7u);
  EXPECT_TRUE(r.params.reproducible) << "a seed asked for: k stays fixed";
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{2}) << "the eos ends generation unless ignore_eos";
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.choices(), 2u);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.spec.tune_k) << "the server's default k";
}

TEST_F(OpenAIRequest, LogitBiasMapsTokenIdsToBiases) {
  const ApiRequest r = parse_completion_request({{"prompt", "x"}, {"logit_bias", {{"7", -100}, {"300", 2.5}}}}, model_);
  std::vector<std::pair<int32_t, float>> want = {{300, 2.5f}, {7, -100.0f}}, got = r.params.logit_bias;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  const ApiError e = completion_error({{"prompt", "x"}, {"logit_bias", {{std::to_string(facts_.vocab_size), 1}}}});
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
}

TEST_F(OpenAIRequest, StopTokenIdsAddToTheEosAndDefaultExtensionsAreAccepted) {
  const ApiRequest r =
      parse_completion_request({{"prompt", "x"}, {"stop_token_ids", {5, 9}}, {"min_tokens", 3}}, model_);
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{2, 5, 9}));
  EXPECT_EQ(r.params.min_tokens, 3);
  const ApiRequest no_eos =
      parse_completion_request({{"prompt", "x"}, {"stop_token_ids", {5}}, {"ignore_eos", true}}, model_);
  EXPECT_EQ(no_eos.params.stop_token_ids, (std::vector<int32_t>{5}));
  // (clients that send vLLM's fields at their defaults are served)
  EXPECT_NO_THROW(parse_completion_request({{"prompt", "x"}, {"skip_special_tokens", true},
                                            {"include_stop_str_in_output", false}, {"use_beam_search", false}},
                                           model_));
}

TEST_F(OpenAIRequest, MaxTokensDefaultsToWhatTheContextLeaves) {
  const ApiRequest r = parse_completion_request({{"prompt", json::array({5, 6, 7, 8})}}, model_);
  EXPECT_EQ(r.params.max_tokens, 60);
  EXPECT_FLOAT_EQ(r.params.temperature, 1.0f) << "OpenAI's default temperature";
  EXPECT_FALSE(r.params.reproducible) << "no seed: a sampled request's k may be tuned";
}

TEST_F(OpenAIRequest, NumSpeculativeTokensSetsKOrTurnsSpeculationOff) {
  const ApiRequest off = parse_completion_request({{"prompt", "x"}, {"num_speculative_tokens", 0}}, model_);
  EXPECT_FALSE(off.spec.enabled);
  const ApiRequest two = parse_completion_request({{"prompt", "x"}, {"num_speculative_tokens", 2}}, model_);
  EXPECT_TRUE(two.spec.enabled);
  EXPECT_EQ(two.spec.num_speculative_tokens, 2);
  EXPECT_FALSE(two.spec.tune_k) << "an explicit k is kept";
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"num_speculative_tokens", 9}}).param, "num_speculative_tokens");
}

TEST_F(OpenAIRequest, BatchPromptsOfTextAndIds) {
  const ApiRequest r = parse_completion_request({{"prompt", json::array({"a b", json::array({3, 4})})}, {"n", 3}}, model_);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(r.choices(), 6u);
}

TEST_F(OpenAIRequest, WrongTypesAndRangesNameTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"prompt", "x"}, {"max_tokens", "10"}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "x"}, {"temperature", -1}}, "temperature"},
      {{{"prompt", "x"}, {"temperature", true}}, "temperature"},
      {{{"prompt", "x"}, {"top_p", 0}}, "top_p"},
      {{{"prompt", "x"}, {"n", 0}}, "n"},
      {{{"prompt", "x"}, {"n", 17}}, "n"},
      {{{"prompt", "x"}, {"logprobs", 21}}, "logprobs"},
      {{{"prompt", "x"}, {"stop", 3}}, "stop"},
      {{{"prompt", "x"}, {"stop", json::array({""})}}, "stop"},
      {{{"prompt", "x"}, {"stream", "yes"}}, "stream"},
      {{{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"prompt", "x"}, {"presence_penalty", 3}}, "presence_penalty"},
      {{{"prompt", "x"}, {"seed", 1.5}}, "seed"},
      {{{"prompt", json::array({1, 999999})}}, "prompt"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", 5}}, "prompt"},
      {{{"max_tokens", 5}}, "prompt"},
      {{{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"prompt", "x"}, {"logit_bias", json::array({1})}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"-3", 1}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"12345678901", 1}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", 100.5}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", "1"}}}}, "logit_bias"},
      {{{"prompt", "x"}, {"stop_token_ids", json::array({1, 999999})}}, "stop_token_ids"},
      {{{"prompt", "x"}, {"stop_token_ids", 5}}, "stop_token_ids"},
      // vLLM's extensions that would change the output and nextn does not implement: refused, not ignored
      {{{"prompt", "x"}, {"min_tokens", -1}}, "min_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 4}, {"min_tokens", 5}}, "min_tokens"},
      {{{"prompt", "x"}, {"bad_words", json::array({"x"})}}, "bad_words"},
      {{{"prompt", "x"}, {"allowed_token_ids", json::array({1})}}, "allowed_token_ids"},
      {{{"prompt", "x"}, {"guided_json", {{"type", "object"}}}}, "guided_json"},
      {{{"prompt", "x"}, {"include_stop_str_in_output", true}}, "include_stop_str_in_output"},
      {{{"prompt", "x"}, {"skip_special_tokens", false}}, "skip_special_tokens"},
      {{{"prompt", "x"}, {"prompt_logprobs", 1}}, "prompt_logprobs"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.param, param) << body.dump() << ": " << e.what();
  }
}

TEST_F(OpenAIRequest, ResponseFormatJsonObjectAndJsonSchemaConstrainTheOutput) {
  EXPECT_NE(std::string(completion_error({{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}).what())
                .find("needs the model's tokenizer"),
            std::string::npos)
      << "without the vocabulary's bytes (no tokenizer) the format is refused, not ignored";
  model_.vocab = structured::TokenVocab::from_tokenizer(tok_, facts_.vocab_size);
  EXPECT_FALSE(parse_completion_request({{"prompt", "x"}, {"response_format", {{"type", "text"}}}}, model_)
                   .format.constrained());
  const ApiRequest obj =
      parse_completion_request({{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}, model_);
  ASSERT_TRUE(obj.format.constrained());
  EXPECT_EQ(obj.format.vocab, model_.vocab);
  // The schema's key order is the output's: "b" before "a" as the client wrote it (the ordered body).
  const auto ordered = nlohmann::ordered_json::parse(R"({"prompt":"x","response_format":{"type":"json_schema",
      "json_schema":{"name":"t","strict":true,"schema":{"type":"object","properties":{"b":{"type":"integer"},
      "a":{"type":"boolean"}},"required":["b","a"]}}}})");
  const ApiRequest sch = parse_completion_request(json(ordered), model_, &ordered);
  ASSERT_TRUE(sch.format.constrained());
  const structured::Matcher& m = *sch.format.matcher;
  structured::Matcher::State st = m.start(), scratch;
  EXPECT_TRUE(m.feed(st, R"({"b":1,"a":true})", scratch) && m.finished(st));
  st = m.start();
  EXPECT_FALSE(m.feed(st, R"({"a":true)", scratch));
  const std::pair<json, std::string> refused[] = {
      {{{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"pattern", "^a"}}}}}},
       "response_format.json_schema.schema at /pattern: the keyword 'pattern' is not supported"},
      {{{"type", "json_schema"}}, "'response_format.json_schema' must be an object"},
      {{{"type", "json_schema"}, {"json_schema", {{"strict", "yes"}}}}, "json_schema.strict' must be true or false"},
      {{{"type", "xml"}}, "must be 'text', 'json_object' or 'json_schema'"},
      {json::array(), "must be an object with a string 'type'"},
  };
  for (const auto& [rf, text] : refused) {
    const ApiError e = completion_error({{"prompt", "x"}, {"response_format", rf}});
    EXPECT_EQ(e.status, 400) << rf.dump();
    EXPECT_EQ(e.param, "response_format") << rf.dump();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST_F(OpenAIRequest, PromptPastTheContextNamesTheLimit) {
  const ApiError e = completion_error({{"prompt", json::array({5, 6, 7, 8})}, {"max_tokens", 61}});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(std::string(e.what()).find("maximum context length is 64 tokens"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("65 tokens (4 in the prompt, 61 in the completion)"), std::string::npos)
      << e.what();
  EXPECT_EQ(parse_completion_request({{"prompt", json::array({5, 6, 7, 8})}, {"max_tokens", 60}}, model_)
                .params.max_tokens, 60);
}

TEST_F(OpenAIRequest, UnknownModelIs404AndNotAnObjectIs400) {
  const ApiError e = completion_error({{"prompt", "x"}, {"model", "gpt-4"}});
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(completion_error(json::array({1})).status, 400);
  EXPECT_EQ(error_body(e)["error"]["code"], "model_not_found");
  EXPECT_EQ(error_body(ApiError(429, "full"))["error"]["type"], "rate_limit_error");
}

TEST_F(OpenAIRequest, ChatWithoutATemplateIsRefusedWithTheReason) {
  try {
    parse_chat_request({{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}, model_);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
}

TEST_F(OpenAIRequest, DeprecatedFunctionsAreRefusedNotIgnored) {
  if (!serve_chat_with_tools()) GTEST_SKIP() << "the bundled chat template did not load";
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  for (const char* name : {"functions", "function_call"}) {
    const json value = name == std::string("functions") ? json::array() : json("auto");
    try {
      parse_chat_request({{"messages", messages}, {name, value}}, model_);
      ADD_FAILURE() << name << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, name);
      EXPECT_NE(std::string(e.what()).find("give 'tools' and 'tool_choice'"), std::string::npos) << e.what();
    }
  }
}

// The whole text is one output of the matcher.
bool matches(const structured::Matcher& m, std::string_view text) {
  structured::Matcher::State st = m.start(), scratch;
  return m.feed(st, text, scratch) && m.can_end(st);
}

TEST_F(OpenAIRequest, AForcedToolCallIsGeneratedUnderItsParametersSchema) {
  ASSERT_TRUE(serve_chat_with_tools());
  const json tools = json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"now"}}])");
  const json messages = json::array({{{"role", "user"}, {"content", "weather?"}}});
  auto chat = [&](json tool_choice) {
    return parse_chat_request({{"messages", messages}, {"tools", tools}, {"tool_choice", tool_choice}}, model_);
  };
  const ApiRequest named = chat({{"type", "function"}, {"function", {{"name", "get_weather"}}}});
  EXPECT_EQ(named.tool_call.mode, ForcedToolCall::Mode::kNamed);
  EXPECT_EQ(named.tool_call.name, "get_weather");
  ASSERT_TRUE(named.format.constrained());
  EXPECT_TRUE(matches(*named.format.matcher, R"({"city":"Oslo","days":3})"));
  EXPECT_FALSE(matches(*named.format.matcher, R"({"days":3})"));
  const ApiRequest required = chat("required");
  EXPECT_EQ(required.tool_call.mode, ForcedToolCall::Mode::kRequired);
  EXPECT_TRUE(matches(*required.format.matcher, R"({"name":"get_weather","arguments":{"city":"Oslo"}})"));
  EXPECT_TRUE(matches(*required.format.matcher, R"({"name":"now","arguments":{}})"));
  EXPECT_FALSE(matches(*required.format.matcher, R"({"name":"now","arguments":{"city":"Oslo"}})"));
  EXPECT_FALSE(matches(*required.format.matcher, R"({"name":"later","arguments":{}})"));
  EXPECT_EQ(chat("auto").tool_call.mode, ForcedToolCall::Mode::kNone);
  EXPECT_FALSE(chat("none").format.constrained());
  auto refusal = [&](const json& body) -> std::string {
    try {
      parse_chat_request(body, model_);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param + ": " + e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal({{"messages", messages}, {"tools", tools},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})
                .find("tool_choice: 'tool_choice' names the function 'nope'"),
            std::string::npos);
  EXPECT_NE(refusal({{"messages", messages}, {"tool_choice", "required"}}).find("'tools' is empty"), std::string::npos);
  EXPECT_NE(refusal({{"messages", messages}, {"tools", tools}, {"tool_choice", "sometimes"}}).find("tool_choice: "),
            std::string::npos);
  EXPECT_NE(refusal({{"messages", messages}, {"tools", tools}, {"tool_choice", "required"},
                     {"response_format", {{"type", "json_object"}}}})
                .find("response_format: "),
            std::string::npos);
  json bad_params = tools;
  bad_params[0]["function"]["parameters"]["properties"]["days"]["minimum"] = 1;
  EXPECT_NE(refusal({{"messages", messages}, {"tools", bad_params}, {"tool_choice", "required"}}).find("'minimum'"),
            std::string::npos);
}

// Each tool's parameters are a document of their own: their "$ref"s ("#/$defs/...", recursive ones included)
// resolve within them under "required" (where the grammar is an anyOf over all tools) as for a named tool,
// even where two tools use the same pointer for different schemas.
TEST_F(OpenAIRequest, EachToolsReferencesResolveInItsOwnParameters) {
  ASSERT_TRUE(serve_chat_with_tools());
  const json tools = json::parse(R"([
    {"type":"function","function":{"name":"add_tree","parameters":{
      "$defs":{"node":{"type":"object","properties":{"label":{"type":"string"},
                       "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["label"]}},
      "type":"object","properties":{"root":{"$ref":"#/$defs/node"}},"required":["root"]}}},
    {"type":"function","function":{"name":"paint","parameters":{
      "$defs":{"node":{"enum":["red","green"]}},
      "type":"object","properties":{"color":{"$ref":"#/$defs/node"}},"required":["color"]}}}])");
  const json messages = json::array({{{"role", "user"}, {"content", "a tree"}}});
  auto chat = [&](const json& tool_list, json tool_choice) {
    return parse_chat_request({{"messages", messages}, {"tools", tool_list}, {"tool_choice", tool_choice}}, model_);
  };
  const ApiRequest required = chat(tools, "required");
  ASSERT_TRUE(required.format.constrained());
  const structured::Matcher& m = *required.format.matcher;
  // (json's keys are sorted: "children" comes before "label")
  EXPECT_TRUE(matches(m, R"({"name":"add_tree","arguments":{"root":{"children":[{"children":[{"label":"c"}],)"
                         R"("label":"b"},{"children":[],"label":"d"}],"label":"a"}}})"));
  EXPECT_TRUE(matches(m, R"({"name":"paint","arguments":{"color":"green"}})"));
  EXPECT_FALSE(matches(m, R"({"name":"paint","arguments":{"color":{"label":"a"}}})"));
  EXPECT_FALSE(matches(m, R"({"name":"add_tree","arguments":{"root":"red"}})"));
  EXPECT_FALSE(matches(m, R"({"name":"add_tree","arguments":{"root":{"children":["red"],"label":"a"}}})"));
  for (const char* name : {"add_tree", "paint"}) {
    const ApiRequest named = chat(tools, {{"type", "function"}, {"function", {{"name", name}}}});
    EXPECT_EQ(matches(*named.format.matcher, R"({"root":{"children":[{"label":"b"}],"label":"a"}})"),
              std::string(name) == "add_tree");
    EXPECT_EQ(matches(*named.format.matcher, R"({"color":"red"})"), std::string(name) == "paint");
  }
  // A pointer that only another tool's parameters hold does not resolve: the error names the tool.
  json borrowed = tools;
  borrowed[1]["function"]["parameters"].erase("$defs");
  try {
    chat(borrowed, "required");
    ADD_FAILURE() << "accepted a reference to another tool's $defs";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(std::string(e.what()).find("the parameters of tool 'paint' at /properties/color/$ref: '#/$defs/node' "
                                         "does not name a schema"),
              std::string::npos)
        << e.what();
  }
}

TEST(DumpJson, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(dump_json(json("a\xff" "b")), "\"a\xEF\xBF\xBD" "b\"");
}

}  // namespace
}  // namespace nextn::serve
