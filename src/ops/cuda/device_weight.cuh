// What the CUDA kernels share about weights on the device: the descriptor a kernel takes (a Linear with
// device pointers), and decoding one element as the CPU dequantizes it (FP8: the e4m3 value times its block
// scale). Included by the .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/ops.h"

namespace nextn::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

size_t elem_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::F8_E8M0: return 1;
    default: return 0;
  }
}

enum class WeightKind { kF32, kBF16, kFP8 };

struct DeviceWeight {
  const unsigned char* data;
  int64_t out, in, row_stride;  // elements
  const unsigned char* scale;
  int scale_kind;               // 0 f32, 1 bf16, 2 e8m0
  int64_t block_out, block_in, scale_cols, scale_row0;
  const float* bias;
  int64_t elem_bytes;          // of data's elements
  int64_t prefetch_row_bytes;  // of each row a kernel asks L2 for before its inputs are ready (launch.cuh)
};


__device__ __forceinline__ float bf16_bits_to_f32(unsigned short v) { return __uint_as_float(unsigned(v) << 16); }

// Bytes of one of w's FP8 block scales (scale_kind 0 f32, 1 bf16, 2 e8m0).
__host__ __device__ __forceinline__ int scale_bytes(const DeviceWeight& w) {
  return w.scale_kind == 0 ? 4 : w.scale_kind == 1 ? 2 : 1;
}
// The scales of row block b (weight rows [b · block_out - scale_row0, ...)), scale_bytes(w) each.
__device__ __forceinline__ const unsigned char* scale_block_row(const DeviceWeight& w, int64_t b, int scale_bytes) {
  return w.scale + b * w.scale_cols * scale_bytes;
}
// The scale row of weight row n (computed once per row: 64-bit divisions cost more than the loads).
__device__ __forceinline__ const unsigned char* scale_row(const DeviceWeight& w, int64_t n, int scale_bytes) {
  return w.scale + ((w.scale_row0 + n) / w.block_out) * w.scale_cols * scale_bytes;
}

__device__ __forceinline__ float scale_value(const unsigned char* row, int kind, unsigned col) {
  switch (kind) {
    case 0: return reinterpret_cast<const float*>(row)[col];
    case 1: return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(row)[col]);
    default: {
      const unsigned char e = row[col];
      if (e == 0xff) return __int_as_float(0x7fc00000);
      return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e) << 23);  // 2^(e - 127)
    }
  }
}

// The e4m3 pair in the low 16 bits of `pair` as two f16 (exact: every e4m3 value is one).
__device__ __forceinline__ __half2_raw fp8x2_to_half2(unsigned pair) {
  return __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
}

__device__ __forceinline__ float fp8_to_f32(unsigned char v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// One element of row n (the scalar path: tails, and layouts the vector loads cannot take).
template <WeightKind K>
__device__ __forceinline__ float weight_at(const DeviceWeight& w, const unsigned char* srow, int64_t n, int64_t k) {
  const int64_t i = n * w.row_stride + k;
  if constexpr (K == WeightKind::kF32) return reinterpret_cast<const float*>(w.data)[i];
  if constexpr (K == WeightKind::kBF16) return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(w.data)[i]);
  if constexpr (K == WeightKind::kFP8) return fp8_to_f32(w.data[i]) * scale_value(srow, w.scale_kind, unsigned(k / w.block_in));
}

// Whether every row of w (elements of es bytes) starts 16-byte aligned: its data and its row stride are.
inline bool rows_16_byte_aligned(const Linear& w, int64_t es) {
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && (w.row_stride * es) % 16 == 0;
}

// How much of each row of w a kernel prefetches into L2 while its predecessor runs: all of it when the
// whole matrix fits kL2PrefetchBudget (under half the H100/H200's 50 MB L2, so that the prefetch does not
// evict what the running kernel reads), else that budget spread over the rows (the kernels read each row
// from its start); none when the rows are not 16-byte aligned. NEXTN_CUDA_PREFETCH=0 turns it off.
constexpr int64_t kL2PrefetchBudget = 24ll << 20;

inline int64_t prefetch_row_bytes(const Linear& w, int64_t es) {
  static const bool off = [] {
    const char* e = std::getenv("NEXTN_CUDA_PREFETCH");
    return e && std::string(e) == "0";
  }();
  const int64_t row = w.in * es;
  if (off || es == 0 || w.out <= 0 || !rows_16_byte_aligned(w, es)) return 0;
  const int64_t per_row = w.out * row <= kL2PrefetchBudget ? row : kL2PrefetchBudget / w.out;
  return per_row & ~int64_t(15);
}

// The kernels' descriptor of w (its pointers already on the device).
inline DeviceWeight device_weight(const Linear& w) {
  const int64_t es = int64_t(elem_size(w.dtype));
  return DeviceWeight{static_cast<const unsigned char*>(w.data), w.out, w.in, w.row_stride,
                      static_cast<const unsigned char*>(w.scale),
                      w.scale_dtype == DType::F32 ? 0 : w.scale_dtype == DType::BF16 ? 1 : 2,
                      w.block_out, w.block_in, w.scale_cols, w.scale_row0, w.bias, es,
                      prefetch_row_bytes(w, es)};
}

}  // namespace
}  // namespace nextn::cuda
