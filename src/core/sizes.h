// Size arithmetic that cannot overflow silently, and the memory check done before a large allocation.
#pragma once
#include <cstdint>
#include <string>

namespace nextn {

// a * b, or nextn::Error naming `what` when it does not fit in int64 (or a factor is negative).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);
// a + b, or nextn::Error naming `what` on overflow.
int64_t checked_add(int64_t a, int64_t b, const std::string& what);
// "1.25 GiB"
std::string gib(int64_t bytes);
// Refuses `bytes` beyond this machine's physical memory before they are allocated (what cannot be resident
// would swap or be killed, never run): nextn::Error "<what> needs X GiB, more than this machine's memory".
void require_memory(int64_t bytes, const std::string& what);

}  // namespace nextn
