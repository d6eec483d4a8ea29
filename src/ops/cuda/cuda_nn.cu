// CUDA kernels behind cuda_nn.h. Compiled with --fmad=false like cuda_ops.cu: every fused multiply-add is
// written out, so that no contraction can round one row differently from another. A kernel gives each row
// (or (row, head) pair) blocks of its own, split by the model's shapes or the row's own sizes only, and
// reductions run in a fixed tree: the launch shape never changes a row's value.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/device_weight.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/output_sink.cuh"

namespace nextn::cuda {

namespace {

namespace cg = cooperative_groups;


// One element of w, decoded as the CPU dequantizes it.
__device__ __forceinline__ float weight_elem(const DeviceWeight& w, int kind, int64_t n, int64_t k) {
  switch (kind) {
    case 0: return weight_at<WeightKind::kF32>(w, nullptr, n, k);
    case 1: return weight_at<WeightKind::kBF16>(w, nullptr, n, k);
    default: return weight_at<WeightKind::kFP8>(w, scale_row(w, n, scale_bytes(w)), n, k);
  }
}

int weight_kind(const Linear& w) {
  switch (w.dtype) {
    case DType::F32: return 0;
    case DType::BF16: return 1;
    case DType::F8_E4M3: return 2;
    default: throw Error(std::string("cuda: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  }
}

// ---- copies and elementwise --------------------------------------------------------------------------------

__global__ void copy_cols_kernel(const float* src, int64_t cols, int64_t ss, float* dst, int64_t ds) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[r * ds + c] = src[r * ss + c];
}

__global__ void gather_rows_kernel(const float* src, int64_t width, const int32_t* idx, float* dst) {
  begin_after_predecessor();
  const int64_t i = blockIdx.x, from = idx[i];
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[i * width + c] = src[from * width + c];
}

__global__ void add_kernel(float* a, const float* b, int64_t n) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) a[i] = a[i] + b[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float limit, float* out) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = gate[i], u = up[i];
  if (limit > 0) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  out[i] = g * sigmoidf(g) * u;
}

__global__ void mul_sigmoid_kernel(const float* x, const float* g, int64_t n, float* out) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * sigmoidf(g[i]);
}

__global__ void scale_kernel(float* x, int64_t n, float a, float b) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a * b;
}

__global__ void zero_kernel(unsigned char* x, int64_t n) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 0;
}

__global__ void map_kernel(float* x, int64_t n, Map f, float d) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i] / d;
  x[i] = f == Map::kSiluOf ? v / (1.0f + expf(-v)) : 2.0f * sigmoidf(v);
}

__global__ void scale_rows_sigmoid_kernel(float* x, const float* g, int64_t d) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  const float gate = sigmoidf(g[r]);
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) x[r * d + k] = gate * x[r * d + k];
}

// ---- multi-stream mixes ------------------------------------------------------------------------------------

__global__ void stream_mean_kernel(const float* w, int64_t C, int64_t H, float* x) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  for (int64_t h = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; h < H; h += int64_t(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    for (int64_t c = 0; c < C; ++c) acc += w[(r * C + c) * H + h];
    x[r * H + h] = acc / float(C);
  }
}

// Block (r, c): the stream's gate from the dot of its key and query, then its copy of the value row.
__global__ void stream_gates_kernel(const float* key, const float* query, const float* value, int64_t C, int64_t H,
                                    float* out) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x, c = blockIdx.y, at = (r * C + c) * H;
  float part = 0.0f;
  for (int64_t h = threadIdx.x; h < H; h += kThreads) part += key[at + h] * query[at + h];
  const float g = block_all(part, SumOp()) / sqrtf(float(H));
  const float mag = sqrtf(fmaxf(fabsf(g), 1e-6f));
  const float gate = sigmoidf(g > 0.0f ? mag : g < 0.0f ? -mag : 0.0f);
  for (int64_t h = threadIdx.x; h < H; h += kThreads) out[at + h] = gate * value[r * H + h];
}

// ---- norms -------------------------------------------------------------------------------------------------

// The elements [begin, end) of gridDim.y equal slices of n, slice blockIdx.y: a row's blocks each sum the whole
// row (the same tree, so the same bits) and write their slice, so that a wide row is not one SM's work.
struct Slice {
  int64_t begin, end;
};
__device__ __forceinline__ Slice block_slice(int64_t n) {
  const int64_t per = (n + gridDim.y - 1) / gridDim.y, begin = per * blockIdx.y;
  return {begin, begin + per < n ? begin + per : n};
}

// Slices for rows of n elements: one per 1024 (at most 8), a single one where the output overwrites the input
// (its blocks would read elements another block has written).
unsigned row_slices(int64_t n, bool in_place) {
  return in_place ? 1u : unsigned(std::clamp<int64_t>(n / 1024, 1, 8));
}
bool overlaps(const float* a, int64_t a_len, const float* b, int64_t b_len) { return a < b + b_len && b < a + a_len; }

struct MeanInv {
  float mean, inv;
};
__device__ __forceinline__ MeanInv layer_norm_stats(const float* xr, int64_t d, float eps) {
  const float s = strided_fold(xr, d, 0.f, [](float acc, float v) { return acc + v; });
  const float mean = block_all(s, SumOp()) / float(d);
  const float v = strided_fold(xr, d, 0.f, [mean](float acc, float x) { return acc + (x - mean) * (x - mean); });
  return {mean, 1.0f / sqrtf(block_all(v, SumOp()) / float(d) + eps)};
}
__device__ __forceinline__ float rms_scaled(float x, float inv, bool weighted, float w) {
  return weighted ? x * inv * w : x * inv;
}
__device__ __forceinline__ float rms_normed(float x, float inv, const float* weight, int64_t k) {
  return rms_scaled(x, inv, weight != nullptr, weight ? weight[k] : 0.f);
}

// A norm's weight is no kernel's output, so a kernel reads it before begin_after_predecessor: read after the
// statistics, hc_pre's last loop waited on DRAM for it (the step's weights had evicted it from L2; a fifth of
// the kernel's warp-state samples). A thread's first kHeldWeights elements of its block's slice,
// k = begin + threadIdx.x + u · kThreads, are held in registers, the rest of the slice asked of L2.
constexpr int kHeldWeights = 4;
// n floats from p asked of L2, a 128-byte line a thread of the block (a hint: nothing waits for it).
__device__ __forceinline__ void prefetch_lines_l2(const float* p, int64_t n) {
  if (!p) return;
  for (int64_t i = int64_t(threadIdx.x) * 32; i < n; i += int64_t(blockDim.x) * 32)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + i));
}
struct HeldWeights {
  float v[kHeldWeights];
};
__device__ __forceinline__ HeldWeights hold_weights(const float* weight, Slice sl) {
  HeldWeights h;
#pragma unroll
  for (int u = 0; u < kHeldWeights; ++u) {
    const int64_t k = sl.begin + threadIdx.x + int64_t(u) * kThreads;
    h.v[u] = weight && k < sl.end ? weight[k] : 0.f;
  }
  const int64_t rest = sl.begin + int64_t(kHeldWeights) * kThreads;
  if (weight && rest < sl.end) prefetch_lines_l2(weight + rest, sl.end - rest);
  return h;
}
// f(k, weight[k]) for the thread's elements of the slice, the held ones first (no order matters: each element
// is its own).
template <typename F>
__device__ __forceinline__ void for_slice(Slice sl, const HeldWeights& h, const float* weight, F f) {
#pragma unroll
  for (int u = 0; u < kHeldWeights; ++u) {
    const int64_t k = sl.begin + threadIdx.x + int64_t(u) * kThreads;
    if (k < sl.end) f(k, h.v[u]);
  }
  for (int64_t k = sl.begin + threadIdx.x + int64_t(kHeldWeights) * kThreads; k < sl.end; k += kThreads)
    f(k, weight ? weight[k] : 0.f);
}
__device__ __forceinline__ float layer_normed(float x, MeanInv st, const float* weight, const float* bias, int64_t k) {
  return (x - st.mean) * st.inv * weight[k] + bias[k];
}

__global__ void rms_norm_rows_kernel(const float* x, int64_t d, int64_t xs, const float* weight, float eps, float* out,
                                     int64_t os) {
  const Slice sl = block_slice(d);
  const HeldWeights held = hold_weights(weight, sl);
  begin_after_predecessor();
  const float* xr = x + int64_t(blockIdx.x) * xs;
  float* o = out + int64_t(blockIdx.x) * os;
  const float inv = rms_inv(xr, d, eps);
  for_slice(sl, held, weight, [&](int64_t k, float w) { o[k] = rms_scaled(xr[k], inv, weight != nullptr, w); });
}

