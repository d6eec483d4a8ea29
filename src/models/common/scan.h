// NaN and inf in a checkpoint's stored tensors, found by reading every value (`nextn inspect --scan`).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace nextn {

// A tensor holding NaN or inf (for its dtype: f32 / f64 / bf16 / f16 exponent all ones, e4m3 0x7f / 0xff,
// e8m0 and ue8m0 (U8) scales 0xff).
struct NonFiniteTensor {
  std::string name, file, dtype;
  int64_t count = 0;  // values that are NaN or inf
  int64_t first = -1;  // flat index of the first
};

// Reads every value of every float tensor in `store` (and of U8 block scales, read as ue8m0) and lists the
// tensors with non-finite values, in name order. Reads the whole checkpoint.
std::vector<NonFiniteTensor> scan_non_finite(const WeightStore& store);

// Reads every weight of `store` once, so that the first token does not pay for page faults, and throws
// nextn::Error naming the first tensor that holds a NaN or inf (by its stored dtype); with `progress` and a
// terminal on stderr, large checkpoints show a progress bar. `dir` names the checkpoint in the message.
void prefault_weights(const WeightStore& store, const std::string& dir, bool progress);

}  // namespace nextn
