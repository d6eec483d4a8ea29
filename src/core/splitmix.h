// splitmix64 (Steele, Lea and Flood): a 64-bit mix with good avalanche, for hashes and cheap random bytes
// that must be the same on every machine (PLE hash tables, bench's oracle draws, benchmark data).
#pragma once
#include <cstdint>

namespace nextn {

inline uint64_t splitmix64(uint64_t v) {
  v += 0x9E3779B97F4A7C15ull;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

}  // namespace nextn