// Block (r, j): group j of row r.
__global__ void rms_norm_groups_kernel(const float* x, int64_t d, int64_t rs, int64_t gs, const float* weight, int64_t ws,
                                       float eps, float* out) {
  const float* w = weight ? weight + int64_t(blockIdx.y) * ws : nullptr;
  begin_after_predecessor();
  const int64_t at = int64_t(blockIdx.x) * rs + int64_t(blockIdx.y) * gs;
  const float* xr = x + at;
  float* o = out + at;
  const float inv = rms_inv(xr, d, eps);  // (its block_all reads the row before any element is overwritten)
  for (int64_t k = threadIdx.x; k < d; k += kThreads) o[k] = rms_normed(xr[k], inv, w, k);
}

__global__ void layer_norm_rows_kernel(const float* x, int64_t d, const float* weight, const float* bias, float eps,
                                       float* out) {
  prefetch_lines_l2(weight, d);  // (weights: before the wait, as hold_weights)
  prefetch_lines_l2(bias, d);
  begin_after_predecessor();
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  const MeanInv st = layer_norm_stats(xr, d, eps);
  for (int64_t k = threadIdx.x; k < d; k += kThreads) o[k] = layer_normed(xr[k], st, weight, bias, k);
}

// ---- RoPE, embeddings, absorption ------------------------------------------------------------------------

__global__ void rope_rows_kernel(float* x, int64_t rs, int64_t hs, int64_t offset, int64_t half, const int32_t* pos,
                                 const float* inv_freq, float af) {
  prefetch_lines_l2(inv_freq, half);  // (weights: before the wait)
  begin_after_predecessor();
  const int64_t r = blockIdx.x, h = blockIdx.y;
  float* v = x + r * rs + h * hs + offset;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x)
    rope_pair(v[i], v[i + half], inv_freq[i], pos[r], af, &v[i], &v[i + half]);
}

__global__ void embed_rows_kernel(DeviceWeight w, int kind, const int32_t* ids, int copies, float* out, int64_t os) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x, id = ids[r];
  float* o = out + r * os;
  for (int64_t k = threadIdx.x; k < w.in; k += blockDim.x) {
    const float v = id < 0 ? 0.f : weight_elem(w, kind, id, k);
    for (int c = 0; c < copies; ++c) o[c * w.in + k] = v;
  }
}

// One weight element, decoded as weight_elem does, with the FP8 scale given (the callers keep it current).
template <int KIND>
__device__ __forceinline__ float decode(const DeviceWeight& w, int64_t i, float fp8_scale) {
  if constexpr (KIND == 0) return reinterpret_cast<const float*>(w.data)[i];
  if constexpr (KIND == 1) return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(w.data)[i]);
  if constexpr (KIND == 2) return fp8_to_f32(w.data[i]) * fp8_scale;
}

// 16 bytes of a weight row as E floats: convert16 decodes a loaded piece as decode<KIND> does (FP8 with the one
// scale s of its elements); decode_each takes E elements of row `row` from column c0 one at a time, each with its
// own column's scale (srow: the row's scales), zeros past the row: rows not 16-byte aligned, a row's last piece,
// pieces across two scale blocks. Both give an element the same value.
template <int KIND>
constexpr int kVecElems = KIND == 0 ? 4 : KIND == 1 ? 8 : 16;
template <int KIND>
__device__ __forceinline__ void convert16(uint4 q, float s, float (&v)[kVecElems<KIND>]) {
  const unsigned u[4] = {q.x, q.y, q.z, q.w};
  if constexpr (KIND == 2) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {  // (pair p: elements 2p and 2p + 1, the low byte first)
      const __half2_raw h = fp8x2_to_half2(u[p / 2] >> (16 * (p % 2)));
      v[2 * p] = __half2float(__half(__half_raw{h.x})) * s;
      v[2 * p + 1] = __half2float(__half(__half_raw{h.y})) * s;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVecElems<KIND>; ++e)
      v[e] = KIND == 0 ? __uint_as_float(u[e]) : bf16_bits_to_f32((u[e / 2] >> (16 * (e % 2))) & 0xffffu);
  }
}
template <int KIND>
__device__ __forceinline__ void decode_each(const DeviceWeight& w, const unsigned char* srow, int64_t row, int64_t c0,
                                            float (&v)[kVecElems<KIND>]) {
#pragma unroll
  for (int e = 0; e < kVecElems<KIND>; ++e) {
    const int64_t c = c0 + e;
    const float s = KIND == 2 && c < w.in ? scale_value(srow, w.scale_kind, unsigned(c / w.block_in)) : 1.0f;
    v[e] = c < w.in ? decode<KIND>(w, row * w.row_stride + c, s) : 0.f;
  }
}

