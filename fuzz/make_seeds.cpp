// nextn_fuzz_seeds OUT_DIR: writes a small seed corpus for every fuzzer into OUT_DIR/<fuzzer>/, made from
// the committed fixtures (checkpoints, configs, tokenizers, the tokenizer corpus), so no corpus is committed.
//
//   safetensors:      the smallest tensors of each fixture checkpoint re-written as small files, one split
//                     into two shards with an index, and a real header without its data (truncated file)
//   hy_v4_config:     every committed HY V4 config.json
//   qwen4_exp_config: every committed Qwen4-Exp config.json
//   tokenizer_encode: corpus lines and special tokens for each committed tokenizer, as text and as ids
//   tokenizer_json:   each committed tokenizer cut down to its first tokens (and the merges among them),
//                     with its tokenizer_config.json and a text
//   cli_args:         command lines like the README's
//   openai_request:   request bodies of both server endpoints, as the openai clients send them
//   structured_output: JSON Schemas, each with an output text
//   chat_template:    the chat templates of Qwen3, DeepSeek-V3 and the bundled models
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "committed_tokenizers.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using nextn::fuzz::join_parts;
using nextn::testing::read_fixture_file;
using nlohmann::json;

const std::string kRoot = NEXTN_SOURCE_DIR;

class Corpus {
 public:
  Corpus(const fs::path& out, const std::string& fuzzer) : dir_(out / fuzzer) { fs::create_directories(dir_); }
  void add(const std::string& name, std::string_view bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    ++count_;
  }
  size_t count() const { return count_; }

 private:
  fs::path dir_;
  size_t count_ = 0;
};

std::vector<std::string> fixture_checkpoints() {
  std::vector<std::string> dirs;
  for (const char* group : {"tests/fixtures/hy_v4", "tests/fixtures/hy_v4_fp8"})
    for (const auto& e : fs::directory_iterator(kRoot + "/" + group))
      if (fs::exists(e.path() / "model.safetensors")) dirs.push_back(e.path().string());
  dirs.push_back(kRoot + "/models/nextn-hy4-tiny");
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The smallest tensor of each dtype, then the smallest others, up to `count` tensors of at most 16 KB.
std::vector<const nextn::TensorView*> small_tensors(const nextn::SafetensorsFile& file, size_t count) {
  std::vector<const nextn::TensorView*> by_size;
  for (const auto& t : file.tensors())
    if (t.nbytes <= 16384) by_size.push_back(&t);
  std::stable_sort(by_size.begin(), by_size.end(), [](auto* a, auto* b) { return a->nbytes < b->nbytes; });
  std::vector<const nextn::TensorView*> picked;
  std::set<nextn::DType> dtypes;
  for (auto* t : by_size)
    if (dtypes.insert(t->dtype).second) picked.push_back(t);
  for (auto* t : by_size)
    if (picked.size() < count && std::find(picked.begin(), picked.end(), t) == picked.end()) picked.push_back(t);
  return picked;
}

std::string safetensors_bytes(const std::vector<const nextn::TensorView*>& tensors, const fs::path& scratch) {
  nextn::SafetensorsWriter writer;
  for (auto* t : tensors) writer.add(t->name, t->dtype, t->shape, t->data, t->nbytes);
  writer.write(scratch.string(), {{"format", "pt"}});
  return read_fixture_file(scratch.string());
}

void safetensors_seeds(const fs::path& out, const fs::path& scratch) {
  Corpus corpus(out, "safetensors");
  for (const std::string& dir : fixture_checkpoints()) {
    const nextn::SafetensorsFile file(dir + "/model.safetensors");
    const std::string name = fs::path(dir).filename().string();
    const auto tensors = small_tensors(file, 6);
    corpus.add(name + ".safetensors", safetensors_bytes(tensors, scratch));
    // Two shards and the index that places each tensor.
    const size_t half = tensors.size() / 2;
    const std::vector<const nextn::TensorView*> first(tensors.begin(), tensors.begin() + half),
        second(tensors.begin() + half, tensors.end());
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    for (auto* t : first) index["weight_map"][t->name] = "model-00001-of-00002.safetensors";
    for (auto* t : second) index["weight_map"][t->name] = "model-00002-of-00002.safetensors";
    corpus.add(name + ".sharded",
               join_parts({safetensors_bytes(first, scratch), index.dump(1), safetensors_bytes(second, scratch)}));
  }
  // A real header whose data is missing: every tensor runs past the end of the file.
  const std::string bundled = read_fixture_file(kRoot + "/models/nextn-hy4-tiny/model.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bundled[static_cast<size_t>(i)]);
  corpus.add("bundled-header-only.safetensors", std::string_view(bundled).substr(0, 8 + header_len));
  std::printf("safetensors: %zu seeds\n", corpus.count());
}

void config_seeds(const fs::path& out) {
  Corpus corpus(out, "hy_v4_config");
  for (const std::string& dir : fixture_checkpoints())
    corpus.add(fs::path(dir).filename().string() + ".json", read_fixture_file(dir + "/config.json"));
  std::printf("hy_v4_config: %zu seeds\n", corpus.count());
  Corpus qwen(out, "qwen4_exp_config");
  for (const auto& e : fs::directory_iterator(kRoot + "/tests/fixtures/qwen4_exp"))
    if (fs::exists(e.path() / "config.json"))
      qwen.add(e.path().filename().string() + ".json", read_fixture_file((e.path() / "config.json").string()));
  qwen.add("bundled.json", read_fixture_file(kRoot + "/models/nextn-qwen4exp-tiny/config.json"));
  std::printf("qwen4_exp_config: %zu seeds\n", qwen.count());
}

std::vector<std::string> corpus_lines() {
  std::istringstream in(read_fixture_file(kRoot + "/tests/tokenizer/corpus.txt"));
  std::vector<std::string> lines;
  std::string line;
  for (size_t n = 0; std::getline(in, line); ++n)
    if (line.size() >= 8 && line.size() <= 200 && n % 7 == 0) lines.push_back(line + "\n");
  return lines;
}

// The server's request bodies: the shapes the openai clients send, for both endpoints.
void openai_request_seeds(const fs::path& out) {
  Corpus corpus(out, "openai_request");
  const char* bodies[] = {
      R"({"model": "nextn-hy4-tiny", "prompt": "def f():", "max_tokens": 16, "temperature": 0})",
      R"({"prompt": [1, 5, 9], "n": 2, "seed": 3, "logprobs": 2, "stop": ["
", "#"], "stream": true,
          "stream_options": {"include_usage": true}, "num_speculative_tokens": 2})",
      R"({"prompt": ["a", [4, 5]], "top_p": 0.9, "top_k": -1, "min_p": 0.1, "presence_penalty": 1})",
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
          "max_completion_tokens": 8, "logprobs": true, "top_logprobs": 3})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]},
          {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}], "tools": []})",
  };
  int i = 0;
  for (const char* b : bodies) corpus.add("body" + std::to_string(i++) + ".json", b);
  std::printf("openai_request: %zu seeds\n", corpus.count());
}

