// ChatTemplate against python3-jinja2: every case of tests/chat_template/oracle.jsonl (written by
// tools/chat_template_oracle/oracle.py as transformers' apply_chat_template renders it) must render to the same
// bytes, or fail with the same message. Plus loading: where templates come from, and errors naming the file.
#include "serve/chat_template/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace nextn::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string source_path(const std::string& relative) { return std::string(NEXTN_SOURCE_DIR) + "/" + relative; }

std::vector<OrderedJson> oracle_cases() {
  std::ifstream in(source_path("tests/chat_template/oracle.jsonl"));
  std::vector<OrderedJson> cases;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) cases.push_back(OrderedJson::parse(line));
  return cases;
}

// The first position where two strings differ, shown with some context, for a readable failure.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return "first difference at byte " + std::to_string(i) + ":\n  got:  " + OrderedJson(got.substr(from, 100)).dump() +
         "\n  want: " + OrderedJson(want.substr(from, 100)).dump();
}

TEST(ChatTemplateOracle, EveryCaseRendersAsJinja2Does) {
  const std::vector<OrderedJson> cases = oracle_cases();
  ASSERT_GE(cases.size(), 200u) << "tests/chat_template/oracle.jsonl is missing or short";
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, int> passed;
  for (size_t i = 0; i < cases.size(); ++i) {
    const OrderedJson& c = cases[i];
    const std::string name = c["template"].get<std::string>();
    if (!templates.count(name)) {
      std::optional<ChatTemplate> t = ChatTemplate::from_checkpoint(source_path(name));
      ASSERT_TRUE(t) << name << " has no chat template";
      templates.emplace(name, std::move(*t));
    }
    const ChatTemplate& t = templates.at(name);
    const std::string where = "case " + std::to_string(i) + " (line " + std::to_string(i + 1) + ", " + name + ")";
    if (c.contains("expected")) {
      std::string got;
      try {
        got = t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["tools"], c["extra"]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": threw " << e.what();
        continue;
      }
      const std::string want = c["expected"].get<std::string>();
      if (got == want)
        ++passed[name];
      else
        ADD_FAILURE() << where << ": " << first_difference(got, want);
      continue;
    }
    const std::string want = c["error"].get<std::string>();
    try {
      t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["tools"], c["extra"]);
      ADD_FAILURE() << where << ": rendered, but jinja2 fails with: " << want;
    } catch (const jinja::RenderError& e) {
      EXPECT_EQ(e.detail(), want) << where;
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << where;
      if (e.detail() == want) ++passed[name];
    }
  }
  for (const char* name : {"tests/tokenizer/qwen3", "tests/tokenizer/deepseek_v3", "models/nextn-hy4-tiny",
                           "models/nextn-qwen4exp-tiny"})
    EXPECT_GE(passed[name], 40) << name << ": too few oracle cases pass";
}

// ---- loading ---------------------------------------------------------------------------------------------

class ChatTemplateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("nextn_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string dir() const { return dir_.string(); }

  std::filesystem::path dir_;
};

const OrderedJson kUserHi = OrderedJson::parse(R"([{"role": "user", "content": "hi"}])");

TEST_F(ChatTemplateDir, NoTemplateIsNullopt) {
  EXPECT_FALSE(ChatTemplate::from_checkpoint(dir()));  // no tokenizer_config.json at all
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_FALSE(ChatTemplate::from_checkpoint(dir()));
  write("tokenizer_config.json", R"({"chat_template": null})");
  EXPECT_FALSE(ChatTemplate::from_checkpoint(dir()));
}

TEST_F(ChatTemplateDir, StringTemplateWithAddedTokenObjects) {
  write("tokenizer_config.json", R"({"bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>",
    "pad_token": null, "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ pad_token is defined }}"})");
  const auto t = ChatTemplate::from_checkpoint(dir());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->render(kUserHi, false), "<B>hi<E>False");
  EXPECT_EQ(t->bos_token(), "<B>");
  EXPECT_EQ(t->eos_token(), "<E>");
  EXPECT_EQ(t->origin(), "chat template (" + dir() + "/tokenizer_config.json)");
}

TEST_F(ChatTemplateDir, NamedTemplatesUseDefault) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                        {"name": "default", "template": "D"}]})");
  EXPECT_EQ(ChatTemplate::from_checkpoint(dir())->render(kUserHi, false), "D");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  try {
    ChatTemplate::from_checkpoint(dir());
    FAIL() << "no default template must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no template named \"default\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"tool_use\""), std::string::npos) << e.what();
  }
}

TEST_F(ChatTemplateDir, JinjaFileWinsOverTokenizerConfig) {
  write("tokenizer_config.json", R"({"eos_token": "<E>", "chat_template": "from config"})");
  write("chat_template.jinja", "from file {{ eos_token }}\n");
  const auto t = ChatTemplate::from_checkpoint(dir());
  EXPECT_EQ(t->render(kUserHi, false), "from file <E>");  // one trailing newline dropped, as jinja2 does
  EXPECT_EQ(t->origin(), "chat template (" + dir() + "/chat_template.jinja)");
}

