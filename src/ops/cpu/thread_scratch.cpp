#include "ops/cpu/thread_scratch.h"

#include "ops/ops.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace nextn::ops {
namespace {

constexpr size_t kFirstFloats = size_t(64) << 10;  // 256 KB

struct Buffers {
  std::vector<float> buf[static_cast<int>(ScratchKind::kCount)];
};
thread_local Buffers tl_buffers;

}  // namespace

float* thread_scratch(ScratchKind kind, size_t n) {
  std::vector<float>& b = tl_buffers.buf[static_cast<int>(kind)];
  if (b.size() < n + 16) b.resize(std::max(n + 16, kFirstFloats));
  const uintptr_t p = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((64 - p % 64) % 64) / sizeof(float);
}

void reserve_thread_scratch() {
  for (int k = 0; k < static_cast<int>(ScratchKind::kCount); ++k) thread_scratch(static_cast<ScratchKind>(k), 0);
}

}  // namespace nextn::ops
