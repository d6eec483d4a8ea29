#include "cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace nextn::cli {

Args::Args(int argc, char** argv, int first, const std::vector<std::string>& flags,
           const std::vector<std::string>& options) {
  auto known = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-n") a = "--max-tokens";  // the one short option: generation length
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (known(flags, name)) {
      if (inline_value) throw UsageError("option --" + name + " takes no value");
      values_[name].push_back("1");
    } else if (known(options, name)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name].push_back(value);
    } else {
      throw UsageError("unknown option --" + name);
    }
  }
}

std::string Args::get(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second.back();
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t def) const {
  if (!has(name)) return def;
  const std::string s = get(name);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || errno) throw UsageError("--" + name + " expects an integer, got '" + s + "'");
  return v;
}

double Args::get_double(const std::string& name, double def) const {
  if (!has(name)) return def;
  const std::string s = get(name);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || errno) throw UsageError("--" + name + " expects a number, got '" + s + "'");
  return v;
}

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end || errno || v < 0 || v > INT32_MAX)
      throw UsageError(what + ": '" + tok + "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return ids;
}

}  // namespace nextn::cli
