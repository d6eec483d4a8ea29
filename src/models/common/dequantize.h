// A copy of an FP8 weight in the values the kernels would compute with, for the few weights a model keeps
// unquantized whatever the checkpoint stores (e.g. vLLM keeps an indexer's key projection unquantized).
#pragma once
#include <cstdint>
#include <vector>

#include "core/finite.h"
#include "ops/ops.h"

namespace nextn {

// FP8 Linear q [out, in] dequantized into `buf`, which the returned Linear points into (keep buf alive and
// unmoved): BF16 when every value is exactly representable in it, else F32; q's bias is kept. `bad` counts
// the NaN / inf among the values (from a weight or a block scale).
Linear dequantized(const Linear& q, std::vector<uint8_t>& buf, NonFiniteCount& bad);

}  // namespace nextn