// Block (column tile, h, row chunk z): lane l of warp g takes the tile's 16-byte column piece l (E columns) down
// rows g, g + kTrWarps, ... of head h, for the chunk's MT rows of x at once (each weight piece read once), each of
// its sums in row order; then the warps' sums are added in warp order. Neither E, MT nor the batching of the
// loads changes a sum (only kTrWarps would): M = 1 and M > 1 launches give a row the same bits. A thread a column,
// reading a byte a row (FP8), made this one of a decode step's slowest kernels.
constexpr int kTrWarps = 16;
template <int KIND, int MT>
__global__ void __launch_bounds__(kTrWarps * 32)
    matmul_transposed_heads_kernel(const float* x, int64_t M, int64_t xs, int64_t xh, DeviceWeight w, int64_t row0,
                                   int64_t hrs, int64_t rows, float* y, int64_t ys, int64_t yh, int64_t tail,
                                   bool vec) {
  constexpr int E = kVecElems<KIND>, kTile = 32 * E, kBatch = 8 / MT;  // (kBatch rows' loads in flight)
  __shared__ float part[kTrWarps][kTile];  // [warp][e · 32 + lane], one row of x at a time
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t tile0 = int64_t(blockIdx.x) * kTile, c0 = tile0 + int64_t(lane) * E, h = blockIdx.y;
  const int64_t m0 = int64_t(blockIdx.z) * MT, nm = M - m0 < MT ? M - m0 : MT;
  const int64_t first = row0 + h * hrs;
  if (blockIdx.z == 0) {  // the tile's lines of the head's rows (weights: before the wait)
    constexpr int kLines = kTile * (KIND == 0 ? 4 : KIND == 1 ? 2 : 1) / 128;
    for (int64_t i = threadIdx.x; i < rows * kLines; i += blockDim.x) {
      const int64_t byte = (tile0 + (i % kLines) * (128 / w.elem_bytes)) * w.elem_bytes;
      if (byte < w.in * w.elem_bytes)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w.data + (first + i / kLines) * w.row_stride * w.elem_bytes + byte));
    }
  }
  begin_after_predecessor();
  const float* xr = x + m0 * xs + h * xh;  // row m0 + i at xr + i · xs
  if (blockIdx.x == 0)  // x's elements past the summed rows, passed through after y's columns
    for (int64_t i = 0; i < nm; ++i)
      for (int64_t t = threadIdx.x; t < tail; t += blockDim.x) y[(m0 + i) * ys + h * yh + w.in + t] = xr[i * xs + rows + t];
  float acc[MT][E] = {};
  auto add = [&](const float (&wv)[E], const float (&xv)[MT]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[i][e] = fmaf(wv[e], xv[i], acc[i][e]);
  };
  auto x_at = [&](int64_t r, float (&xv)[MT]) {
#pragma unroll
    for (int i = 0; i < MT; ++i) xv[i] = MT == 1 || i < nm ? xr[i * xs + r] : 0.f;  // (MT = 1: nm is 1)
  };
  const int sb = scale_bytes(w);
  const bool one_scale = KIND != 2 || c0 / w.block_in == (c0 + E - 1) / w.block_in;
  if (c0 + E <= w.in && vec && one_scale && (KIND != 2 || w.block_out > kTrWarps)) {
    // kBatch rows' pieces, x values and scales loaded, then used: the scale block of row first + r followed
    // as r steps by kTrWarps (block_out > kTrWarps: one step at most), no division per row
    int64_t sblock = KIND == 2 ? (w.scale_row0 + first + g) / w.block_out : 0;
    int64_t soff = KIND == 2 ? (w.scale_row0 + first + g) % w.block_out : 0;
    const unsigned scol = KIND == 2 ? unsigned(c0 / w.block_in) : 0u;
    for (int64_t r0 = g; r0 < rows; r0 += int64_t(kTrWarps) * kBatch) {
      uint4 raw[kBatch];
      float xv[kBatch][MT], sc[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = r0 + int64_t(b) * kTrWarps;
        if (r < rows) {
          raw[b] = *reinterpret_cast<const uint4*>(w.data + ((first + r) * w.row_stride + c0) * w.elem_bytes);
          x_at(r, xv[b]);
          sc[b] = KIND == 2 ? scale_value(scale_block_row(w, sblock, sb), w.scale_kind, scol) : 1.0f;
          if (KIND == 2 && (soff += kTrWarps) >= w.block_out) soff -= w.block_out, ++sblock;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (r0 + int64_t(b) * kTrWarps < rows) {
          float wv[E];
          convert16<KIND>(raw[b], sc[b], wv);
          add(wv, xv[b]);
        }
    }
  } else if (c0 < w.in) {
    for (int64_t r = g; r < rows; r += kTrWarps) {
      const int64_t row = first + r;
      float wv[E], xv[MT];
      decode_each<KIND>(w, KIND == 2 ? scale_row(w, row, sb) : nullptr, row, c0, wv);
      x_at(r, xv);
      add(wv, xv);
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i >= nm) break;
    if (i > 0) __syncthreads();  // (the last row's sums read)
#pragma unroll
    for (int e = 0; e < E; ++e) part[g][e * 32 + lane] = acc[i][e];
    __syncthreads();
    for (int t = threadIdx.x; t < kTile; t += blockDim.x) {
      const int64_t c = tile0 + t;
      if (c >= w.in) break;
      const int pos = (t % E) * 32 + t / E;
      float sum = part[0][pos];
#pragma unroll
      for (int gg = 1; gg < kTrWarps; ++gg) sum += part[gg][pos];
      y[(m0 + i) * ys + h * yh + c] = sum;
    }
  }
}

// ---- iHC ---------------------------------------------------------------------------------------------------

constexpr int kMaxStreams = 64;
constexpr int kMaxMixes = 2 * kMaxStreams;

// The mixer's products were one matmul of a few long columns (8 x 28672 f32 at hidden 7168: 0.9 MB read by 8
// blocks, 10 us a call), and the pre-mix's row statistics one block's chain over the whole C · H row (15 us):
// both latency-bound on a handful of SMs. Now a row's C · H elements are cut into slices of kMixSlice, a block
// each, that leave their products and sum of squares as partials; the mix's blocks add them up.
constexpr int64_t kMixSlice = 4 * kThreads;  // (4 consecutive elements a thread)
constexpr int kHeldMixes = 8;                // mixer columns whose weights a thread loads before the wait

int64_t mix_slices(int64_t width) { return (width + kMixSlice - 1) / kMixSlice; }

// Weights [k, k + 4) of row n of w (zeros past w.in).
template <WeightKind K>
__device__ __forceinline__ void weights4(const DeviceWeight& w, int64_t n, int64_t k, float (&v)[4]) {
  const unsigned char* srow = K == WeightKind::kFP8 ? scale_row(w, n, scale_bytes(w)) : nullptr;
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = k + e < w.in ? weight_at<K>(w, srow, n, k + e) : 0.f;
}

// Block (slice s, row chunk): for each row r of the chunk, partials[r, s, j] = Σ_k fn[j, k] · streams[r, k] for
// j < n_mix and partials[r, s, n_mix] = Σ_k streams[r, k]², k over the slice; a thread's 4 elements in order,
// then the warp's tree, then the warps in order.
template <WeightKind K>
__global__ void __launch_bounds__(kThreads)
    hc_mix_partials_kernel(const float* streams, int64_t rows, int64_t width, DeviceWeight fn, int64_t rows_per_y,
                           float* partials) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float part[kWarps][kMaxMixes + 1];
  const int64_t n_mix = fn.out, slices = gridDim.x, k0 = int64_t(blockIdx.x) * kMixSlice + 4 * threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float held[kHeldMixes][4];  // (weights: before the wait)
#pragma unroll
  for (int j = 0; j < kHeldMixes; ++j)
    if (j < n_mix) weights4<K>(fn, j, k0, held[j]);
  begin_after_predecessor();
  const int64_t r_end = min(rows, int64_t(blockIdx.y + 1) * rows_per_y);
  for (int64_t r = int64_t(blockIdx.y) * rows_per_y; r < r_end; ++r) {
    const float* X = streams + r * width;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = k0 + e < width ? X[k0 + e] : 0.f;
    auto dot = [&](const float(&wv)[4]) {
      float acc = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc = fmaf(wv[e], v[e], acc);
      return warp_sum(acc);
    };
    const float ss = dot(v);
    if (lane == 0) part[warp][n_mix] = ss;
#pragma unroll
    for (int j = 0; j < kHeldMixes; ++j)
      if (j < n_mix) {
        const float d = dot(held[j]);
        if (lane == 0) part[warp][j] = d;
      }
    for (int64_t j = kHeldMixes; j < n_mix; ++j) {
      float wv[4];
      weights4<K>(fn, j, k0, wv);
      const float d = dot(wv);
      if (lane == 0) part[warp][j] = d;
    }
    __syncthreads();
    if (threadIdx.x <= n_mix) {
      float t = part[0][threadIdx.x];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) t += part[w][threadIdx.x];
      partials[(r * slices + blockIdx.x) * (n_mix + 1) + threadIdx.x] = t;
    }
    __syncthreads();
  }
}

// Blocks a row for the mix: a power of two (cluster shapes), one per 1024 elements, at most 8 (the portable
// cluster size).
unsigned mix_blocks(int64_t H) {
  unsigned g = 1;
  while (g < 8 && int64_t(g) * 1024 < H) g *= 2;
  return g;
}
constexpr int kPreElems = 4, kPreStreams = 4;  // a thread's first elements and streams loaded right after the wait
constexpr int kStagedPartials = 2048;          // a row's partials (28 x 9 at hidden 7168) staged in shared memory

// Block (r, q), cluster r (the row's blocks): slice q of row r (block_slice). Every block sums the row's
// partials in slice order into its mixes (the same bits in each), mixes its slice of x and, with norm.out,
// takes the sum of squares of x from its own slice's and, through the cluster's shared memory, the others',
// in block order.
__global__ void __launch_bounds__(kThreads)
    hc_pre_kernel(const float* streams, const float* partials, int64_t slices, int64_t n_mix, const float* bias,
                  int64_t C, int64_t H, const float* base, float scale0, float scale1, float eps, float hc_eps,
                  float mag, float* x, float* post, HcNorm norm) {
  extern __shared__ float xs[];  // [the block's slice of x]
  __shared__ float mixes[kMaxMixes + 1], pre[kMaxStreams], block_ss, row_ss, staged_partials[kStagedPartials];
  const Slice sl = block_slice(H);
  const HeldWeights held = hold_weights(norm.out ? norm.weight : nullptr, sl);
  const bool mixer = threadIdx.x < C;
  // (base holds C biases, 2C with post gates: hc_head's has C)
  const float base_pre = mixer ? base[threadIdx.x] : 0.f, base_post = mixer && post ? base[C + threadIdx.x] : 0.f;
  const float mix_bias = bias && threadIdx.x < n_mix ? bias[threadIdx.x] : 0.f;
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  const float* X = streams + r * C * H;
  float sv[kPreElems][kPreStreams];  // (issued with the partials' loads: neither waits for the other)
#pragma unroll
  for (int u = 0; u < kPreElems; ++u)
#pragma unroll
    for (int j = 0; j < kPreStreams; ++j) {
      const int64_t i = sl.begin + threadIdx.x + int64_t(u) * kThreads;
      sv[u][j] = j < C && i < sl.end ? X[j * H + i] : 0.f;
    }
  // The row's partials, [slices, n_mix + 1]: brought into shared memory by the whole block at once where they
  // fit (one thread a mix, loading them in series, took a chain of ~28 latencies), then each mix added up in
  // slice order either way.
  const int64_t n_part = slices * (n_mix + 1);
  const float* P = partials + r * n_part;
  const bool staged = n_part <= kStagedPartials;
  if (staged) {
    for (int64_t i = threadIdx.x; i < n_part; i += kThreads) staged_partials[i] = P[i];
    __syncthreads();
  }
  if (threadIdx.x <= n_mix) {
    const float* p = (staged ? staged_partials : P) + threadIdx.x;
    float t = p[0];
    for (int64_t q = 1; q < slices; ++q) t += p[q * (n_mix + 1)];
    mixes[threadIdx.x] = threadIdx.x < n_mix && bias ? t + mix_bias : t;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(mixes[n_mix] / float(C * H) + eps);
  if (mixer) {
    const int64_t j = threadIdx.x;
    pre[j] = sigmoidf(mixes[j] * inv * scale0 + base_pre) + hc_eps;
    if (post && blockIdx.y == 0) post[r * C + j] = mag * sigmoidf(mixes[C + j] * inv * scale1 + base_post) + hc_eps;
  }
  __syncthreads();
  float ss = 0.f;
  auto put = [&](int64_t i, float v) {
    if (norm.out) {
      xs[i - sl.begin] = v;
      ss = fmaf(v, v, ss);
    } else {
      x[r * H + i] = v;
    }
  };
#pragma unroll
  for (int u = 0; u < kPreElems; ++u) {
    const int64_t i = sl.begin + threadIdx.x + int64_t(u) * kThreads;
    if (i >= sl.end) break;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kPreStreams; ++j)
      if (j < C) acc = fmaf(pre[j], sv[u][j], acc);
    for (int64_t j = kPreStreams; j < C; ++j) acc = fmaf(pre[j], X[j * H + i], acc);
    put(i, acc);
  }
  for (int64_t i = sl.begin + threadIdx.x + int64_t(kPreElems) * kThreads; i < sl.end; i += kThreads) {
    float acc = 0.f;
    for (int64_t j = 0; j < C; ++j) acc = fmaf(pre[j], X[j * H + i], acc);
    put(i, acc);
  }
  if (!norm.out) return;
  const float mine = block_all(ss, SumOp());
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) block_ss = mine;
  cluster.sync();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (unsigned q = 0; q < cluster.num_blocks(); ++q) t += *cluster.map_shared_rank(&block_ss, q);
    row_ss = t;
  }
  cluster.sync();  // (row_ss written; and no block leaves while another may still read its block_ss)
  const float x_inv = 1.0f / sqrtf(row_ss / float(H) + norm.eps);
  for_slice(sl, held, norm.weight, [&](int64_t k, float w) {
    norm.out[r * H + k] = rms_scaled(xs[k - sl.begin], x_inv, norm.weight != nullptr, w);
  });
}

