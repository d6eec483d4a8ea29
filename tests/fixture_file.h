// Reading a committed fixture file whole, for the tests and the fuzzers' seeds (no GoogleTest here).
#pragma once
#include <zlib.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace nextn::testing {

// The whole file; gzip-compressed files (.gz) are decompressed. Throws std::runtime_error: a missing or
// corrupt fixture is a broken checkout, not an input under test.
inline std::string read_fixture_file(const std::string& path) {
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

}  // namespace nextn::testing
