// Device helpers shared by the kernel files of ops/cuda (cuda_nn.cu, cuda_recurrent.cu, cuda_sparse_attention.cu):
// block reductions in a fixed tree, the norms' row statistics, float keys for selections, and the paged caches'
// slot lookup. Included by the .cu files only, after launch.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <cstdint>

#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/device_weight.cuh"

namespace nextn::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) { return unsigned((n + threads - 1) / threads); }

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// The sum of v over the block (kThreads threads), the same tree whatever the caller; every thread gets it.
template <typename T, typename Op>
__device__ __forceinline__ T block_all(T v, Op op) {
  using Reduce = cub::BlockReduce<T, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ T result;
  const T r = Reduce(tmp).Reduce(v, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  const T out = result;
  __syncthreads();
  return out;
}

// The sum of v over the warp, the same tree for every warp.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// The norms' statistics over a row's first d elements, each thread's elements in order then the block's tree:
// every kernel that normalizes a row (alone, or fused with what follows) takes them from here.
//
// A thread folds its elements k = threadIdx.x, + kThreads, ... in that order, kLoadsAhead loads issued before
// they are used: a decode row is one block's work, and with one load in flight a thread a 8192-wide row's
// statistics took a chain of 32 memory latencies (hc_pre ran 7-8 us at batch 1). The order of the operations
// is the loop's, so the bits are.
constexpr int kLoadsAhead = 8;
template <typename Step>
__device__ __forceinline__ float strided_fold(const float* xr, int64_t d, float s, Step step) {
  int64_t k = threadIdx.x;
  for (; k + (kLoadsAhead - 1) * kThreads < d; k += kLoadsAhead * kThreads) {
    float v[kLoadsAhead];
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) v[u] = xr[k + u * kThreads];
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) s = step(s, v[u]);
  }
  for (; k < d; k += kThreads) s = step(s, xr[k]);
  return s;
}
__device__ __forceinline__ float rms_inv(const float* xr, int64_t d, float eps) {
  const float s = strided_fold(xr, d, 0.f, [](float acc, float v) { return fmaf(v, v, acc); });
  return 1.0f / sqrtf(block_all(s, SumOp()) / float(d) + eps);
}

// An int key per float with the same order (-0 and +0 equal), as the CPU's top-k.
__device__ __forceinline__ int order_key(float f) {
  f = f + 0.0f;
  const int b = __float_as_int(f);
  return b ^ ((b >> 31) & 0x7fffffff);
}

// RoPE ("rotate half") of the pair (a, b) = (v[i], v[i + half]) at a position: cos/sin of inv_freq[i] · position
// times the attention factor.
__device__ __forceinline__ void rope_pair(float a, float b, float inv_freq_i, int32_t position, float af, float* lo,
                                          float* hi) {
  const float f = inv_freq_i * float(position);
  const float c = cosf(f) * af, s = sinf(f) * af;
  *lo = a * c - b * s;
  *hi = b * c + a * s;
}

__device__ __forceinline__ int64_t physical(const RowCaches& rc, int span, int64_t slot) {
  const int64_t pt = rc.page_tokens[span];
  return int64_t(rc.tables[rc.table_offset[span] + slot / pt]) * pt + slot % pt;
}

// Dynamic shared memory above the 48 KB a launch may take unasked: raised once per kernel, to what it needs.
template <typename Kernel>
void allow_smem(Kernel k, size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
}

}  // namespace
}  // namespace nextn::cuda
