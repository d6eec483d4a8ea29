#include "cli/args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <thread>

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

namespace {

constexpr double kFloatMax = RealRange{0}.hi;

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string range_text(const RealRange& r) {
  if (r.hi >= kFloatMax) return std::string(r.lo_open ? "> " : ">= ") + number_text(r.lo);
  return "in " + std::string(r.lo_open ? "(" : "[") + number_text(r.lo) + ", " + number_text(r.hi) + "]";
}

}  // namespace

int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  const auto out_of_range = [&] {
    return UsageError(what + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + text);
  };
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range && ptr == end) throw out_of_range();
  if (text.empty() || ec != std::errc() || ptr != end)
    throw UsageError(what + " expects an integer, got '" + text + "'");
  if (v < lo || v > hi) throw out_of_range();
  return v;
}

double parse_double(const std::string& text, const std::string& what, const RealRange& range) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || std::isspace(static_cast<unsigned char>(text[0])))
    throw UsageError(what + " expects a number, got '" + text + "'");
  // (an underflow to 0 or a subnormal is kept: it is the value's limit; an overflow is out of range)
  const bool in_range = std::isfinite(v) && (range.lo_open ? v > range.lo : v >= range.lo) && v <= range.hi;
  if (!in_range) throw UsageError(what + " must be a finite number " + range_text(range) + ", got " + text);
  return v;
}

int Args::get_int(const std::string& name, int def, int lo, int hi) const {
  if (!has(name)) return def;
  return static_cast<int>(parse_int(get(name), "--" + name, lo, hi));
}

uint64_t Args::get_uint64(const std::string& name, uint64_t def) const {
  if (!has(name)) return def;
  const std::string s = get(name);
  const std::string what = "--" + name;
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  const bool negative = !s.empty() && s[0] == '-';
  if (negative || (ec == std::errc::result_out_of_range && ptr == end))
    throw UsageError(what + " must be in 0.." + std::to_string(UINT64_MAX) + ", got " + s);
  if (s.empty() || ec != std::errc() || ptr != end) throw UsageError(what + " expects an integer, got '" + s + "'");
  return v;
}

double Args::get_double(const std::string& name, double def, const RealRange& range) const {
  if (!has(name)) return def;
  return parse_double(get(name), "--" + name, range);
}

int max_threads() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));  // (the host's: a cap only)
  return std::min(1024, std::max(4, 4 * cores));
}

int thread_count(const Args& a) { return a.get_int("threads", 0, 0, max_threads()); }

int tensor_parallel(const Args& a) { return a.get_int("tensor-parallel", 1, 1, 64); }

void check_output_outside_checkpoint(const std::string& output, const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out(output);
  const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (out.extension() == ".safetensors" && fs::equivalent(folder, model_dir, ec))
    throw UsageError("--output " + output + " is a .safetensors file in the checkpoint folder " + model_dir +
                     " (it would overwrite the checkpoint or be read as a shard of it): write it elsewhere");
  if (!fs::exists(out, ec)) return;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code same_ec;
    if (fs::equivalent(out, it->path(), same_ec))
      throw UsageError("--output " + output + " is the checkpoint's own file " + it->path().string() +
                       ": write it elsewhere");
  }
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