__global__ void hc_post_kernel(float* streams, const float* post, const float* y, int64_t C, int64_t H, int64_t n) {
  begin_after_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t r = i / (C * H), j = i / H % C, k = i % H;
  streams[i] = post[r * C + j] * y[r * H + k] + streams[i];
}

// ---- paged caches ------------------------------------------------------------------------------------------


__global__ void write_cache_rows_kernel(const float* src, int64_t width, int64_t ss, RowCaches rc, int plane,
                                        int64_t pw) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  const int span = rc.span[r];
  float* dst = rc.planes[span][plane] + physical(rc, span, rc.slot[r]) * pw;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[r * ss + c];
}

// Block r: the norm's statistics over the row's first norm.width elements, each element normalized and the
// rotated pairs turned as the unfused kernels do (the same helpers), stored straight into the cache slot.
__global__ void write_key_rows_kernel(const float* src, int64_t width, int64_t ss, KeyNorm norm, int64_t rope_offset,
                                      int64_t half, const float* inv_freq, float af, RowCaches rc, int plane) {
  if (norm.weight) prefetch_lines_l2(norm.weight, norm.width);  // (weights: before the wait, as hold_weights)
  if (norm.bias) prefetch_lines_l2(norm.bias, norm.width);
  prefetch_lines_l2(inv_freq, half);
  begin_after_predecessor();
  const int64_t r = blockIdx.x, d = norm.width;
  const float* xr = src + r * ss;
  MeanInv st{0.f, 0.f};
  if (norm.bias) st = layer_norm_stats(xr, d, norm.eps);
  else st.inv = rms_inv(xr, d, norm.eps);
  auto value = [&](int64_t k) {
    if (k >= d) return xr[k];
    return norm.bias ? layer_normed(xr[k], st, norm.weight, norm.bias, k) : rms_normed(xr[k], st.inv, norm.weight, k);
  };
  const int span = rc.span[r];
  float* dst = rc.planes[span][plane] + physical(rc, span, rc.slot[r]) * width;
  for (int64_t k = threadIdx.x; k < width; k += kThreads)
    if (k < rope_offset || k >= rope_offset + 2 * half) dst[k] = value(k);
  for (int64_t i = threadIdx.x; i < half; i += kThreads)
    rope_pair(value(rope_offset + i), value(rope_offset + i + half), inv_freq[i], rc.position[r], af,
              &dst[rope_offset + i], &dst[rope_offset + i + half]);
}

// A warp per key: Σ_h w_h · relu(q_h · key), with q and w of the row in shared memory; lane l holds the key's
// elements l, l + 32, ... and each head's dot product is its lanes' sums (in element order) added in a fixed
// butterfly. (A thread per key ran a row's heads x dim products in one chain: at a short context, one block
// of a few dozen busy threads, one of a decode step's slowest kernels.)
constexpr int kIndexerWarps = 8, kIndexerKeyRegs = 8;  // keys of up to 256 elements stay in registers

__global__ void __launch_bounds__(kIndexerWarps * 32)
    indexer_scores_kernel(const float* q, const float* w, float w_a, float w_b, int64_t heads, int64_t dim,
                          RowCaches rc, int plane, float* out, int64_t os) {
  begin_after_predecessor();
  extern __shared__ float smem[];
  const int64_t r = blockIdx.y;
  float* qs = smem;                // [heads, dim]
  float* ws = smem + heads * dim;  // [heads]
  for (int64_t i = threadIdx.x; i < heads * dim; i += blockDim.x) qs[i] = q[r * heads * dim + i];
  for (int64_t i = threadIdx.x; i < heads; i += blockDim.x) ws[i] = w[r * heads + i] * w_a * w_b;  // (as scale())
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t j = int64_t(blockIdx.x) * kIndexerWarps + (threadIdx.x >> 5);
  const int span = rc.span[r];
  if (j > rc.slot[r]) return;  // (a whole warp: j is the warp's)
  const float* key = rc.planes[span][plane] + physical(rc, span, j) * dim;
  float kv[kIndexerKeyRegs];
#pragma unroll
  for (int u = 0; u < kIndexerKeyRegs; ++u) kv[u] = lane + 32 * u < dim ? key[lane + 32 * u] : 0.f;
  float total = 0.f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = qs + h * dim;
    float d = 0.f;
#pragma unroll
    for (int u = 0; u < kIndexerKeyRegs; ++u)
      if (lane + 32 * u < dim) d = fmaf(qh[lane + 32 * u], kv[u], d);
    for (int64_t k = lane + 32 * kIndexerKeyRegs; k < dim; k += 32) d = fmaf(qh[k], key[k], d);
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    total = total + fmaxf(d, 0.f) * ws[h];
  }
  if (lane == 0) out[r * os + j] = total;
}

constexpr int kTopkThreads = kThreads;

// The CPU's selection (ops::topk_ascending): the k-th largest key found bit by bit, then the keys above it
// and the lowest-slot keys equal to it, in ascending slot order.
// (n: candidates[r] when given, else the row's slot + 1)
__global__ void topk_rows_kernel(const float* scores, int64_t ss, const int32_t* slot, const int32_t* candidates,
                                 int64_t k, int32_t* topk, int32_t* count) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  const float* x = scores + r * ss;
  const int64_t n = candidates ? int64_t(candidates[r]) : int64_t(slot[r]) + 1;
  int32_t* out = topk + r * k;
  if (k >= n) {
    for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) out[i] = int32_t(i);
    if (threadIdx.x == 0) count[r] = int32_t(n);
    return;
  }
  int lo = INT_MAX, hi = INT_MIN;
  for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) {
    const int key = order_key(x[i]);
    lo = min(lo, key);
    hi = max(hi, key);
  }
  const int kmin = block_all(lo, MinOp()), kmax = block_all(hi, MaxOp());
  auto count_ge = [&](int t) -> int64_t {
    if (t == INT_MIN) return n;
    int c = 0;
    for (int64_t i = threadIdx.x; i < n; i += kTopkThreads) c += order_key(x[i]) >= t;
    return block_all(c, SumOp());
  };
  const unsigned umin = unsigned(kmin) ^ 0x80000000u, umax = unsigned(kmax) ^ 0x80000000u;
  const int top = umin == umax ? -1 : 31 - __clz(int(umin ^ umax));
  unsigned u = top < 0 ? umin : umin & ~((2u << top) - 1u);  // (2 << 31 wraps to 0: all bits free)
  bool exact = false;
  for (int bit = top; bit >= 0 && !exact; --bit) {
    const unsigned cand = u | (1u << bit);
    const int64_t c = count_ge(int(cand ^ 0x80000000u));
    if (c >= k) {
      u = cand;
      exact = c == k;
    }
  }
  const int t = int(u ^ 0x80000000u);
  const int64_t ties = exact ? n : k - (t == INT_MAX ? 0 : count_ge(t + 1));
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  int64_t eq_seen = 0, taken = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kTopkThreads) {
    const int64_t i = i0 + threadIdx.x;
    const int key = i < n ? order_key(x[i]) : INT_MIN;
    const int eq = i < n && key == t, gt = i < n && key > t;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(eq, eq_before, eq_total);
    __syncthreads();
    const int take = gt || (eq && eq_seen + eq_before < ties);
    int at, took;
    Scan(scan_tmp).ExclusiveSum(take, at, took);
    __syncthreads();
    if (take) out[taken + at] = int32_t(i);
    eq_seen += eq_total;
    taken += took;
  }
  if (threadIdx.x == 0) count[r] = int32_t(taken);
}

