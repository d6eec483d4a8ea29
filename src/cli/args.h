// Minimal command-line parsing for the nextn subcommands: --flag, --key value, --key=value.
// Every numeric option is read through a getter that checks its range, so a value that does not fit the
// field it sets is a usage error naming the option, never a silent wrap-around or truncation.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace nextn::cli {

// Thrown for bad command lines: the caller prints the message and the usage, and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The values a floating-point option accepts: [lo, hi], or (lo, hi] when lo_open. Non-finite values
// (nan, inf) are always refused. The default upper bound is the largest float, so that every accepted
// value survives the conversion to the float fields it usually sets.
struct RealRange {
  double lo;
  double hi = 3.4028234663852886e38;  // FLT_MAX
  bool lo_open = false;
};

class Args {
 public:
  // `flags`: options without a value; `options`: options taking a value (may repeat).
  Args(int argc, char** argv, int first, const std::vector<std::string>& flags,
       const std::vector<std::string>& options);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& def = "") const;
  std::vector<std::string> all(const std::string& name) const;
  // --name as an integer in lo..hi (def when absent; def itself is not checked). Throws UsageError
  // "--name must be in lo..hi, got V" or "--name expects an integer, got 'V'".
  int get_int(const std::string& name, int def, int lo, int hi) const;
  // --name as an unsigned 64-bit integer (the whole range; a negative value is an error).
  uint64_t get_uint64(const std::string& name, uint64_t def) const;
  // --name as a finite number in `range` (def when absent).
  double get_double(const std::string& name, double def, const RealRange& range) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// The same checks for a value that is part of an option (`what` names it in the message, e.g.
// "--relaxed-acceptance N").
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi);
double parse_double(const std::string& text, const std::string& what, const RealRange& range);

// The most worker threads any command accepts: 4x the cores (at least 4), and never more than 1024.
// More would only oversubscribe the machine (and each thread reserves a stack).
int max_threads();
// --threads: 0 (or absent) = all cores, 1..max_threads(); anything else is a UsageError.
int thread_count(const Args& a);
// --tensor-parallel: ranks of a tensor-parallel group, 1 (absent) to 64 (docs/parallel.md).
int tensor_parallel(const Args& a);

// Refuses (UsageError) an --output path that would overwrite or join the checkpoint in `model_dir`: one of
// its files (through symlinks too, as in a hub cache whose files link to blobs), or a new .safetensors file
// in its folder (the loader would take it for a shard).
void check_output_outside_checkpoint(const std::string& output, const std::string& model_dir);

// "1,2,3" -> {1, 2, 3}; throws UsageError naming `what` on anything else.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what);

}  // namespace nextn::cli
