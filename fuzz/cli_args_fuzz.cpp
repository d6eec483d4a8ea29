// Fuzzes the CLI's command-line parsing (src/cli/args.cpp, compiled into this target): Args with its
// range-checked getters, parse_int / parse_double and parse_id_list.
//
// Input: the arguments, separated by NUL bytes (argv[0] is the subcommand, as in `nextn generate ...`).
//
// A bad command line must be a UsageError (the CLI prints it and exits 2); nothing else may escape. What is
// accepted must mean what it says: an option holds its last value, a number lies in the range it was
// checked against and reads back from its exact spelling as the same value, and an id list has one id per
// comma-separated field, each a valid token id, that prints back to a list parsing to the same ids.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "fuzz_util.h"

namespace {

using nextn::cli::Args;
using nextn::cli::RealRange;
using nextn::cli::UsageError;

constexpr double kFloatMax = RealRange{0}.hi;

const std::vector<std::string> kFlags = {"json", "draft", "no-speculate", "help"};
const std::vector<std::string> kOptions = {"ids", "max-tokens", "temperature", "top-p", "seed", "threads", "stop"};

Args args_of(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return Args(static_cast<int>(argv.size()), argv.data(), 1, kFlags, kOptions);
}

// Re-reading an accepted value must be accepted too: a UsageError there is a broken invariant.
template <class F>
auto reread(F&& read) {
  try {
    return read();
  } catch (const UsageError&) {
    nextn::fuzz::invariant_failed("an accepted value, printed back, was refused", __FILE__, __LINE__);
  }
}

void check_ids(const std::string& text) {
  std::vector<int32_t> ids;
  try {
    ids = nextn::cli::parse_id_list(text, "--ids");
  } catch (const UsageError&) {
    return;
  }
  NEXTN_FUZZ_CHECK(ids.size() == static_cast<size_t>(std::count(text.begin(), text.end(), ',')) + 1);
  std::string printed;
  for (int32_t id : ids) {
    NEXTN_FUZZ_CHECK(id >= 0);
    printed += (printed.empty() ? "" : ",") + std::to_string(id);
  }
  NEXTN_FUZZ_CHECK(reread([&] { return nextn::cli::parse_id_list(printed, "--ids"); }) == ids);
}

// An accepted integer lies in its range and reads back from its decimal spelling as the same value.
void check_int(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  try {
    v = nextn::cli::parse_int(text, "--n", lo, hi);
  } catch (const UsageError&) {
    return;
  }
  NEXTN_FUZZ_CHECK(v >= lo && v <= hi);
  NEXTN_FUZZ_CHECK(reread([&] { return nextn::cli::parse_int(std::to_string(v), "--n", lo, hi); }) == v);
}

// An accepted number is finite, in its range, and reads back from its shortest exact spelling.
void check_double(const std::string& text, const RealRange& range) {
  double v = 0;
  try {
    v = nextn::cli::parse_double(text, "--x", range);
  } catch (const UsageError&) {
    return;
  }
  NEXTN_FUZZ_CHECK(std::isfinite(v) && v <= range.hi && (range.lo_open ? v > range.lo : v >= range.lo));
  char exact[64];
  std::snprintf(exact, sizeof exact, "%.17g", v);
  NEXTN_FUZZ_CHECK(reread([&] { return nextn::cli::parse_double(exact, "--x", range); }) == v);
}

// The getters the commands use: defaults when absent, ranges when present.
void check_getters(const Args& args) {
  try {
    const int n = args.get_int("max-tokens", -7, 0, 1 << 30);
    NEXTN_FUZZ_CHECK(args.has("max-tokens") ? n >= 0 && n <= (1 << 30) : n == -7);
  } catch (const UsageError&) {
  }
  try {
    const int threads = nextn::cli::thread_count(args);
    NEXTN_FUZZ_CHECK(threads >= 0 && threads <= nextn::cli::max_threads() && nextn::cli::max_threads() <= 1024);
  } catch (const UsageError&) {
  }
  try {
    const uint64_t seed = args.get_uint64("seed", 7);
    NEXTN_FUZZ_CHECK(args.has("seed") || seed == 7);
    if (args.has("seed"))
      NEXTN_FUZZ_CHECK(reread([&] { return args_of({"x", "--seed", std::to_string(seed)}).get_uint64("seed", 0); }) == seed);
  } catch (const UsageError&) {
  }
  try {
    const double top_p = args.get_double("top-p", 1.0, RealRange{0, 1, true});
    NEXTN_FUZZ_CHECK(top_p > 0 && top_p <= 1);
  } catch (const UsageError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words(1);
  for (size_t i = 0; i < size && words.size() <= 64; ++i) {
    if (data[i] == 0)
      words.emplace_back();
    else
      words.back() += static_cast<char>(data[i]);
  }
  for (const std::string& w : words) {
    check_ids(w);
    check_int(w, INT64_MIN, INT64_MAX);
    check_int(w, 0, 1000);
    check_double(w, RealRange{-kFloatMax});
    check_double(w, RealRange{0, 1, true});
  }
  try {
    const Args args = args_of(words);
    for (const std::string& name : kOptions) {
      if (args.has(name)) NEXTN_FUZZ_CHECK(!args.all(name).empty() && args.get(name) == args.all(name).back());
    }
    for (const std::string& p : args.positional()) NEXTN_FUZZ_CHECK(p == "--" || p.rfind("--", 0) != 0);
    check_getters(args);
    for (const std::string& ids : args.all("ids")) check_ids(ids);
  } catch (const UsageError&) {
  }
  return 0;
}
