// CUDA kernels behind cuda_sparse_attention.h. Compiled with --fmad=false like the other kernel files.
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_sparse_attention.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace nextn::cuda {
namespace {

constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float* plane_row(const RowCaches& rc, int span, int plane, int64_t slot, int64_t width) {
  return rc.planes[span][plane] + physical(rc, span, slot) * width;
}

// Block r: the pooled key of the block its slot completes (if any), in columns [dim, 2·dim) of the block's first
// slot: mean of the raw keys (slots ascending), RMSNorm, RoPE at the block's first position.
__global__ void pool_block_keys_kernel(RowCaches rc, int plane, int64_t dim, int64_t ratio, const float* norm,
                                       float eps, int64_t half, const float* inv_freq, float af,
                                       const int32_t* block_position) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x, s = rc.slot[r];
  if ((s + 1) % ratio != 0) return;
  const int span = rc.span[r];
  const int64_t first = s + 1 - ratio;
  float* dst = plane_row(rc, span, plane, first, 2 * dim) + dim;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    float acc = 0.0f;
    for (int64_t t = first; t <= s; ++t) acc += plane_row(rc, span, plane, t, 2 * dim)[d];
    dst[d] = acc / float(ratio);
  }
  __syncthreads();
  const float inv = rms_inv(dst, dim, eps);  // (its block_all orders the reads before the writes below)
  const int32_t position = block_position[r];
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    const float lo = dst[i] * inv * norm[i], hi = dst[i + half] * inv * norm[i + half];
    rope_pair(lo, hi, inv_freq[i], position, af, &dst[i], &dst[i + half]);
  }
  for (int64_t d = 2 * half + threadIdx.x; d < dim; d += kThreads) dst[d] = dst[d] * inv * norm[d];
}

// Block (r, chunk): warp w scores block b = chunk · kWarps + w of row r.
__global__ void __launch_bounds__(kThreads)
block_scores_kernel(const float* q, int64_t qs, int64_t heads, int64_t dim, RowCaches rc, int plane, int64_t ratio,
                    float scale, float* out, int64_t os) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x, lane = threadIdx.x & 31;
  const int64_t b = int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (b >= (int64_t(rc.slot[r]) + 1) / ratio) return;
  const float* key = plane_row(rc, rc.span[r], plane, b * ratio, 2 * dim) + dim;
  float total = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + r * qs + h * dim;
    float part = 0.0f;
    for (int64_t d = lane; d < dim; d += 32) part += qh[d] * key[d];
    const float dot = warp_sum(part);
    total += dot > 0.0f ? dot : 0.0f;
  }
  if (lane == 0) out[r * os + b] = total * scale;
}

__global__ void expand_selection_kernel(RowCaches rc, int64_t ratio, const int32_t* blocks, const int32_t* block_count,
                                        int64_t bs, const int32_t* forced, const int32_t* forced_count,
                                        const int32_t* forced_from, int64_t fs, int32_t* sel, int32_t* count,
                                        int64_t ss) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x, s = rc.slot[r];
  int32_t* out = sel + r * ss;
  if (forced && forced_count[r] >= 0) {  // (a few hundred slots at most: one thread)
    if (threadIdx.x != 0) return;
    const int64_t from = forced_from[r];
    int64_t n = 0;
    for (int64_t j = 0; j < forced_count[r] && n < ss; ++j) {
      const int32_t v = forced[r * fs + j];
      if (v <= s && v < from) out[n++] = v;
    }
    for (int64_t t = from; t <= s && n < ss; ++t) out[n++] = int32_t(t);
    count[r] = int32_t(n);
    return;
  }
  const int64_t kept = block_count[r] * ratio, nb = (s + 1) / ratio, n = min(kept + (s + 1 - nb * ratio), ss);
  for (int64_t j = threadIdx.x; j < n; j += kThreads)
    out[j] = int32_t(j < kept ? blocks[r * bs + j / ratio] * ratio + j % ratio : nb * ratio + (j - kept));
  if (threadIdx.x == 0) count[r] = int32_t(n);
}

