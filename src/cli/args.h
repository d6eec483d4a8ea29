// Minimal command-line parsing for the nextn subcommands: --flag, --key value, --key=value.
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

class Args {
 public:
  // `flags`: options without a value; `options`: options taking a value (may repeat).
  Args(int argc, char** argv, int first, const std::vector<std::string>& flags,
       const std::vector<std::string>& options);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& def = "") const;
  std::vector<std::string> all(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t def) const;
  double get_double(const std::string& name, double def) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// "1,2,3" -> {1, 2, 3}; throws UsageError naming `what` on anything else.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what);

}  // namespace nextn::cli