__global__ void override_selection_kernel(int32_t* topk, int32_t* count, int64_t k, const int32_t* forced,
                                          const int32_t* forced_count) {
  begin_after_predecessor();
  const int64_t r = blockIdx.x;
  const int32_t n = forced_count[r];
  if (n < 0) return;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) topk[r * k + i] = forced[r * k + i];
  if (threadIdx.x == 0) count[r] = n;
}

// Sparse MLA in two passes (flash decoding). Block (head h, row r, split s) takes the s-th of kMlaSplits equal
// runs of the row's selected keys: their scores (a warp per key, lanes striding the key), the run's max m_s,
// l_s = Σ exp(p_j - m_s) and o_s[i] = Σ exp(p_j - m_s) · key_j[i] (j ascending, a thread per latent column,
// kAhead keys' loads in flight). The combine adds the runs in split order with the sink. The runs depend
// on the row's own key count alone, so a row's values do not depend on its batch. (One block per (row,
// head) read every selected key twice from one SM: 16 blocks for a decode row's 16 heads, at a 2048-key
// selection 4.7 MB each.)
constexpr int kMlaThreads = kThreads, kMlaSplits = 8;

__global__ void __launch_bounds__(kMlaThreads)
    sparse_mla_split_kernel(const float* q_cat, int64_t heads, int64_t kvl, int64_t rope, const int32_t* topk,
                            int64_t ks, const int32_t* count, RowCaches rc, int plane, float scale, float* part) {
  begin_after_predecessor();
  extern __shared__ __align__(16) unsigned char mla_smem[];
  const int64_t h = blockIdx.x, r = blockIdx.y, sp = blockIdx.z, kr = kvl + rope;
  const int64_t nsel = count[r], run = (nsel + kMlaSplits - 1) / kMlaSplits;
  const int64_t j0 = min(nsel, sp * run), n = min(nsel, j0 + run) - j0;
  float* out = part + ((r * heads + h) * kMlaSplits + sp) * (kvl + 2);  // [o_s[kvl], m_s, l_s]
  int64_t* rows = reinterpret_cast<int64_t*>(mla_smem);  // [run] the run's physical rows
  float* q = reinterpret_cast<float*>(rows + run);       // [kr]
  float* p = q + kr;                                     // [run] scores, then exp(score - m_s)
  const int span = rc.span[r];
  const float* keys = rc.planes[span][plane];
  for (int64_t i = threadIdx.x; i < kr; i += kMlaThreads) q[i] = q_cat[(r * heads + h) * kr + i];
  for (int64_t j = threadIdx.x; j < n; j += kMlaThreads) rows[j] = physical(rc, span, topk[r * ks + j0 + j]);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t j = warp; j < n; j += kMlaThreads / 32) {
    const float* key = keys + rows[j] * kr;
    float acc = 0.f;
    for (int64_t i = lane; i < kr; i += 32) acc = fmaf(q[i], key[i], acc);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) p[j] = acc * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kMlaThreads) mx = fmaxf(mx, p[j]);
  const float m = block_all(mx, MaxOp());
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += kMlaThreads) {
    const float e = expf(p[j] - m);
    p[j] = e;
    sum = sum + e;
  }
  const float l = block_all(sum, SumOp());
  if (threadIdx.x == 0) {
    out[kvl] = m;  // (-inf for an empty run: the combine gives it no weight)
    out[kvl + 1] = l;
  }
  constexpr int kAhead = 8;
  for (int64_t i = threadIdx.x; i < kvl; i += kMlaThreads) {
    float acc = 0.f;
    int64_t j = 0;
    for (; j + kAhead <= n; j += kAhead) {
      float v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) v[u] = keys[rows[j + u] * kr + i];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) acc = fmaf(p[j + u], v[u], acc);
    }
    for (; j < n; ++j) acc = fmaf(p[j], keys[rows[j] * kr + i], acc);
    out[i] = acc;
  }
}

// Block (head h, row r): o_lat[r, h] = Σ_s exp(m_s - M) · o_s / (Σ_s exp(m_s - M) · l_s + exp(sink - M)), s
// ascending, M the largest of the runs' maxima and the sink.
__global__ void __launch_bounds__(kMlaThreads)
    sparse_mla_combine_kernel(const float* part, int64_t heads, int64_t kvl, const float* sinks, float* o_lat) {
  const int64_t h = blockIdx.x, r = blockIdx.y;
  const float sink = sinks[h];  // (a weight: read before the wait)
  begin_after_predecessor();
  const float* in = part + (r * heads + h) * kMlaSplits * (kvl + 2);
  float M = sink;
  for (int sp = 0; sp < kMlaSplits; ++sp) M = fmaxf(M, in[sp * (kvl + 2) + kvl]);
  float wts[kMlaSplits];
  float total = 0.f;
#pragma unroll
  for (int sp = 0; sp < kMlaSplits; ++sp) {
    const float ms = in[sp * (kvl + 2) + kvl];
    wts[sp] = ms == -INFINITY ? 0.f : expf(ms - M);
    total = fmaf(wts[sp], in[sp * (kvl + 2) + kvl + 1], total);
  }
  const float inv = 1.0f / (total + expf(sink - M));
  for (int64_t i = threadIdx.x; i < kvl; i += kMlaThreads) {
    float acc = 0.f;
#pragma unroll
    for (int sp = 0; sp < kMlaSplits; ++sp) acc = fmaf(wts[sp], in[sp * (kvl + 2) + i], acc);
    o_lat[(r * heads + h) * kvl + i] = acc * inv;
  }
}

// Block (n tile, h, row chunk z): warp i takes row n = tile · kHeadWarps + i of head h, lane l its 16-byte pieces
// l, l + 32, ... (in order), for the chunk's MT rows of x at once (each piece read once), then the warp's tree per
// row of x (MT does not change a sum). A block a row, 256 threads summing 512 columns through a block-wide tree,
// made this one of a decode step's slowest kernels (16384 blocks).
constexpr int kHeadWarps = 8;
template <int KIND, int MT>
__global__ void __launch_bounds__(kHeadWarps * 32)
    matmul_heads_kernel(const float* x, int64_t M, int64_t xs, int64_t xh, DeviceWeight w, int64_t row0, int64_t hrs,
                        int64_t rows_per_head, float* y, int64_t ys, int64_t yh, bool vec, bool x_vec) {
  constexpr int E = kVecElems<KIND>;
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kHeadWarps + (threadIdx.x >> 5), h = blockIdx.y, row = row0 + h * hrs + n;
  if (n >= rows_per_head) return;  // (no block-wide step follows)
  if (blockIdx.z == 0 && lane == 0 && w.prefetch_row_bytes > 0)  // (weights: before the wait)
    prefetch_l2(w.data + row * w.row_stride * w.elem_bytes, w.in * w.elem_bytes, 0, 1);
  begin_after_predecessor();
  const unsigned char* srow = KIND == 2 ? scale_row(w, row, scale_bytes(w)) : nullptr;
  const int64_t m0 = int64_t(blockIdx.z) * MT, nm = M - m0 < MT ? M - m0 : MT;
  float acc[MT] = {};
  for (int64_t c0 = int64_t(lane) * E; c0 < w.in; c0 += 32 * E) {
    float wv[E];
    const bool one_scale = KIND != 2 || (c0 / w.block_in == (c0 + E - 1) / w.block_in);
    if (vec && one_scale && c0 + E <= w.in) {
      const float s = KIND == 2 ? scale_value(srow, w.scale_kind, unsigned(c0 / w.block_in)) : 1.0f;
      convert16<KIND>(*reinterpret_cast<const uint4*>(w.data + (row * w.row_stride + c0) * w.elem_bytes), s, wv);
    } else {
      decode_each<KIND>(w, srow, row, c0, wv);
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (MT > 1 && i >= nm) break;
      const float* xr = x + (m0 + i) * xs + h * xh;
      float xv[E];
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        if (x_vec && c0 + E <= w.in) {
          const float4 q = *reinterpret_cast<const float4*>(xr + c0 + e);
          xv[e] = q.x, xv[e + 1] = q.y, xv[e + 2] = q.z, xv[e + 3] = q.w;
        } else {
#pragma unroll
          for (int f = 0; f < 4; ++f) xv[e + f] = c0 + e + f < w.in ? xr[c0 + e + f] : 0.f;
        }
      }
#pragma unroll
      for (int e = 0; e < E; ++e) acc[i] = fmaf(wv[e], xv[e], acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i >= nm) break;
    const float sum = warp_sum(acc[i]);
    if (lane == 0) y[(m0 + i) * ys + h * yh + n] = sum;
  }
}

// The k largest of v[0, n) (ties: the lower index), ascending, into out; n <= 1024, k <= n. One thread.
__device__ void topk_ascending_serial(const float* v, int n, int k, int32_t* out, bool* taken) {
  for (int i = 0; i < n; ++i) taken[i] = false;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i)
      if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    taken[best] = true;
  }
  int m = 0;
  for (int i = 0; i < n && m < k; ++i)
    if (taken[i]) out[m++] = i;
}

