// Internal interface between the matmul entry points (matmul.cpp: validation, threading) and the SIMD
// kernels (matmul_hwy.cpp: one Highway source compiled for every ISA target, chosen at run time).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "ops/ops.h"

namespace nextn::matmul_kernels {

// A validated weight with its defaults resolved.
struct Weight {
  DType dtype = DType::F32;
  int64_t N = 0, K = 0;              // rows (outputs), columns (reduction length)
  const unsigned char* data = nullptr;
  int64_t row_stride = 0;            // elements between rows
  // FP8 only
  const unsigned char* scale = nullptr;
  DType scale_dtype = DType::F32;
  int64_t block_out = 128, block_in = 128, scale_cols = 0, scale_row0 = 0;
  // FP8 blocks the SIMD decoder cannot take exactly (block_in not a multiple of 16, or a finite scale
  // s with |s| >= 2^120, see DecFP8): such weights are dequantized with the scalar table instead. A property of
  // the weight alone, so every call on it takes the same route.
  bool fp8_table = false;
  const float* bias = nullptr;
};

// One call's share of y[M, N] = x[M, K] · Wᵀ (+ bias): output columns [n0, n1) of every row.
struct Job {
  const float* x = nullptr;
  int64_t M = 0, x_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  const Weight* w = nullptr;
  int64_t n0 = 0, n1 = 0;
  // Rows below this may be prefetched (0: n1). A job cut into pieces (FP8 scale-block rows) lets each piece
  // prefetch into the next, so the weight stream does not stall at every piece boundary.
  int64_t prefetch_end = 0;
};

void matmul_cols(const Job& job);

// How decode-sized FP8 matmuls (M <= 16) turn e4m3 into f32 (matmul_hwy.cpp, DecFP8Raw and DecFP8Bits):
// through f16 and the hardware's conversion, or by moving the bit fields into f32 (e4m3 subnormals become
// f32 subnormals). Both give every product the same value, so the results are the same bits; only the speed
// differs with the CPU (AMD Zen converts f16 at half the rate Intel does; Intel cores may take microcode
// assists on subnormal inputs). kAuto: measured once per SIMD target at first use.
enum class Fp8Decode : int { kAuto = 0, kF16 = 1, kBits = 2 };
void set_fp8_decode(Fp8Decode how);  // (NEXTN_FP8_DECODE; tests and benchmarks)
Fp8Decode fp8_decode_setting();
// The route the active target takes now: "bits" or "f16" (measuring it first under kAuto).
const char* active_fp8_decode_name();
// out[K] = row r of w in fp32 (the exact values the matmul multiplies by).
void dequant_row(const Weight& w, int64_t r, float* out);
// y[m, K] += Σ_r x[m, r] · w[r, :] for m < M (rows of x and y at the given strides).
void matmul_transposed(const float* x, int64_t M, int64_t x_stride, const Weight& w, float* y, int64_t y_stride);

// The Highway target the kernels dispatch to now (e.g. "AVX3", "AVX2", "SCALAR") and the mask of targets
// compiled into them (HWY_TARGETS of matmul_hwy.cpp), for tests and benchmarks.
const char* active_target_name();
int64_t compiled_targets();

inline float load_scale(const Weight& w, int64_t idx) {
  switch (w.scale_dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, w.scale + idx * 4, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t v;
      std::memcpy(&v, w.scale + idx * 2, 2);
      return bf16_to_f32(v);
    }
    default:  // F8_E8M0
      return e8m0_to_f32(w.scale[idx]);
  }
}

// Scale of row n, k block b.
inline float scale_of(const Weight& w, int64_t n, int64_t b) {
  return load_scale(w, ((w.scale_row0 + n) / w.block_out) * w.scale_cols + b);
}

}  // namespace nextn::matmul_kernels
