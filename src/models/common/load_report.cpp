#include "models/common/load_report.h"

#include <cstdio>

#include "core/error.h"

namespace nextn {

namespace {

// Lists longer than this are cut in the message (the rest is counted): a wrong layer count can miss
// thousands of tensors.
constexpr size_t kListedMax = 40;

void add_line(std::string& msg, const std::string& line) {
  if (!msg.empty()) msg += '\n';
  msg += line;
}

}  // namespace

std::string LoadReport::error_message(const std::string& dir) const {
  std::string msg;
  if (!missing.empty()) {
    msg += "checkpoint " + dir + " lacks " + std::to_string(missing.size()) + " tensor(s) the model needs:";
    for (size_t i = 0; i < missing.size() && i < kListedMax; ++i) msg += "\n  " + missing[i];
    if (missing.size() > kListedMax) msg += "\n  ... (" + std::to_string(missing.size() - kListedMax) + " more)";
  }
  for (size_t i = 0; i < errors.size() && i < kListedMax; ++i) add_line(msg, errors[i]);
  if (errors.size() > kListedMax) msg += "\n... (" + std::to_string(errors.size() - kListedMax) + " more errors)";
  for (const auto& n : notes) add_line(msg, "note: " + n);
  return msg;
}

void LoadReport::print_or_throw(const std::string& dir) const {
  for (const auto& s : infos) std::fprintf(stderr, "nextn: info: %s\n", s.c_str());
  for (const auto& s : warnings) std::fprintf(stderr, "nextn: warning: %s\n", s.c_str());
  if (!ok()) throw Error(error_message(dir));
}

}  // namespace nextn
