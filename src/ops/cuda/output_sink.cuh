// Device side of cuda::OutputSink (cuda_ops.h): how a kernel stores an output value when a residual update
// follows it. Included by the .cu files only.
#pragma once
#include <cstdint>

#include "ops/cuda/cuda_ops.h"

namespace nextn::cuda {

// The sink of rows r0.. (a kernel's row chunk, whose y pointer is shifted likewise).
__device__ __forceinline__ OutputSink rows_from(OutputSink s, int64_t r0) {
  if (s.streams) {
    s.streams += r0 * s.C * s.H;
    s.post += r0 * s.C;
  }
  return s;
}

// y[m, n] = v (or y[m, n] + v), then the streams' post update, each as its separate op computes it.
__device__ __forceinline__ void store_out(const OutputSink& s, float* y, int64_t ys, int64_t m, int64_t n, float v) {
  float* out = y + m * ys + n;
  const float value = s.accumulate ? *out + v : v;
  *out = value;
  if (s.streams)
    for (int64_t j = 0; j < s.C; ++j) {
      float* stream = s.streams + (m * s.C + j) * s.H + n;
      *stream = s.post[m * s.C + j] * value + *stream;
    }
}

}  // namespace nextn::cuda