// JSON Schemas with an output text each (structured output).
void structured_output_seeds(const fs::path& out) {
  Corpus corpus(out, "structured_output");
  const std::pair<const char*, const char*> seeds[] = {
      {R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer"},
          "tags":{"type":"array","items":{"enum":["a","b",null]},"minItems":1}},"required":["name","tags"]})",
       R"({"name": "x\u00e9", "n": -12, "tags": ["a", null]})"},
      {R"({"$defs":{"t":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},
          "$ref":"#/$defs/t"})",
       R"({"k":[{"k":[]},{}]})"},
      {R"({"anyOf":[{"type":"number"},{"type":["string","null"],"minLength":2}]})", R"(1.5e-3)"},
      {R"({})", R"([{"a":true}, 1, "s"])"},
      {R"({"type":"object","additionalProperties":{"type":"boolean"}})", R"({"x": true, "y": false})"},
  };
  int i = 0;
  for (const auto& [schema, text] : seeds)
    corpus.add("schema" + std::to_string(i++) + ".txt", nextn::fuzz::join_parts({schema, text}));
  std::printf("structured_output: %zu seeds\n", corpus.count());
}

// Chat templates: the real ones the renderer is checked on (Qwen3, DeepSeek-V3, the bundled models').
void chat_template_seeds(const fs::path& out) {
  Corpus corpus(out, "chat_template");
  for (const char* dir : {"tests/tokenizer/qwen3", "tests/tokenizer/deepseek_v3", "models/nextn-hy4-tiny",
                          "models/nextn-qwen4exp-tiny"}) {
    const auto j = nlohmann::json::parse(read_fixture_file(kRoot + "/" + dir + "/tokenizer_config.json"));
    if (j.contains("chat_template") && j["chat_template"].is_string())
      corpus.add(fs::path(dir).filename().string() + ".jinja", j["chat_template"].get<std::string>());
  }
  std::printf("chat_template: %zu seeds\n", corpus.count());
}