constexpr int kMaxExperts = 1024, kMaxGroups = 256;

// Block t, thread 0: the host's route_tokens for token t.
__global__ void moe_route_kernel(const float* logits, const float* e_bias, MoeRouting r, int32_t* ids, float* wts) {
  prefetch_lines_l2(e_bias, r.experts);  // (weights: before the wait)
  begin_after_predecessor();
  if (threadIdx.x != 0) return;
  const int64_t t = blockIdx.x;
  const int E = int(r.experts), k = int(r.k), G = int(r.groups), per = E / G;
  __shared__ float scores[kMaxExperts], choice[kMaxExperts], gscore[kMaxGroups];
  __shared__ bool taken[kMaxExperts];
  __shared__ int32_t pick[kMaxExperts];
  for (int e = 0; e < E; ++e) {
    scores[e] = sigmoidf(logits[t * E + e]);
    choice[e] = scores[e] + e_bias[e];
  }
  if (G > 1) {
    for (int g = 0; g < G; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > b1) {
          b2 = b1;
          b1 = choice[e];
        } else if (choice[e] > b2) {
          b2 = choice[e];
        }
      }
      gscore[g] = b1 + (per > 1 ? b2 : 0.0f);
    }
    const int keep = min(int(r.topk_group), G);
    topk_ascending_serial(gscore, G, keep, pick, taken);
    for (int g = 0; g < G; ++g) taken[g] = false;
    for (int i = 0; i < keep; ++i) taken[pick[i]] = true;
    for (int e = 0; e < E; ++e)
      if (!taken[e / per]) choice[e] = -INFINITY;
  }
  topk_ascending_serial(choice, E, k, pick, taken);
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) {
    ids[t * k + i] = pick[i];
    wts[t * k + i] = scores[pick[i]];
    sum += wts[t * k + i];
  }
  for (int i = 0; i < k; ++i) {
    float w = wts[t * k + i];
    if (r.norm_topk_prob) w = w / (sum + 1e-20f);
    wts[t * k + i] = w * r.routed_scaling_factor;
  }
}

// Block t, thread 0: softmax over the experts (max, exponentials, their sum in order, each times its inverse),
// the k largest, their weights (renormalized in expert order).
__global__ void moe_route_softmax_kernel(const float* logits, int64_t E, int64_t k, bool norm_topk_prob, int32_t* ids,
                                         float* wts) {
  begin_after_predecessor();
  if (threadIdx.x != 0) return;
  const int64_t t = blockIdx.x;
  __shared__ float p[kMaxExperts];
  __shared__ bool taken[kMaxExperts];
  __shared__ int32_t pick[kMaxExperts];
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, logits[t * E + e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = expf(logits[t * E + e] - m);
    sum += p[e];
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < E; ++e) p[e] = p[e] * inv;
  topk_ascending_serial(p, int(E), int(k), pick, taken);
  float chosen = 0.0f;
  for (int64_t i = 0; i < k; ++i) chosen += p[pick[i]];
  for (int64_t i = 0; i < k; ++i) {
    ids[t * k + i] = pick[i];
    wts[t * k + i] = norm_topk_prob ? p[pick[i]] / chosen : p[pick[i]];
  }
}

// One block, a warp per expert: the warp reads the (token, slot) choices 32 at a time and counts (then
// places) its expert's with a ballot, so that each expert's rows come in token order. (A thread per expert
// reading one choice at a time took tens of microseconds at 64 sequences, in series with everything else.)
__global__ void moe_dispatch_kernel(const int32_t* ids, int64_t n_all, int64_t E, int32_t* first, int32_t* token_of,
                                    int32_t* row_of, int64_t k, const int32_t* real_tokens) {
  begin_after_predecessor();
  __shared__ int32_t count[kMaxExperts + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t n = real_tokens ? min(n_all, int64_t(*real_tokens) * k) : n_all;  // (the padding's choices after)
  for (int64_t i = n + threadIdx.x; i < n_all; i += blockDim.x) row_of[i] = token_of[i] = 0;
  for (int64_t e = warp; e < E; e += warps) {
    int32_t c = 0;
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
      const int64_t i = i0 + lane;
      c += __popc(__ballot_sync(0xffffffffu, i < n && ids[i] == e));
    }
    if (lane == 0) count[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t c = count[e];
      first[e] = at;
      count[e] = at;
      at += c;
    }
    first[E] = at;
  }
  __syncthreads();
  for (int64_t e = warp; e < E; e += warps) {
    int32_t at = count[e];
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
      const int64_t i = i0 + lane;
      const bool hit = i < n && ids[i] == e;
      const unsigned mask = __ballot_sync(0xffffffffu, hit);
      if (hit) {
        const int32_t row = at + __popc(mask & ((1u << lane) - 1u));
        token_of[row] = int32_t(i / k);
        row_of[i] = row;
      }
      at += __popc(mask);
    }
  }
}

__global__ void moe_combine_kernel(const float* eo, const int32_t* rows, const float* wts, int64_t k, int64_t H,
                                   const float* shared, float* out, OutputSink sink) {
  begin_after_predecessor();
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float acc = 0.f;
    for (int64_t q = 0; q < k; ++q) {
      const int32_t row = rows[t * k + q];
      if (row >= 0) acc = acc + eo[int64_t(row) * H + i] * wts[t * k + q];
    }
    if (shared) acc = acc + shared[t * H + i];
    store_out(sink, out, H, t, i, acc);
  }
}

// ---- argmax ------------------------------------------------------------------------------------------------

struct Best {
  float value;
  int32_t index;  // INT32_MAX: none yet
};
struct BestOp {  // the larger value; of equal ones, the lower index (the host's first maximum)
  __device__ __forceinline__ Best operator()(const Best& a, const Best& b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index <= b.index ? a : b;
  }
};

// The row's best {value, index} (its lowest index among equal values) and whether all its values are finite.
__device__ Best row_best_of(const float* row, int64_t n, int* all_finite) {
  Best best{-INFINITY, INT32_MAX};
  int finite = 1;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {  // indices ascend: a later equal value never wins
    const float v = row[i];
    finite &= isfinite(v) ? 1 : 0;
    if (v > best.value || best.index == INT32_MAX) best = Best{v, int32_t(i)};
  }
  *all_finite = block_all(finite, MinOp{});
  return block_all(best, BestOp{});
}

__global__ void row_argmax_kernel(const float* x, int64_t n, int32_t* out) {
  begin_after_predecessor();
  int all_finite = 0;
  const Best b = row_best_of(x + int64_t(blockIdx.x) * n, n, &all_finite);
  if (threadIdx.x == 0) out[blockIdx.x] = all_finite ? b.index : -1;
}

__global__ void row_best_kernel(const float* x, int64_t n, int64_t stride, int64_t id0, RowBest* out) {
  begin_after_predecessor();
  int all_finite = 0;
  const Best b = row_best_of(x + int64_t(blockIdx.x) * stride, n, &all_finite);
  if (threadIdx.x == 0) out[blockIdx.x] = all_finite ? RowBest{b.value, id0 + b.index} : RowBest{0.0f, -1};
}


}  // namespace

// ---- memory ------------------------------------------------------------------------------------------------

void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice), "copy to device");
}
void copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) check(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}
void fill_zero(void* dst, size_t bytes) {
  const int64_t n = int64_t(bytes);
  if (n <= 0) return;
  launch_kernel(zero_kernel, blocks_for(n), kThreads, 0, "zero_kernel", static_cast<unsigned char*>(dst), n);
}
void copy_cols(const float* src, int64_t rows, int64_t cols, int64_t src_stride, float* dst, int64_t dst_stride) {
  if (rows <= 0 || cols <= 0) return;
  launch_kernel(copy_cols_kernel, unsigned(rows), 128, 0, "copy_cols_kernel", src, cols, src_stride, dst, dst_stride);
}
void gather_rows(const float* src, int64_t width, const int32_t* idx, int64_t n, float* dst) {
  if (n <= 0) return;
  launch_kernel(gather_rows_kernel, unsigned(n), kThreads, 0, "gather_rows_kernel", src, width, idx, dst);
}

// ---- elementwise -------------------------------------------------------------------------------------------

void add(float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  launch_kernel(add_kernel, blocks_for(n), kThreads, 0, "add_kernel", a, b, n);
}
void swiglu(const float* gate, const float* up, int64_t n, float limit, float* out) {
  if (n <= 0) return;
  launch_kernel(swiglu_kernel, blocks_for(n), kThreads, 0, "swiglu_kernel", gate, up, n, limit, out);
}
void mul_sigmoid(const float* x, const float* g, int64_t n, float* out) {
  if (n <= 0) return;
  launch_kernel(mul_sigmoid_kernel, blocks_for(n), kThreads, 0, "mul_sigmoid_kernel", x, g, n, out);
}
void scale(float* x, int64_t n, float a, float b) {
  if (n <= 0) return;
  launch_kernel(scale_kernel, blocks_for(n), kThreads, 0, "scale_kernel", x, n, a, b);
}

