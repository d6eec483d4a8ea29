// Weight bytes a SwiGLU MLP (or one expert) reads: its gate, up and down matrices as stored.
#pragma once
#include <cstddef>

#include "ops/ops.h"

namespace nextn {

inline size_t swiglu_bytes(const Linear& gate, const Linear& up, const Linear& down) {
  return gate.weight_bytes() + up.weight_bytes() + down.weight_bytes();
}

}  // namespace nextn