void tokenizer_encode_seeds(const fs::path& out) {
  Corpus corpus(out, "tokenizer_encode");
  const auto tokenizers = nextn::fuzz::committed_tokenizers();
  const std::vector<std::string> lines = corpus_lines();
  for (size_t t = 0; t < tokenizers.size(); ++t) {
    const std::string json_text = read_fixture_file(tokenizers[t].json_path);
    const auto tok = nextn::Tokenizer::from_json(json_text, read_fixture_file(tokenizers[t].config_path));
    const char which = static_cast<char>(t);
    for (size_t i = 0; i < lines.size(); ++i) {
      const char flags = static_cast<char>(i % 4);  // add_special / skip_special
      corpus.add(tokenizers[t].name + "-text-" + std::to_string(i), std::string{which, flags} + lines[i]);
    }
    // Added tokens between words, and ids (3 bytes each) of a line, specials included.
    std::string specials;
    const json parsed = json::parse(json_text);
    for (const auto& added : parsed["added_tokens"]) {
      specials += "a " + added["content"].get<std::string>() + " b";
      if (specials.size() > 400) break;
    }
    corpus.add(tokenizers[t].name + "-specials", std::string{which, 1} + specials);
    std::string ids{which, 4 | 2};
    for (int32_t id : tok.encode(lines.front() + specials, true))
      for (int b = 0; b < 3; ++b) ids += static_cast<char>((id >> (8 * b)) & 0xff);
    corpus.add(tokenizers[t].name + "-ids", ids);
  }
  std::printf("tokenizer_encode: %zu seeds\n", corpus.count());
}

std::string token_content(const json& config, const char* key) {
  const auto v = config.find(key);
  if (v == config.end()) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object() && v->contains("content") && (*v)["content"].is_string()) return (*v)["content"];
  return "";
}

// The committed tokenizer with only ids below `keep`, the merges among them and the added tokens the
// config names (plus a few more) renumbered right after them: small, and still loadable.
json small_tokenizer(json tok, const json& config, int keep) {
  json vocab = json::object();
  for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it)
    if (it.value().get<int>() < keep) vocab[it.key()] = it.value();
  json merges = json::array();
  for (const json& m : tok["model"]["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) continue;
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    }
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
  }
  const std::set<std::string> named = {token_content(config, "bos_token"), token_content(config, "eos_token"),
                                       token_content(config, "pad_token")};
  json added = json::array();
  int next_id = keep;
  for (json a : tok["added_tokens"]) {
    const bool in_vocab = a["id"].get<int>() < keep;
    if (!in_vocab && !named.count(a["content"].get<std::string>()) && next_id >= keep + 4) continue;
    if (!in_vocab) {
      a["id"] = next_id++;
      if (vocab.contains(a["content"].get<std::string>())) vocab[a["content"].get<std::string>()] = a["id"];
    }
    added.push_back(a);
  }
  tok["model"]["vocab"] = vocab;
  tok["model"]["merges"] = merges;
  tok["added_tokens"] = added;
  if (tok.contains("post_processor") && tok["post_processor"].is_object() &&
      tok["post_processor"].value("type", "") == "TemplateProcessing")
    tok["post_processor"] = nullptr;  // its special-token ids point into the full vocabulary
  return tok;
}

void tokenizer_json_seeds(const fs::path& out) {
  Corpus corpus(out, "tokenizer_json");
  const std::vector<std::string> lines = corpus_lines();
  for (const auto& t : nextn::fuzz::committed_tokenizers()) {
    const std::string config_text = read_fixture_file(t.config_path);
    const json small = small_tokenizer(json::parse(read_fixture_file(t.json_path)), json::parse(config_text), 600);
    const std::string small_text = small.dump();
    try {
      (void)nextn::Tokenizer::from_json(small_text, config_text);
    } catch (const nextn::Error& e) {
      std::printf("tokenizer_json: the cut-down %s tokenizer does not load (%s); seeding it anyway\n",
                  t.name.c_str(), e.what());
    }
    corpus.add(t.name + "-small", join_parts({small_text, config_text, lines.at(1)}));
    corpus.add(t.name + "-small-no-config", join_parts({small_text, "", lines.at(2)}));
  }
  std::printf("tokenizer_json: %zu seeds\n", corpus.count());
}

void cli_args_seeds(const fs::path& out) {
  Corpus corpus(out, "cli_args");
  const std::vector<std::vector<std::string>> lines = {
      {"generate", "--ids", "1,2,3", "-n", "32", "--json"},
      {"generate", "--prompt", "import os", "--temperature", "0.8", "--top-p", "0.95", "--seed", "7"},
      {"generate", "--max-tokens=64", "--threads", "2", "--no-speculate"},
      {"logits", "--ids", " 71, 1104 ,0", "--draft", "--stop", "x"},
      {"detokenize", "--ids", "2147483647,0", "--temperature=1e-38", "--seed=-1"},
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string bytes;
    for (size_t w = 0; w < lines[i].size(); ++w) bytes += (w ? std::string(1, '\0') : "") + lines[i][w];
    corpus.add("argv-" + std::to_string(i), bytes);
  }
  std::printf("cli_args: %zu seeds\n", corpus.count());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (writes OUT_DIR/<fuzzer>/ seed corpora)\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const nextn::fuzz::ScratchDir scratch;
  try {
    safetensors_seeds(out, fs::path(scratch.path()) / "seed.safetensors");
    config_seeds(out);
    tokenizer_encode_seeds(out);
    tokenizer_json_seeds(out);
    cli_args_seeds(out);
    openai_request_seeds(out);
    chat_template_seeds(out);
    structured_output_seeds(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nextn_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
