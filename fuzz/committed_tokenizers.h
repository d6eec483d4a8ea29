// The tokenizer.json files committed in the repository (bundled model, Qwen3, DeepSeek-V3), read from the
// source tree (NEXTN_SOURCE_DIR) for the tokenizer fuzzer and the seed generator.
#pragma once
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

// The whole file; gzip-compressed files (.gz) are decompressed. Throws std::runtime_error: a missing
// fixture is a broken checkout, not an input the fuzzer made.
inline std::string read_fixture(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error("cannot open " + path);
    std::string out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    gzclose(f);
    if (n != 0) throw std::runtime_error("gzip error in " + path);
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace nextn::fuzz
