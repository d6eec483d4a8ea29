// nextn::Error: the one exception type the library throws for bad input (files, configs, requests).
// Messages name the file / tensor / field at fault so the user can act on them.
#pragma once
#include <stdexcept>
#include <string>

namespace nextn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace nextn
