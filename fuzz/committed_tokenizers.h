// The tokenizer.json files committed in the repository (bundled model, Qwen3, DeepSeek-V3), read from the
// source tree (NEXTN_SOURCE_DIR) for the tokenizer fuzzer and the seed generator.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fixture_file.h"

namespace nextn::fuzz {

struct CommittedTokenizer {
  std::string name;
  std::string json_path;    // tokenizer.json or tokenizer.json.gz
  std::string config_path;  // tokenizer_config.json
};

inline std::vector<CommittedTokenizer> committed_tokenizers() {
  const std::string root = NEXTN_SOURCE_DIR;
  return {
      {"bundled", root + "/models/nextn-hy4-tiny/tokenizer.json", root + "/models/nextn-hy4-tiny/tokenizer_config.json"},
      {"qwen3", root + "/tests/tokenizer/qwen3/tokenizer.json.gz", root + "/tests/tokenizer/qwen3/tokenizer_config.json"},
      {"deepseek_v3", root + "/tests/tokenizer/deepseek_v3/tokenizer.json.gz",
       root + "/tests/tokenizer/deepseek_v3/tokenizer_config.json"},
  };
}



}  // namespace nextn::fuzz