void map(float* x, int64_t n, Map f, float d) {
  if (n <= 0) return;
  launch_kernel(map_kernel, blocks_for(n), kThreads, 0, "map_kernel", x, n, f, d);
}
void scale_rows_sigmoid(float* x, const float* g, int64_t rows, int64_t d) {
  if (rows <= 0) return;
  launch_kernel(scale_rows_sigmoid_kernel, unsigned(rows), kThreads, 0, "scale_rows_sigmoid_kernel", x, g, d);
}

// ---- multi-stream mixes ------------------------------------------------------------------------------------

void stream_mean(const float* w, int64_t rows, int64_t C, int64_t H, float* x) {
  if (rows <= 0) return;
  launch_kernel(stream_mean_kernel, dim3(unsigned(rows), std::max(1u, blocks_for(H) / 4)), kThreads, 0,
                "stream_mean_kernel", w, C, H, x);
}
void stream_gates(const float* key, const float* query, const float* value, int64_t rows, int64_t C, int64_t H,
                  float* out) {
  if (rows <= 0 || C <= 0) return;
  launch_kernel(stream_gates_kernel, dim3(unsigned(rows), unsigned(C)), kThreads, 0, "stream_gates_kernel", key, query,
                value, C, H, out);
}

// ---- norms -------------------------------------------------------------------------------------------------

void rms_norm_groups(const float* x, int64_t rows, int64_t groups, int64_t d, int64_t row_stride, int64_t group_stride,
                     const float* weight, int64_t weight_stride, float eps, float* out) {
  if (rows <= 0 || groups <= 0) return;
  launch_kernel(rms_norm_groups_kernel, dim3(unsigned(rows), unsigned(groups)), kThreads, 0, "rms_norm_groups_kernel",
                x, d, row_stride, group_stride, weight, weight_stride, eps, out);
}

void rms_norm_rows(const float* x, int64_t rows, int64_t d, int64_t x_stride, const float* weight, float eps,
                   float* out, int64_t out_stride) {
  if (rows <= 0) return;
  const bool in_place = overlaps(x, (rows - 1) * x_stride + d, out, (rows - 1) * out_stride + d);
  launch_kernel(rms_norm_rows_kernel, dim3(unsigned(rows), row_slices(d, in_place)), kThreads, 0,
                "rms_norm_rows_kernel", x, d, x_stride, weight, eps, out, out_stride);
}
void layer_norm_rows(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, float eps,
                     float* out) {
  if (rows <= 0) return;
  launch_kernel(layer_norm_rows_kernel, unsigned(rows), kThreads, 0, "layer_norm_rows_kernel", x, d, weight, bias, eps,
                out);
}

// ---- RoPE, embeddings, absorption ------------------------------------------------------------------------

void rope_rows(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride, int64_t offset,
               int64_t dim, const int32_t* positions, const float* inv_freq, float attention_factor) {
  if (rows <= 0 || heads <= 0 || dim < 2) return;
  launch_kernel(rope_rows_kernel, dim3(unsigned(rows), unsigned(heads)), 64, 0, "rope_rows_kernel", x, row_stride,
                head_stride, offset, dim / 2, positions, inv_freq, attention_factor);
}

void embed_rows(const Linear& w, const int32_t* ids, int64_t rows, int copies, float* out, int64_t out_stride) {
  if (rows <= 0) return;
  launch_kernel(embed_rows_kernel, unsigned(rows), kThreads, 0, "embed_rows_kernel", device_weight(w), weight_kind(w),
                ids, copies, out, out_stride);
}

void matmul_transposed_heads(const float* x, int64_t M, int64_t x_stride, int64_t x_head, const Linear& w,
                             int64_t row0, int64_t head_rows_stride, int64_t rows_per_head, int64_t heads, float* y,
                             int64_t y_stride, int64_t y_head, int64_t tail) {
  if (M <= 0 || heads <= 0) return;
  const DeviceWeight d = device_weight(w);
  const int64_t tile = 16 / d.elem_bytes * 32;
  const bool vec = rows_16_byte_aligned(w, d.elem_bytes);
  auto go = [&](auto kernel, int64_t mt) {
    for_row_chunks(M, mt, [&](int64_t r0, int64_t rows) {
      const dim3 grid(unsigned((w.in + tile - 1) / tile), unsigned(heads), unsigned((rows + mt - 1) / mt));
      launch_kernel(kernel, grid, dim3(kTrWarps * 32), 0, "matmul_transposed_heads_kernel", x + r0 * x_stride, rows,
                    x_stride, x_head, d, row0, head_rows_stride, rows_per_head, y + r0 * y_stride, y_stride, y_head,
                    tail, vec);
    });
  };
  // (rows of x a block: 1 at decode, 2-4 for a verify's or a batch's rows, which then share each weight read;
  // FP8's 16 columns a lane take 2, as 4 rows' sums spill registers)
  switch (weight_kind(w)) {
    case 0: return M == 1 ? go(matmul_transposed_heads_kernel<0, 1>, 1) : go(matmul_transposed_heads_kernel<0, 4>, 4);
    case 1: return M == 1 ? go(matmul_transposed_heads_kernel<1, 1>, 1) : go(matmul_transposed_heads_kernel<1, 4>, 4);
    default: return M == 1 ? go(matmul_transposed_heads_kernel<2, 1>, 1) : go(matmul_transposed_heads_kernel<2, 2>, 2);
  }
}

// ---- iHC ---------------------------------------------------------------------------------------------------

int64_t hc_pre_scratch_floats(int64_t rows, int64_t C, int64_t H, int64_t n_mix) {
  return rows * mix_slices(C * H) * (n_mix + 1);
}

void hc_pre(const float* streams, int64_t rows, int64_t C, int64_t H, const Linear& fn, float* partials,
            const float* base, float scale0, float scale1, float eps, float hc_eps, float mag, float* x, float* post,
            const HcNorm* norm) {
  if (rows <= 0) return;
  if (C > kMaxStreams) throw Error("cuda::hc_pre: more than 64 hyper-connection streams");
  const int64_t width = C * H, n_mix = fn.out;
  if (fn.in != width || (n_mix != C && n_mix != 2 * C) || (post && n_mix != 2 * C))
    throw Error("cuda::hc_pre: the mixer is " + std::to_string(fn.out) + " x " + std::to_string(fn.in) + ", not " +
                std::to_string(post ? 2 * C : C) + " x " + std::to_string(width));
  float* out = norm ? norm->out : x;
  if (overlaps(streams, rows * width, out, rows * H))
    throw Error("cuda::hc_pre: its output overlaps the streams it reads");
  const unsigned g = mix_blocks(H);
  const size_t slice_bytes = size_t((H + g - 1) / g) * sizeof(float);
  if (slice_bytes > 32 * 1024) throw Error("cuda::hc_pre: hidden size " + std::to_string(H) + " is too wide");
  const int64_t slices = mix_slices(width);
  const RowChunks rc = row_chunks(slices, rows, 1);
  const int64_t rows_per_y = rc.rows_per_chunk;
  const dim3 grid(unsigned(slices), rc.chunks);
  const DeviceWeight d = device_weight(fn);
  switch (weight_kind(fn)) {
    case 0: launch_kernel(hc_mix_partials_kernel<WeightKind::kF32>, grid, kThreads, 0, "hc_mix_partials_kernel",
                          streams, rows, width, d, rows_per_y, partials);
      break;
    case 1: launch_kernel(hc_mix_partials_kernel<WeightKind::kBF16>, grid, kThreads, 0, "hc_mix_partials_kernel",
                          streams, rows, width, d, rows_per_y, partials);
      break;
    default: launch_kernel(hc_mix_partials_kernel<WeightKind::kFP8>, grid, kThreads, 0, "hc_mix_partials_kernel",
                           streams, rows, width, d, rows_per_y, partials);
  }
  launch_kernel_clustered(hc_pre_kernel, dim3(unsigned(rows), g), dim3(1, g, 1), kThreads, norm ? slice_bytes : 0,
                          "hc_pre_kernel", streams, partials, slices, n_mix, fn.bias, C, H, base, scale0, scale1,
                          eps, hc_eps, mag, x, post, norm ? *norm : HcNorm{nullptr, 0.f, nullptr});
}
void hc_post(float* streams, const float* post, const float* y, int64_t rows, int64_t C, int64_t H) {
  const int64_t n = rows * C * H;
  if (n <= 0) return;
  launch_kernel(hc_post_kernel, blocks_for(n), kThreads, 0, "hc_post_kernel", streams, post, y, C, H, n);
}

// ---- caches, indexer, attention ----------------------------------------------------------------------------

