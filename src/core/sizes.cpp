#include "core/sizes.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"

namespace nextn {

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) throw Error(what + ": size overflows int64");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Error(what + ": size overflows int64");
  return r;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

void require_memory(int64_t bytes, const std::string& what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const int64_t ram = int64_t(pages) * int64_t(page);
  if (bytes > ram) throw Error(what + " needs " + gib(bytes) + ", more than this machine's memory (" + gib(ram) + ")");
}

}  // namespace nextn