TEST_F(ChatTemplateDir, UnsupportedConstructFailsAtLoadNamingFileAndLine) {
  write("tokenizer_config.json", R"({"chat_template": "hello\n{{ x }}\n{% include 'other.jinja' %}"})");
  try {
    ChatTemplate::from_checkpoint(dir());
    FAIL() << "an include must be refused when loading";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "chat template (" + dir() + "/tokenizer_config.json), line 3: unsupported statement 'include'");
  }
  write("tokenizer_config.json", R"({"chat_template": "{{ messages | wordwrap }}"})");
  EXPECT_THROW(ChatTemplate::from_checkpoint(dir()), Error);
  write("tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::from_checkpoint(dir()), Error);
  write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(ChatTemplate::from_checkpoint(dir()), Error);
}

TEST_F(ChatTemplateDir, FromFileTakesTheCheckpointsTokens) {
  write("tokenizer_config.json", R"({"bos_token": "<B>", "eos_token": "<E>"})");
  write("mine.jinja", "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}");
  const ChatTemplate t = ChatTemplate::from_file(dir() + "/mine.jinja", dir());
  EXPECT_EQ(t.render(kUserHi, false), "<B>|hi|<E>");
  EXPECT_THROW(ChatTemplate::from_file(dir() + "/missing.jinja", dir()), Error);
}

// ---- rendering -------------------------------------------------------------------------------------------

const char* kEcho =
    "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    "{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ flag | default('-') }}";

TEST(ChatTemplateRender, VariablesAsTransformersPassesThem) {
  const ChatTemplate t = ChatTemplate::from_source(kEcho, "echo", "", "");
  EXPECT_EQ(t.render(kUserHi, true), "[user:hi]TrueTrueTrue-");
  EXPECT_EQ(t.render(kUserHi, false, OrderedJson::array(), OrderedJson{{"flag", 7}}), "[user:hi]FalseTrueFalse7");
  // nlohmann::json (sorted keys) works the same for what does not depend on key order.
  EXPECT_EQ(t.render(nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])"), true), "[user:hi]TrueTrueTrue-");
}

TEST(ChatTemplateRender, TextPartsAreJoinedWithNewlines) {
  const ChatTemplate t = ChatTemplate::from_source(kEcho, "echo", "", "");
  const OrderedJson parts = OrderedJson::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(t.render(parts, false), "[user:a\nb]TrueTrueFalse-");
  const OrderedJson image = OrderedJson::parse(
      R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])");
  EXPECT_THROW(t.render(image, false), Error);
}

TEST(ChatTemplateRender, MalformedInputIsAnError) {
  const ChatTemplate t = ChatTemplate::from_source(kEcho, "echo", "", "");
  EXPECT_THROW(t.render(OrderedJson::object(), false), Error);
  EXPECT_THROW(t.render(OrderedJson::parse("[1]"), false), Error);
  EXPECT_THROW(t.render(kUserHi, false, OrderedJson::object()), Error);
  EXPECT_THROW(t.render(kUserHi, false, nullptr, OrderedJson{{"messages", 1}}), Error);
}

TEST(ChatTemplateRender, KeyOrderOfToolsIsKept) {
  const ChatTemplate t = ChatTemplate::from_source("{{ tools | tojson }}", "tools", "", "");
  const OrderedJson tools = OrderedJson::parse(R"([{"type": "function", "function": {"name": "f", "b": 1, "a": 2}}])");
  EXPECT_EQ(t.render(kUserHi, false, tools), R"([{"type": "function", "function": {"name": "f", "b": 1, "a": 2}}])");
}

TEST(ChatTemplateRender, RaiseExceptionCarriesTheTemplatesMessage) {
  const ChatTemplate t =
      ChatTemplate::from_source("line one\n{{ raise_exception('roles must alternate') }}", "mine.jinja", "", "");
  try {
    t.render(kUserHi, false);
    FAIL() << "raise_exception must throw";
  } catch (const jinja::RenderError& e) {
    EXPECT_EQ(e.detail(), "roles must alternate");
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(std::string(e.what()), "chat template (mine.jinja), line 2: roles must alternate");
  }
}

TEST(ChatTemplateRender, BundledTemplateFormatsAConversation) {
  const auto t = ChatTemplate::from_checkpoint(source_path("models/nextn-hy4-tiny"));
  ASSERT_TRUE(t);
  const OrderedJson messages = OrderedJson::parse(R"([{"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(t->render(messages, true),
            "<|bos|>### System:\nBe brief.\n\n### User:\nHi\n\n### Assistant:\nHello.<|eos|>\n\n### User:\nBye\n\n"
            "### Assistant:\n");
}

}  // namespace
}  // namespace nextn::serve