void write_cache_rows(const float* src, int64_t rows, int64_t width, int64_t src_stride, const RowCaches& rc,
                      int plane, int64_t plane_width) {
  if (rows <= 0) return;
  launch_kernel(write_cache_rows_kernel, unsigned(rows), 128, 0, "write_cache_rows_kernel", src, width, src_stride, rc,
                plane, plane_width < 0 ? width : plane_width);
}

void write_key_rows(const float* src, int64_t rows, int64_t width, int64_t src_stride, const KeyNorm& norm,
                    int64_t rope_offset, int64_t rope_dim, const float* inv_freq, float attention_factor,
                    const RowCaches& rc, int plane) {
  if (rows <= 0) return;
  if (norm.width > width || rope_offset < 0 || rope_offset + rope_dim > width || (norm.bias && !norm.weight))
    throw Error("cuda::write_key_rows: the norm or the rotated span is not inside the row");
  launch_kernel(write_key_rows_kernel, unsigned(rows), kThreads, 0, "write_key_rows_kernel", src, width, src_stride,
                norm, rope_offset, rope_dim / 2, inv_freq, attention_factor, rc, plane);
}

void indexer_scores(const float* q, const float* w, int64_t rows, int64_t heads, int64_t dim, const RowCaches& rc,
                    int plane, int64_t max_keys, float* out, int64_t out_stride, float w_a, float w_b) {
  if (rows <= 0 || max_keys <= 0) return;
  const size_t smem = size_t(heads * dim + heads) * sizeof(float);
  allow_smem(indexer_scores_kernel, smem, "indexer scores: shared memory");
  launch_kernel(indexer_scores_kernel, dim3(blocks_for(max_keys, kIndexerWarps), unsigned(rows)), kIndexerWarps * 32,
                smem, "indexer_scores_kernel", q, w, w_a, w_b, heads, dim, rc, plane, out, out_stride);
}

void topk_rows(const float* scores, int64_t rows, int64_t score_stride, const RowCaches& rc, int64_t k,
               int32_t* topk, int32_t* count) {
  if (rows <= 0) return;
  launch_kernel(topk_rows_kernel, unsigned(rows), kTopkThreads, 0, "topk_rows_kernel", scores, score_stride, rc.slot,
                static_cast<const int32_t*>(nullptr), k, topk, count);
}
void topk_rows(const float* scores, int64_t rows, int64_t score_stride, const int32_t* candidates, int64_t k,
               int32_t* topk, int32_t* count) {
  if (rows <= 0) return;
  launch_kernel(topk_rows_kernel, unsigned(rows), kTopkThreads, 0, "topk_rows_kernel", scores, score_stride,
                static_cast<const int32_t*>(nullptr), candidates, k, topk, count);
}

void override_selection(int32_t* topk, int32_t* count, int64_t rows, int64_t k, const int32_t* forced,
                        const int32_t* forced_count) {
  if (rows <= 0) return;
  launch_kernel(override_selection_kernel, unsigned(rows), 128, 0, "override_selection_kernel", topk, count, k, forced,
                forced_count);
}

int64_t sparse_mla_scratch_floats(int64_t rows, int64_t heads, int64_t kvl) {
  return rows * heads * kMlaSplits * (kvl + 2);
}

void sparse_mla(const float* q_cat, int64_t rows, int64_t heads, int64_t kvl, int64_t rope, const int32_t* topk,
                int64_t k_stride, const int32_t* count, const RowCaches& rc, int plane, float scale,
                const float* sinks, float* scratch, float* o_lat) {
  if (rows <= 0 || heads <= 0) return;
  const int64_t run = (k_stride + kMlaSplits - 1) / kMlaSplits;  // (the longest a row's run can be)
  const size_t smem = size_t(run) * sizeof(int64_t) + size_t(kvl + rope + run) * sizeof(float);
  allow_smem(sparse_mla_split_kernel, smem, "sparse MLA: shared memory");
  launch_kernel(sparse_mla_split_kernel, dim3(unsigned(heads), unsigned(rows), kMlaSplits), kMlaThreads, smem,
                "sparse_mla_split_kernel", q_cat, heads, kvl, rope, topk, k_stride, count, rc, plane, scale, scratch);
  launch_kernel(sparse_mla_combine_kernel, dim3(unsigned(heads), unsigned(rows)), kMlaThreads, 0,
                "sparse_mla_combine_kernel", scratch, heads, kvl, sinks, o_lat);
}

void matmul_heads(const float* x, int64_t M, int64_t x_stride, int64_t x_head, const Linear& w, int64_t row0,
                  int64_t head_rows_stride, int64_t rows_per_head, int64_t heads, float* y, int64_t y_stride,
                  int64_t y_head) {
  if (M <= 0 || heads <= 0 || rows_per_head <= 0) return;
  const DeviceWeight d = device_weight(w);
  const bool vec = rows_16_byte_aligned(w, d.elem_bytes);
  const bool x_vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0 && x_head % 4 == 0;
  auto go = [&](auto kernel, int64_t mt) {
    for_row_chunks(M, mt, [&](int64_t r0, int64_t rows) {
      const dim3 grid(unsigned((rows_per_head + kHeadWarps - 1) / kHeadWarps), unsigned(heads),
                      unsigned((rows + mt - 1) / mt));
      launch_kernel(kernel, grid, dim3(kHeadWarps * 32), 0, "matmul_heads_kernel", x + r0 * x_stride, rows, x_stride,
                    x_head, d, row0, head_rows_stride, rows_per_head, y + r0 * y_stride, y_stride, y_head, vec, x_vec);
    });
  };
  switch (weight_kind(w)) {  // (rows of x a block: as matmul_transposed_heads)
    case 0: return M == 1 ? go(matmul_heads_kernel<0, 1>, 1) : go(matmul_heads_kernel<0, 4>, 4);
    case 1: return M == 1 ? go(matmul_heads_kernel<1, 1>, 1) : go(matmul_heads_kernel<1, 4>, 4);
    default: return M == 1 ? go(matmul_heads_kernel<2, 1>, 1) : go(matmul_heads_kernel<2, 4>, 4);
  }
}

void moe_route(const float* logits, const float* e_bias, int64_t S, const MoeRouting& r, int32_t* ids,
               float* weights) {
  if (S <= 0) return;
  if (r.experts > kMaxExperts || r.groups > kMaxGroups || r.groups < 1 || r.k > r.experts)
    throw Error("cuda::moe_route: more than 1024 experts or 256 groups, or k > experts");
  launch_kernel(moe_route_kernel, unsigned(S), 32, 0, "moe_route_kernel", logits, e_bias, r, ids, weights);
}

void moe_route_softmax(const float* logits, int64_t S, int64_t E, int64_t k, bool norm_topk_prob, int32_t* ids,
                       float* weights) {
  if (S <= 0) return;
  if (E > kMaxExperts || k < 1 || k > E)
    throw Error("cuda: softmax routing of " + std::to_string(k) + " of " + std::to_string(E) + " experts (at most " +
                std::to_string(kMaxExperts) + " experts)");
  launch_kernel(moe_route_softmax_kernel, unsigned(S), 32, 0, "moe_route_softmax_kernel", logits, E, k, norm_topk_prob,
                ids, weights);
}
void moe_dispatch(const int32_t* ids, int64_t S, int64_t k, int64_t E, int32_t* first, int32_t* token_of,
                  int32_t* row_of, const int32_t* real_tokens) {
  if (E > kMaxExperts) throw Error("cuda::moe_dispatch: more than 1024 experts");
  launch_kernel(moe_dispatch_kernel, 1, 1024, 0, "moe_dispatch_kernel", ids, S * k, E, first, token_of, row_of, k,
                real_tokens);
}

void moe_combine(const float* expert_out, const int32_t* rows, const float* weights, int64_t tokens, int64_t k,
                 int64_t H, const float* shared, float* out, const OutputSink& sink) {
  if (tokens <= 0) return;
  launch_kernel(moe_combine_kernel, unsigned(tokens), kThreads, 0, "moe_combine_kernel", expert_out, rows, weights, k,
                H, shared, out, sink);
}

// ---- argmax ------------------------------------------------------------------------------------------------

void row_argmax(const float* x, int64_t rows, int64_t n, int32_t* out) {
  if (rows <= 0) return;
  if (n <= 0 || n > INT32_MAX) throw Error("row_argmax: rows of " + std::to_string(n) + " values");
  launch_kernel(row_argmax_kernel, unsigned(rows), kThreads, 0, "row_argmax_kernel", x, n, out);
}

void row_best(const float* x, int64_t rows, int64_t n, int64_t stride, int64_t id0, RowBest* out) {
  if (rows <= 0) return;
  if (n <= 0 || n > INT32_MAX || stride < n) throw Error("row_best: rows of " + std::to_string(n) + " values");
  launch_kernel(row_best_kernel, unsigned(rows), kThreads, 0, "row_best_kernel", x, n, stride, id0, out);
}

}  // namespace nextn::cuda