// Block (r, h): scores (a warp per slot), the softmax, then o (a thread per element) over the slots in order.
__global__ void __launch_bounds__(kThreads)
sparse_gqa_kernel(const float* q, int64_t heads, int64_t kv_heads, int64_t hd, RowCaches rc, int plane,
                  const int32_t* sel, const int32_t* count, int64_t ss, float scale, float* out) {
  extern __shared__ float smem[];
  float* p = smem;                                    // [ss]
  int64_t* rows = reinterpret_cast<int64_t*>(p + ss + (ss & 1));  // [ss] physical rows (8-byte aligned)
  begin_after_predecessor();
  const int64_t r = blockIdx.x, h = blockIdx.y, g = h / (heads / kv_heads), lane = threadIdx.x & 31;
  const int span = rc.span[r];
  const int64_t n = count[r], width = 2 * kv_heads * hd;
  const float* base = rc.planes[span][plane];
  const float* qh = q + (r * heads + h) * 2 * hd;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) rows[j] = physical(rc, span, sel[r * ss + j]);
  __syncthreads();
  for (int64_t j = threadIdx.x >> 5; j < n; j += kWarps) {
    const float* k = base + rows[j] * width + g * hd;
    float part = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) part += qh[d] * k[d];
    const float dot = warp_sum(part);
    if (lane == 0) p[j] = dot;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, p[j] * scale);
  m = block_all(m, MaxOp());
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    p[j] = expf(p[j] * scale - m);
    sum += p[j];
  }
  const float inv = 1.0f / block_all(sum, SumOp());  // (its barriers also publish p)
  for (int64_t d = threadIdx.x; d < hd; d += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += (p[j] * inv) * base[rows[j] * width + kv_heads * hd + g * hd + d];
    out[(r * heads + h) * hd + d] = acc * sigmoidf(qh[hd + d]);
  }
}

}  // namespace

void pool_block_keys(const RowCaches& rc, int plane, int64_t rows, int64_t dim, int64_t ratio, const float* norm,
                     float eps, int64_t rope_dim, const float* inv_freq, float attention_factor,
                     const int32_t* block_position) {
  if (rows <= 0 || ratio <= 0) return;
  launch_kernel(pool_block_keys_kernel, unsigned(rows), kThreads, 0, "pool_block_keys_kernel", rc, plane, dim, ratio,
                norm, eps, rope_dim / 2, inv_freq, attention_factor, block_position);
}

void block_scores(const float* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t dim, const RowCaches& rc,
                  int plane, int64_t ratio, int64_t max_blocks, float scale, float* out, int64_t out_stride) {
  if (rows <= 0 || max_blocks <= 0) return;
  launch_kernel(block_scores_kernel, dim3(unsigned(rows), blocks_for(max_blocks, kWarps)), kThreads, 0,
                "block_scores_kernel", q, q_stride, heads, dim, rc, plane, ratio, scale, out, out_stride);
}

void expand_selection(const RowCaches& rc, int64_t rows, int64_t ratio, const int32_t* blocks,
                      const int32_t* block_count, int64_t blocks_stride, const int32_t* forced,
                      const int32_t* forced_count, const int32_t* forced_from, int64_t forced_stride, int32_t* sel,
                      int32_t* count, int64_t sel_stride) {
  if (rows <= 0) return;
  launch_kernel(expand_selection_kernel, unsigned(rows), kThreads, 0, "expand_selection_kernel", rc, ratio, blocks,
                block_count, blocks_stride, forced, forced_count, forced_from, forced_stride, sel, count, sel_stride);
}

void sparse_gqa_attention(const float* q, int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd,
                          const RowCaches& rc, int plane, const int32_t* sel, const int32_t* count,
                          int64_t sel_stride, float scale, float* out) {
  if (rows <= 0 || heads <= 0) return;
  if (kv_heads <= 0 || heads % kv_heads != 0)
    throw Error("cuda: " + std::to_string(heads) + " attention heads over " + std::to_string(kv_heads) + " KV heads");
  const size_t smem = size_t(sel_stride + (sel_stride & 1)) * sizeof(float) + size_t(sel_stride) * sizeof(int64_t);
  if (smem > 227 * 1024) throw Error("cuda: a sparse attention selection of " + std::to_string(sel_stride) + " slots");
  allow_smem(sparse_gqa_kernel, smem, "sparse attention: shared memory");
  launch_kernel(sparse_gqa_kernel, dim3(unsigned(rows), unsigned(heads)), kThreads, smem, "sparse_gqa_kernel", q,
                heads, kv_heads, hd, rc, plane, sel, count, sel_stride, scale, out);
}

}  // namespace nextn::cuda
