// CUDA kernels behind cuda_ops.h. Compiled with --fmad=false: every fused multiply-add is written out
// (fmaf), so that no contraction the compiler chooses can round one row differently from another.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_weight.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/output_sink.cuh"

namespace nextn::cuda {

namespace {

// ---- the matmul ------------------------------------------------------------------------------------------

constexpr int kWarpsPerBlock = 8;  // a block's warps split each weight row's vectors (fixed: it sets the order)
constexpr int kVecBytes = 16;

// The 16 bytes of row n's vector v decoded to floats (FP8: its block scale applied, as the CPU dequantizes).
template <WeightKind K>
struct Vec {
  static constexpr int kElems = K == WeightKind::kF32 ? 4 : K == WeightKind::kBF16 ? 8 : 16;
  __device__ __forceinline__ static void load(const DeviceWeight& w, const unsigned char* srow, unsigned vec_per_block,
                                              int64_t n, int64_t v, float* out) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w.data + (n * w.row_stride + v * kElems) * (16 / kElems)));
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (K == WeightKind::kF32) {
      for (int e = 0; e < 4; ++e) out[e] = __uint_as_float(words[e]);
    } else if constexpr (K == WeightKind::kBF16) {
      for (int e = 0; e < 4; ++e) {
        out[2 * e] = __uint_as_float(words[e] << 16);
        out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
      }
    } else {
      const float s = scale_value(srow, w.scale_kind, unsigned(v) / vec_per_block);
      for (int e = 0; e < 4; ++e)
        for (int b = 0; b < 4; b += 2) {
          const float2 f = __half22float2(__half2(fp8x2_to_half2(words[e] >> (8 * b))));
          out[4 * e + b] = f.x * s;
          out[4 * e + b + 1] = f.y * s;
        }
    }
  }

  // acc += Σ_e out[e] · x[e] in element order, out being load()'s values, decoded as they are consumed: the
  // same FMA chain as load() then a loop over e, without E decoded floats live per column (with C = 4 FP8
  // columns those held 64 registers, which capped the kernel at 2 blocks per SM and its DRAM reads at 24%).
  __device__ __forceinline__ static float fma_into(const DeviceWeight& w, const unsigned char* srow,
                                                   unsigned vec_per_block, int64_t n, int64_t v, const float* x,
                                                   float acc) {
    if constexpr (K != WeightKind::kFP8) {
      float out[kElems];
      load(w, srow, vec_per_block, n, v, out);
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc = fmaf(out[e], x[e], acc);
      return acc;
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w.data + n * w.row_stride + v * kElems));
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
      const float s = scale_value(srow, w.scale_kind, unsigned(v) / vec_per_block);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int b = 0; b < 4; b += 2) {
          const float2 f = __half22float2(__half2(fp8x2_to_half2(words[e] >> (8 * b))));
          acc = fmaf(f.x * s, x[4 * e + b], acc);
          acc = fmaf(f.y * s, x[4 * e + b + 1], acc);
        }
      return acc;
    }
  }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// E floats of activation row xr from element k: float4 loads where the row allows them.
template <int E>
__device__ __forceinline__ void load_x(const float* xr, bool x_vectors, float* out) {
  if (x_vectors) {
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(xr + e));
      out[e] = q.x, out[e + 1] = q.y, out[e + 2] = q.z, out[e + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = __ldg(xr + e);
  }
}

// y[m, n] for m in [0, M) and the block's C columns n (weight rows), R activation rows per pass over the
// weights, U weight vectors per thread in flight. Thread t of the block takes the vectors t, t + 256, ... of
// each of its columns (then the scalar tail, likewise), so that the C columns share each load of x; each
// (row, column) accumulates in its own register in that order, a warp's sums meet in a fixed butterfly and
// the block's 8 warps' sums are added in warp order. None of it depends on M, C, R or U, so the launch
// shape can follow M (launch() below) and every row still gets the value the one-row call gives it.
// (The block's columns start at n0: a plain matmul's block blockIdx.x, or a grouped one's within its expert.)
template <WeightKind K, int C, int R, int U>
__device__ __forceinline__ void matmul_tile(const float* __restrict__ x, int64_t M, int64_t xs, const DeviceWeight& w,
                                            float* __restrict__ y, int64_t ys, bool vectors, bool x_vectors,
                                            int64_t n0, const OutputSink& sink) {
  using V = Vec<K>;
  constexpr int E = V::kElems, kThreads = kWarpsPerBlock * 32;
  __shared__ float part[kWarpsPerBlock][C][R];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cols = int(w.out - n0 < C ? w.out - n0 : C);
  const int sbytes = scale_bytes(w);
  const unsigned char* srow[C];
#pragma unroll
  for (int c = 0; c < C; ++c) srow[c] = K == WeightKind::kFP8 ? scale_row(w, n0 + (c < cols ? c : 0), sbytes) : nullptr;
  const unsigned vec_per_block = K == WeightKind::kFP8 ? unsigned(w.block_in / E) : 1u;
  const int64_t nvec = vectors ? w.in / E : 0;
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    const int rows = int(M - m0 < R ? M - m0 : R);
    float acc[C][R];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[c][r] = 0.f;
    const float* xm = x + m0 * xs;
#pragma unroll U
    for (int64_t v = tid; v < nvec; v += kThreads) {
      if constexpr (R == 1) {  // one activation row: decode each weight as it is consumed
        float xv[E];
        load_x<E>(xm + v * E, x_vectors, xv);
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (c < cols) acc[c][0] = V::fma_into(w, srow[c], vec_per_block, n0 + c, v, xv, acc[c][0]);
      } else {  // several rows: each decoded weight serves them all
        float wv[C][E];
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (c < cols) V::load(w, srow[c], vec_per_block, n0 + c, v, wv[c]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= rows) break;
          float xv[E];
          load_x<E>(xm + r * xs + v * E, x_vectors, xv);
#pragma unroll
          for (int c = 0; c < C; ++c)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[c][r] = fmaf(wv[c][e], xv[e], acc[c][r]);
        }
      }
    }
    for (int64_t k = nvec * E + tid; k < w.in; k += kThreads) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c >= cols) break;
        const float wk = weight_at<K>(w, srow[c], n0 + c, k);
        for (int r = 0; r < rows; ++r) acc[c][r] = fmaf(wk, __ldg(xm + r * xs + k), acc[c][r]);
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float s = warp_sum(acc[c][r]);
        if (lane == 0) part[warp][c][r] = s;
      }
    __syncthreads();
    if (tid < C * R) {
      const int c = tid / R, r = tid % R;
      if (c < cols && r < rows) {
        float s = part[0][c][r];
        for (int wi = 1; wi < kWarpsPerBlock; ++wi) s += part[wi][c][r];
        store_out(sink, y, ys, m0 + r, n0 + c, w.bias ? s + w.bias[n0 + c] : s);
      }
    }
    __syncthreads();
  }
}


// Block (column block, row chunk): the chunk's rows [blockIdx.y · rows_per_y, +rows_per_y) (row_chunks, launch.cuh).
template <WeightKind K, int C, int R, int U>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matmul_kernel(const float* __restrict__ x, int64_t M, int64_t xs, DeviceWeight w, float* __restrict__ y,
                  int64_t ys, bool vectors, bool x_vectors, int64_t rows_per_y, OutputSink sink) {
  if (blockIdx.y == 0) prefetch_weight_rows(w, int64_t(blockIdx.x) * C, C);  // (the row chunks share columns)
  begin_after_predecessor();
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_y;
  matmul_tile<K, C, R, U>(x + r0 * xs, M - r0 < rows_per_y ? M - r0 : rows_per_y, xs, w, y + r0 * ys, ys, vectors,
                          x_vectors, int64_t(blockIdx.x) * C, rows_from(sink, r0));
}

// Block (column block, expert e, row chunk z): the rows [first[e] + z · rows_per_z, +rows_per_z) of expert
// e's [first[e], first[e + 1]) against table[e], as matmul_kernel does (chunks past the expert's rows return).
template <WeightKind K, int C, int R, int U>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    grouped_matmul_kernel(const float* __restrict__ x, int64_t xs, const DeviceWeight* __restrict__ table,
                          const int32_t* __restrict__ first, float* __restrict__ y, int64_t ys, bool vectors,
                          bool x_vectors, int64_t rows_per_z) {
  begin_after_predecessor();
  const int64_t z0 = int64_t(blockIdx.z) * rows_per_z;
  const int64_t r0 = first[blockIdx.y] + z0, M = first[blockIdx.y + 1] - r0;
  if (M <= 0) return;
  matmul_tile<K, C, R, U>(x + r0 * xs, M < rows_per_z ? M : rows_per_z, xs, table[blockIdx.y], y + r0 * ys, ys,
                          vectors, x_vectors, int64_t(blockIdx.x) * C, OutputSink{});
}

template <WeightKind K, int C, int R, int U>
void launch_shape(const float* x, int64_t M, int64_t xs, const DeviceWeight& w, float* y, int64_t ys, bool vectors,
                  bool x_vectors, const OutputSink& sink) {
  const int64_t col_blocks = (w.out + C - 1) / C;
  const RowChunks rc = row_chunks(col_blocks, M, R);
  const dim3 grid(unsigned(col_blocks), rc.chunks), block(kWarpsPerBlock * 32);
  launch_kernel(matmul_kernel<K, C, R, U>, grid, block, 0, "matmul_kernel", x, M, xs, w, y, ys, vectors, x_vectors,
                rc.rows_per_chunk, sink);
}

// Whether environment variable `name` is set to `value` (the switches for measuring one path against another).
bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::string(e) == value;
}

// Environment variable `name` as an integer, or `otherwise` where it is unset or empty.
int64_t env_int64(const char* name, int64_t otherwise) {
  const char* e = std::getenv(name);
  return e && *e ? int64_t(std::atoll(e)) : otherwise;
}

template <WeightKind K>
void launch(const float* x, int64_t M, int64_t xs, const DeviceWeight& w, float* y, int64_t ys, bool vectors,
            bool x_vectors, const OutputSink& sink) {
  // (measured on the H200 with bench/cuda: a decode row reads bf16 best with 2 columns per block, FP8 with 4;
  // a matrix of a few long columns, the iHC mixes' 8 x 8192 in f32, takes a block per column and row with 4
  // vectors in flight per thread, at decode and verify widths: at 2-4 columns a block it was 2-4 blocks on
  // 132 SMs, the verify's rows in series in them)
  if (M <= 16 && w.out <= 64) return launch_shape<K, 1, 1, 4>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M == 1 && K == WeightKind::kFP8) return launch_shape<K, 4, 1, 2>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M == 1) return launch_shape<K, 2, 1, 2>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M == 2) return launch_shape<K, 2, 2, 2>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M <= 4) return launch_shape<K, 4, 4, 1>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  // (experiment switch, many rows: NEXTN_CUDA_WIDE_TILE=C,R of 8,8 / 4,16 / 8,4 instead of 4,8; each pass reads
  // x's R rows for C columns, and at 64 rows the x traffic, not the weights', may bound it)
  static const int wide = int(env_int64("NEXTN_CUDA_WIDE_TILE", 48));
  if (M > 8 && wide == 88) return launch_shape<K, 8, 8, 1>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M > 8 && wide == 416) return launch_shape<K, 4, 16, 1>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  if (M > 8 && wide == 84) return launch_shape<K, 8, 4, 1>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
  launch_shape<K, 4, 8, 1>(x, M, xs, w, y, ys, vectors, x_vectors, sink);
}

// ---- FP8 weights on the tensor cores ---------------------------------------------------------------------
//
// FP8 on CUDA cores spends about 3.5 instructions per weight byte (decode, scale, FMA) and reads at half the
// copy bandwidth; mma.sync m16n8k16 (f16 inputs, f32 accumulation) takes 16 x 16 weights x 8 rows a time.
// The weights go in as f16 (every e4m3 value is one, exactly; one conversion per two weights). x, whose
// fp32 values f16 cannot hold, goes in as hi + lo f16 pairs (22 significant bits) of x · 2^p, p per row and
// 64-k chunk putting the chunk's largest |x| in [2^14, 2^15) (so nothing overflows, and what underflows is
// below 2^-38 of that largest); each chunk's sum is then promoted: total += (sum · 2^-p) · block scale.
// A weight tile is 16 rows; the block's W warps take the chunks (64 or 128 k: MmaShape) c = warp, warp + W, ...
// and their sums are added in warp order, and a row's values never meet another row's (its p is its own), so a row gets
// the same bits whatever M, as in the kernel above.
// The split is made per pass by the whole block into shared memory when the pass's rows fit there (at M = 1,
// rows up to ~10k wide) and the block's warps have several chunks each (8-warp blocks), else by each warp at each
// chunk: the same function either way, so the same bits; made once, it leaves the chunk loop its weight
// conversions and MMAs (+5% decode on the 48-layer synthetic).
//
// Fragment layout (PTX ISA, mma.m16n8k16, lane = 4 g + t): A regs {row g, row g + 8} x {k 2t..2t+1,
// 2t+8..2t+9}; B regs k {2t..2t+1, 2t+8..2t+9} of column g; D {row g, g + 8} x {column 2t, 2t + 1}. The sum
// over k does not care which k goes where as long as A and B agree, so lane t of MMA j (j = 0..3 in a
// chunk) takes the weights' and x's elements 16t + 4j + {0, 1} and 16t + 4j + {2, 3}: every lane reads 16
// contiguous bytes of its rows and 16 contiguous floats of its x row per chunk.

constexpr int kMmaTileRows = 16;
constexpr int kMmaChunk = 64;
constexpr int kMmaCols = 8;  // activation rows per pass (the MMA's n)

__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned pair) {
  const __half2_raw h = fp8x2_to_half2(pair);
  return unsigned(h.x) | (unsigned(h.y) << 16);
}

__device__ __forceinline__ unsigned f16x2_bits(__half2 h) {
  const __half2_raw r = h;
  return unsigned(r.x) | (unsigned(r.y) << 16);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Weight bytes are brought in through shared memory with cp.async, stages - 1 chunks ahead of their use: the
// loads a warp can keep in flight in registers (one chunk) left DRAM at 40% of its peak with 2 blocks per SM.
// (MmaShape: 4 stages of 64-k chunks; 2 of 128-k ones, as 3 left one block an SM and read a fifth less.)

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// x's 16 floats of a lane (a quarter of one row's 64-k chunk; lanes 4g..4g + 3 hold the row's four) as hi + lo
// f16 pairs of x · 2^p, p putting the chunk's largest |x| in [2^14, 2^15); returns 2^-p. All four lanes of
// the row must call it together (they exchange their maxima).
__device__ __forceinline__ float split_x16(const float (&xv)[16], unsigned (&hi)[8], unsigned (&lo)[8]) {
  float mx = 0.f;
#pragma unroll
  for (int e = 0; e < 16; ++e) mx = fmaxf(mx, fabsf(xv[e]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const int ex = (__float_as_int(mx) >> 23) & 0xff;     // biased exponent: 0 for zero (and subnormals)
  const int p = ex == 0 ? 0 : min(max(141 - ex, -126), 126);  // 2^(ex - 127 + p) = 2^14
  const float up = __int_as_float((127 + p) << 23);
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float v0 = xv[2 * q] * up, v1 = xv[2 * q + 1] * up;
    const __half2 h = __floats2half2_rn(v0, v1);
    const float2 hf = __half22float2(h);
    hi[q] = f16x2_bits(h);
    lo[q] = f16x2_bits(__floats2half2_rn(v0 - hf.x, v1 - hf.y));
  }
  return __int_as_float((127 - p) << 23);
}

// The split of a pass's x rows, made once by the whole block into shared memory (split_bytes per row) when
// it fits, instead of by each warp at each of its chunks: for row r and chunk c, 32 hi words (lane quarter
// t's 8 at 8t), 32 lo words, at word r · split_row_words + c · 64; then the 2^-p of each (r, c).
// A row's words are split_row_words(chunks) apart: 4 more than its 64 a chunk, so that the lanes of two rows
// reading the same chunk in one 8-lane phase of a 16-byte load fall on different banks.
__host__ __device__ constexpr int64_t split_row_words(int64_t chunks) { return chunks * 64 + 4; }
__host__ __device__ constexpr int64_t split_bytes(int64_t in) {
  return (split_row_words(in / kMmaChunk) + in / kMmaChunk) * 4;
}

// The weights one launch multiplies x by (projections of the same rows): target i takes the column blocks
// [first_block[i], first_block[i + 1]) of the grid.
constexpr int kMaxMmaTargets = 6;
struct MmaTargets {
  DeviceWeight w[kMaxMmaTargets];
  float* y[kMaxMmaTargets];
  int64_t ys[kMaxMmaTargets];
  unsigned first_block[kMaxMmaTargets + 1];
  int n;
};

// How a block's warps read their weights: K bytes of each of a tile's 16 rows per warp chunk (64 or 128: a
// chunk is K / 64 sub-chunks of the MMAs' 64 k, each with its own split of x), kStages chunks through shared
// memory, and which lane copies which 16 bytes. 64-k chunks: each lane copies the pieces it later feeds its
// MMAs (rows g and g + 8, bytes 16 t: an instruction reads 64 bytes of 8 rows), so its own wait_group is all
// the sync needed. 128-k chunks (kRowPieces): 8 lanes copy one row's 128 bytes (an instruction reads 4 whole
// 128-byte lines), the lanes then read their pieces from a swizzled layout (piece p of row r at p ^ 4 (r & 1):
// conflict-free for the MMA order's reads), with a __syncwarp between copies and reads. The sums depend only
// on K (which warp takes which k), not on the copy pattern or the stages.
template <int TILES, int WARPS, int K, int STAGES = K == 64 ? 4 : 2>
struct MmaShape {
  static constexpr int kTiles = TILES, kWarps = WARPS, kChunk = K, kSub = K / kMmaChunk;
  static constexpr int kStages = STAGES;
  static constexpr bool kRowPieces = K == 128;
  static constexpr int kStageUint4 = TILES * kMmaTileRows * K / 16;  // a warp's staged weights per stage
  static constexpr int kRowPtrs = kRowPieces ? 4 : 2;                 // weight rows a lane copies from a tile
  static constexpr size_t kStagedBytes = size_t(WARPS) * kStages * kStageUint4 * 16;
  // x staged with the weights: [warp][stage][sub-chunk][lane < 4 rows][4] uint4, for up to kXStageRows rows
  static constexpr int kXStageRows = WARPS == 32 ? 1 : 4;
  static constexpr size_t x_stage_bytes(int rows) { return size_t(WARPS) * kStages * kSub * rows * 4 * 16 * 4; }
  static_assert(K == 64 || K == 128, "a chunk is one or two MMA sub-chunks");
};

// The 16-byte piece `p` of row `r` (of 16) in a tile's row-pieces stage.
__device__ __forceinline__ int row_piece(int r, int p) { return r * 8 + (p ^ ((r & 1) << 2)); }

// FRAGS: 8-row fragments of x a pass takes (1 for decode and verify; more for many sequences' rows and prompts,
// whose weights are then read once for up to 8 · FRAGS rows instead of once for every 8).
template <class S, int FRAGS>
__global__ void __launch_bounds__(S::kWarps * 32)
    fp8_mma_kernel(const __grid_constant__ MmaTargets targets, const float* __restrict__ x, int64_t M, int64_t xs,
                   bool x_vectors, int64_t rows_per_y, bool split_in_smem, OutputSink sink, int x_stage_rows) {
  constexpr int TILES = S::kTiles, WARPS = S::kWarps, STAGES = S::kStages, SUB = S::kSub;
  constexpr bool kRows = S::kRowPieces;
  int target = 0;
  while (target + 1 < targets.n && blockIdx.x >= targets.first_block[target + 1]) ++target;
  const DeviceWeight& w = targets.w[target];
  const int64_t ys = targets.ys[target];
  float* __restrict__ y = targets.y[target];
  {  // the block's row chunk (row_chunks)
    const int64_t r0 = int64_t(blockIdx.y) * rows_per_y;
    x += r0 * xs;
    y += r0 * ys;
    sink = rows_from(sink, r0);
    M = M - r0 < rows_per_y ? M - r0 : rows_per_y;
  }
  __shared__ float part[WARPS][TILES][kMmaTileRows][kMmaCols];
  // [warp][stage][S::kStageUint4] staged weights (MmaShape), then either the pass's split x (split_in_smem) or
  // x staged with the weights (x_stage_rows > 0, x_staged_with_weights)
  extern __shared__ uint4 dynamic_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  auto staged = [&](int stage, int tile) {
    return dynamic_smem + (int64_t(warp) * STAGES + stage) * S::kStageUint4 + tile * (S::kStageUint4 / TILES);
  };
  unsigned* split_words = reinterpret_cast<unsigned*>(dynamic_smem + int64_t(WARPS) * STAGES * S::kStageUint4);
  uint4* x_staged = dynamic_smem + int64_t(WARPS) * STAGES * S::kStageUint4;
  const int64_t n0 = int64_t(blockIdx.x - targets.first_block[target]) * (kMmaTileRows * TILES);
  const int64_t chunks = w.in / S::kChunk, subchunks = w.in / kMmaChunk;
  const int sbytes = scale_bytes(w);
  const unsigned subchunks_per_block = unsigned(w.block_in / kMmaChunk);
  const unsigned char* wrow[TILES][S::kRowPtrs];  // the rows this lane copies, at its bytes of a chunk
  const unsigned char* srow[TILES];
#pragma unroll
  for (int i = 0; i < TILES; ++i) {
    const int64_t n = n0 + kMmaTileRows * i, last = w.out - 1;  // (rows past the end read the last, unused)
#pragma unroll
    for (int j = 0; j < S::kRowPtrs; ++j) {
      const int64_t r = n + (kRows ? 4 * j + (lane >> 3) : g + 8 * j);
      wrow[i][j] = w.data + (r < last ? r : last) * w.row_stride + (kRows ? 16 * (lane & 7) : 16 * t);
    }
    srow[i] = scale_row(w, n < last ? n : last, sbytes);
  }
  const float* xrow = nullptr;  // this lane's x row in the current pass, when x is staged
  auto x_stage_at = [&](int stage, int sub) {
    return x_staged + (((int64_t(warp) * STAGES + stage) * SUB + sub) * x_stage_rows * 4 + lane) * 4;
  };
  auto stage_x = [&](int64_t c, int stage) {
    if (xrow && c < chunks)
#pragma unroll
      for (int h = 0; h < SUB; ++h)
#pragma unroll
        for (int j = 0; j < 4; ++j) cp_async_16(x_stage_at(stage, h) + j, xrow + c * S::kChunk + kMmaChunk * h + 4 * j);
  };
  auto stage_chunk = [&](int64_t c, int stage) {
    if (c < chunks)
#pragma unroll
      for (int i = 0; i < TILES; ++i) {
        uint4* dst = staged(stage, i);
#pragma unroll
        for (int j = 0; j < S::kRowPtrs; ++j) {
          if constexpr (kRows) {
            cp_async_16(dst + row_piece(4 * j + (lane >> 3), lane & 7), wrow[i][j] + c * S::kChunk);
          } else {  // (one sub-chunk)
            cp_async_16(dst + j * 32 + lane, wrow[i][j] + c * S::kChunk);
          }
        }
      }
    stage_x(c, stage);
    cp_async_commit();  // (an empty group past the end keeps the count wait_group relies on)
  };
  // This lane's A-fragment pieces of sub-chunk h of tile i: rows g and g + 8, bytes 16 t of the sub-chunk.
  auto weight_pieces = [&](int stage, int i, int h, uint4 (&wv)[2]) {
    const uint4* src = staged(stage, i);
    if constexpr (kRows) {
      wv[0] = src[row_piece(g, 4 * h + t)];
      wv[1] = src[row_piece(g + 8, 4 * h + t)];
    } else {  // (h = 0)
      wv[0] = src[lane];
      wv[1] = src[32 + lane];
    }
  };
  auto stage_first_chunks = [&] {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) stage_chunk(warp + int64_t(s) * WARPS, s);
  };
  // Weights only until the predecessor is done: the first pass's chunks staged, the block's rows asked of L2.
  if (M > 0) stage_first_chunks();
  if (blockIdx.y == 0) prefetch_weight_rows(w, n0, kMmaTileRows * TILES);
  begin_after_predecessor();
  constexpr int PASS = kMmaCols * FRAGS;  // x rows a pass over the block's weights multiplies
  for (int64_t m0 = 0; m0 < M; m0 += PASS) {
    const int rows = int(M - m0 < PASS ? M - m0 : PASS);
    const bool has_x = g < rows;
    const float* xr = x + (m0 + (has_x ? g : 0)) * xs + 16 * t;
    if (x_stage_rows > 0) {  // the first chunks' x (read only now, after the predecessor), then all landed
      xrow = has_x ? xr : nullptr;
      if (m0 > 0) {  // (the previous pass's reads of the stages ended at its __syncthreads)
        stage_first_chunks();
      } else {
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) stage_x(warp + int64_t(st) * WARPS, st);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    float total[FRAGS][TILES][4];
#pragma unroll
    for (int f = 0; f < FRAGS; ++f)
#pragma unroll
      for (int i = 0; i < TILES; ++i) total[f][i][0] = total[f][i][1] = total[f][i][2] = total[f][i][3] = 0.f;
    if (m0 > 0 && x_stage_rows == 0) stage_first_chunks();
    const int64_t row_words = split_row_words(subchunks);
    float* split_down = reinterpret_cast<float*>(split_words + int64_t(rows) * row_words);  // [rows][subchunks]
    if (split_in_smem) {  // item (r, c, quarter q) per thread, groups of 4 in a warp (padded: all shuffle)
      const int64_t items = int64_t(rows) * subchunks * 4, padded = (items + 255) / 256 * 256;
      for (int64_t i = threadIdx.x; i < padded; i += WARPS * 32) {
        const bool valid = i < items;
        const int64_t rc = valid ? i / 4 : 0, r = rc / subchunks, c = rc - r * subchunks;
        const int q = int(i & 3);
        float xv[16];
        if (valid) load_x<16>(x + (m0 + r) * xs + c * kMmaChunk + 16 * q, x_vectors, xv);
        else
#pragma unroll
          for (int e = 0; e < 16; ++e) xv[e] = 0.f;
        unsigned hi[8], lo[8];
        const float down = split_x16(xv, hi, lo);
        if (valid) {
          unsigned* out = split_words + r * row_words + c * 64 + 8 * q;
#pragma unroll
          for (int e = 0; e < 8; ++e) out[e] = hi[e], out[32 + e] = lo[e];
          if (q == 0) split_down[rc] = down;
        }
      }
      __syncthreads();
    }
    int stage = 0;
    for (int64_t c = warp; c < chunks; c += WARPS) {
      if constexpr (kRows) __syncwarp();  // (every lane's reads of the stage refilled now are done)
      stage_chunk(c + int64_t(STAGES - 1) * WARPS, (stage + STAGES - 1) % STAGES);
      cp_async_wait<STAGES - 1>();  // chunk c has landed
      if constexpr (kRows) __syncwarp();  // (and every lane's copies of it are visible to the warp)
      const int cur = stage;
      stage = (stage + 1) % STAGES;
#pragma unroll
      for (int h = 0; h < SUB; ++h) {
        const int64_t sc = c * SUB + h;  // the 64-k sub-chunk
        uint4 wv[TILES][2];
#pragma unroll
        for (int i = 0; i < TILES; ++i) weight_pieces(cur, i, h, wv[i]);
        // Each fragment (8 x rows, the MMA's n) meets the same weight pieces: a weight byte is read once a pass
        // for up to PASS rows, and a row's sums are those of a pass of its 8 alone (the MMA's outputs are
        // independent columns).
#pragma unroll
        for (int f = 0; f < FRAGS; ++f) {
          const int fr = kMmaCols * f;  // the fragment's first row in the pass
          if constexpr (FRAGS > 1)
            if (fr >= rows) break;  // (uniform over the block)
          const bool fx = fr + g < rows;
          unsigned hi[8], lo[8];
          float d0, d1;  // 2^-p of this lane's D columns (activation rows fr + 2t, fr + 2t + 1)
          if (split_in_smem) {
            if (fx) {
              const uint4* words =
                  reinterpret_cast<const uint4*>(split_words + (fr + g) * row_words + sc * 64 + 8 * t);
              const uint4 hw[2] = {words[0], words[1]}, lw[2] = {words[8], words[9]};
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                hi[4 * e] = hw[e].x, hi[4 * e + 1] = hw[e].y, hi[4 * e + 2] = hw[e].z, hi[4 * e + 3] = hw[e].w;
                lo[4 * e] = lw[e].x, lo[4 * e + 1] = lw[e].y, lo[4 * e + 2] = lw[e].z, lo[4 * e + 3] = lw[e].w;
              }
            } else {
#pragma unroll
              for (int e = 0; e < 8; ++e) hi[e] = lo[e] = 0u;
            }
            d0 = fr + 2 * t < rows ? split_down[int64_t(fr + 2 * t) * subchunks + sc] : 1.f;
            d1 = fr + 2 * t + 1 < rows ? split_down[int64_t(fr + 2 * t + 1) * subchunks + sc] : 1.f;
          } else {
            float xv[16];
            if (fx && x_stage_rows > 0) {
              const uint4* src = x_stage_at(cur, h);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const uint4 q = src[j];
                xv[4 * j] = __uint_as_float(q.x), xv[4 * j + 1] = __uint_as_float(q.y);
                xv[4 * j + 2] = __uint_as_float(q.z), xv[4 * j + 3] = __uint_as_float(q.w);
              }
            } else if (fx) {
              load_x<16>(xr + int64_t(fr) * xs + sc * kMmaChunk, x_vectors, xv);
            } else {
#pragma unroll
              for (int e = 0; e < 16; ++e) xv[e] = 0.f;
            }
            const float down = split_x16(xv, hi, lo);
            d0 = __shfl_sync(0xffffffffu, down, 8 * t);  // (from the lanes that hold those rows)
            d1 = __shfl_sync(0xffffffffu, down, 8 * t + 4);
          }
#pragma unroll
          for (int i = 0; i < TILES; ++i) {
            const unsigned wa[4] = {wv[i][0].x, wv[i][0].y, wv[i][0].z, wv[i][0].w};
            const unsigned wb[4] = {wv[i][1].x, wv[i][1].y, wv[i][1].z, wv[i][1].w};
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const unsigned a[4] = {fp8x2_to_f16x2(wa[j]), fp8x2_to_f16x2(wb[j]), fp8x2_to_f16x2(wa[j] >> 16),
                                     fp8x2_to_f16x2(wb[j] >> 16)};
              mma_f16(acc, a, lo[2 * j], lo[2 * j + 1]);
              mma_f16(acc, a, hi[2 * j], hi[2 * j + 1]);
            }
            const float s = scale_value(srow[i], w.scale_kind, unsigned(sc) / subchunks_per_block);
            total[f][i][0] = fmaf(acc[0] * d0, s, total[f][i][0]);
            total[f][i][1] = fmaf(acc[1] * d1, s, total[f][i][1]);
            total[f][i][2] = fmaf(acc[2] * d0, s, total[f][i][2]);
            total[f][i][3] = fmaf(acc[3] * d1, s, total[f][i][3]);
          }
        }
      }
    }
    cp_async_wait<0>();  // (the empty groups past the end: nothing is left in flight into the next pass)
    // The warps' partial sums, added in warp order, a fragment at a time (part holds one fragment's).
#pragma unroll
    for (int f = 0; f < FRAGS; ++f) {
      const int fr = kMmaCols * f;
      if constexpr (FRAGS > 1)
        if (fr >= rows) break;  // (uniform over the block)
#pragma unroll
      for (int i = 0; i < TILES; ++i) {
        part[warp][i][g][2 * t] = total[f][i][0];
        part[warp][i][g][2 * t + 1] = total[f][i][1];
        part[warp][i][g + 8][2 * t] = total[f][i][2];
        part[warp][i][g + 8][2 * t + 1] = total[f][i][3];
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < TILES * kMmaTileRows * kMmaCols; idx += WARPS * 32) {
        const int i = idx / (kMmaTileRows * kMmaCols), r = idx / kMmaCols % kMmaTileRows, m = idx % kMmaCols;
        const int64_t n = n0 + kMmaTileRows * i + r;
        if (fr + m >= rows || n >= w.out) continue;
        float sum = part[0][i][r][m];
        for (int wi = 1; wi < WARPS; ++wi) sum += part[wi][i][r][m];
        store_out(sink, y, ys, m0 + fr + m, n, w.bias ? sum + w.bias[n] : sum);
      }
      __syncthreads();
    }
  }
}

constexpr size_t kMmaSplitSmemBytes = 40 * 1024;  // a pass's split x in shared memory up to this size

// Whether a launch stages x through the cp.async pipeline with the weights (each warp then splits its own
// chunks' x, as the 32-warp blocks always do) instead of splitting the pass's rows into shared memory before
// its first chunk (8-warp blocks) or loading x from global memory at each chunk (32-warp blocks). The split
// of a block's rows is a prologue that grows with M, and a chunk's x read from L2 a latency each warp waits
// on; staged, both move into the weights' stream. Measured on an H100 (docs/performance.md, thirty-third
// session), the same bits either way: 18432 x 7168 at M = 2 / 4 +13% / +15%, 7168 x 18432 at M = 1 / 2 / 4
// +13% / +9% / +2%, 4096 x 14336 (32 warps) at M = 1 +5%, but 2048 x 5632 (32 warps) at M = 1 -4%: so up to
// 4 x rows in 8-warp blocks, and 1 in 32-warp ones (their shared memory bounds it) with rows of 8192 or more.
// (NEXTN_CUDA_FP8_STAGE_X=0 turns it off, for measuring one against the other.)
template <int WARPS>
bool x_staged_with_weights(int64_t in, int64_t M, bool x_vectors) {
  static const bool off = env_is("NEXTN_CUDA_FP8_STAGE_X", "0");
  return !off && x_vectors && (WARPS == 32 ? M == 1 && in >= 8192 : M <= 4);
}

// 8-row fragments a pass of M rows takes (fp8_mma_kernel's FRAGS): 1 up to 8 rows (decode, verify: the
// pipeline's shapes were tuned there), else 4 (2 for 64-k chunks, which spill registers at 4): a pass then
// reads its weights once for up to 32 rows, where passes of 8 read them M / 8 times (64 sequences' rows: 8
// times; a 1000-token prompt: 125 times). The narrow matrices' 1024-thread blocks keep 1 (64 registers a thread
// spill at 2; their weights, a few MB, stay in L2 between passes). No bit depends on it.
// (Not yet run on a GPU: off unless NEXTN_CUDA_FP8_FRAGS=2 or 4 asks for at most that many.)
template <class S>
int mma_frags(int64_t M) {
  static const int64_t most = env_int64("NEXTN_CUDA_FP8_FRAGS", 1);
  if (M <= kMmaCols || most <= 1 || S::kWarps == 32) return 1;
  return S::kChunk == 64 || most == 2 ? 2 : 4;
}

template <class S, int FRAGS>
void launch_fp8_mma_pass(const MmaTargets& targets, const float* x, int64_t M, int64_t xs, bool x_vectors,
                         const OutputSink& sink) {
  constexpr int WARPS = S::kWarps;
  static const bool configured = [] {  // (over the 48 KB a launch may take without asking)
    check(cudaFuncSetAttribute(fp8_mma_kernel<S, FRAGS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(S::kStagedBytes + std::max(kMmaSplitSmemBytes, S::x_stage_bytes(S::kXStageRows)))),
          "cudaFuncSetAttribute");
    return true;
  }();
  (void)configured;
  const RowChunks rc = row_chunks(targets.first_block[targets.n], M, kMmaCols * FRAGS);
  const dim3 grid(targets.first_block[targets.n], rc.chunks);
  // (where the split is made changes no bit of it: split_x16 either way) The 32-warp blocks of the narrow
  // matrices split per warp: their warps have 1-3 chunks each, and the block's split had every warp wait at a
  // barrier for the eighth of the block that split a row (22% of their stall samples; 261 -> 265 tok/s).
  // Passes of several fragments split per warp too (their rows' split would not fit).
  const size_t split = size_t(std::min<int64_t>(M, kMmaCols) * split_bytes(targets.w[0].in));
  const int x_stage_rows = FRAGS == 1 && x_staged_with_weights<WARPS>(targets.w[0].in, M, x_vectors) ? int(M) : 0;
  const bool split_in_smem = FRAGS == 1 && split <= kMmaSplitSmemBytes && WARPS != 32 && x_stage_rows == 0;
  launch_kernel(fp8_mma_kernel<S, FRAGS>, grid, dim3(WARPS * 32),
                S::kStagedBytes + (split_in_smem ? split : 0) + S::x_stage_bytes(x_stage_rows), "fp8_mma_kernel",
                targets, x, M, xs, x_vectors, rc.rows_per_chunk, split_in_smem, sink, x_stage_rows);
}

template <class S>
void launch_fp8_mma_tiles(const MmaTargets& targets, const float* x, int64_t M, int64_t xs, bool x_vectors,
                          const OutputSink& sink) {
  const int frags = mma_frags<S>(M);  // (only the fragment counts mma_frags gives S are compiled)
  if constexpr (S::kWarps == 32) {
    launch_fp8_mma_pass<S, 1>(targets, x, M, xs, x_vectors, sink);
  } else if (frags == 1) {
    launch_fp8_mma_pass<S, 1>(targets, x, M, xs, x_vectors, sink);
  } else if constexpr (S::kChunk == 64) {
    launch_fp8_mma_pass<S, 2>(targets, x, M, xs, x_vectors, sink);
  } else if (frags == 2) {
    launch_fp8_mma_pass<S, 2>(targets, x, M, xs, x_vectors, sink);
  } else {
    launch_fp8_mma_pass<S, 4>(targets, x, M, xs, x_vectors, sink);
  }
}

// Whether a weight takes the tensor-core path: whole 64-k chunks inside scale blocks, 16-row tiles inside
// scale rows, 16-byte aligned rows. Chosen by the weight alone (never by M), so that every row of every
// call on it runs the same instructions.
bool fp8_mma_takes(const DeviceWeight& w) {
  static const bool off = env_is("NEXTN_CUDA_FP8_MMA", "0");
  return !off && w.in % kMmaChunk == 0 && w.block_in % kMmaChunk == 0 && w.block_out % kMmaTileRows == 0 &&
         w.scale_row0 % kMmaTileRows == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_stride % 16 == 0;
}

// The shape of a weight's tensor-core launches (MmaShape), which sets the order of its sums (which warp takes
// which k): chosen by the weight's shape alone, so that a weight's outputs have the same bits in every launch.
// A matrix too narrow to give half the SMs a 2-tile block (the attention's narrower projections, a small
// model's MLP down projection) runs one block of 32 warps a tile (1024 threads; 1 tile a block, as 2 need more registers than
// that leaves) over 64-k chunks, a wide one 8 warps a block (2 blocks an SM at 128 registers a thread). At M = 1
// on the H200: 2048 x 5632 read 0.24 / 0.29 / 0.32 of the copy bandwidth with 8 / 16 / 32 warps, 2048 x 2048
// 0.18 / 0.21 / 0.21; 11264 x 2048 0.42 with 8 and 0.37 with 16 (docs/performance.md, twenty-fourth session).
// Where the scale blocks are 128 wide, a wide matrix's warps read 128-k chunks as whole 128-byte lines (row
// pieces, 2 stages): on an H100 at M = 1 / 2 / 4, 7168 x 18432 read 0.79 / 0.77 / 0.70 of the copy bandwidth
// with 64-k chunks and 0.86 / 0.85 / 0.75 so, 18432 x 7168 0.71 / 0.71 / 0.65 and 0.73 / 0.72 / 0.68; own
// pieces of 128-k chunks gained half as much; 3 stages (1 block an SM), 4 tiles a block, or 4 warps lost 5-30%
// (docs/performance.md, thirty-fourth session). Narrow matrices read them too where rows are 8192 or more wide
// (each of the 32 warps then has 2+ chunks): 4096 x 14336 and 2048 x 16384 +9% / +10% at M = 1, 2-8% at M = 2-4;
// narrower rows keep 64-k chunks. NEXTN_CUDA_FP8_CHUNK=64 gives every weight 64-k chunks (for measuring).
// A weight's launch shape: tiles a block, warps a block, k a chunk, stages. Only the warps and the chunk set
// the order of its sums; the tiles and the stages change no bit.
struct MmaKind {
  int tiles, warps, chunk, stages;
  bool operator==(const MmaKind& o) const {
    return tiles == o.tiles && warps == o.warps && chunk == o.chunk && stages == o.stages;
  }
  bool operator!=(const MmaKind& o) const { return !(*this == o); }
};

// (experiment switch) NEXTN_CUDA_FP8_MEDIUM="tiles,warps,chunk,stages": the shape of the wide weights of fewer
// than NEXTN_CUDA_FP8_MEDIUM_BYTES (default 64 MiB) bytes; NEXTN_CUDA_FP8_NARROW likewise for the narrow ones.
std::optional<MmaKind> env_kind(const char* name) {
  const char* e = std::getenv(name);
  MmaKind k{};
  if (!e || std::sscanf(e, "%d,%d,%d,%d", &k.tiles, &k.warps, &k.chunk, &k.stages) != 4) return std::nullopt;
  return k;
}

MmaKind mma_kind(const DeviceWeight& w) {
  static const bool only64 = env_is("NEXTN_CUDA_FP8_CHUNK", "64");
  const bool lines = !only64 && w.in % 128 == 0 && w.block_in % 128 == 0;
  // (until the thirty-sixth session the bound was a 2-tile block for every SM, 4224 rows on 132 SMs; half of that
  // decodes 2% faster at hidden 7168, whose output gate and q_a projections, 3584 and 2688 rows, then run 8-warp
  // blocks: in the grouped narrow launch they read 0.33 of the copy bandwidth. NEXTN_CUDA_FP8_NARROW_ROWS sets
  // another bound, for measuring.)
  static const int64_t narrow_below =
      env_int64("NEXTN_CUDA_FP8_NARROW_ROWS", kMmaTileRows * int64_t(multiprocessors()));
  static const std::optional<MmaKind> medium = env_kind("NEXTN_CUDA_FP8_MEDIUM");
  static const std::optional<MmaKind> narrow = env_kind("NEXTN_CUDA_FP8_NARROW");
  static const int64_t medium_below = env_int64("NEXTN_CUDA_FP8_MEDIUM_BYTES", int64_t(64) << 20);
  if (w.out < narrow_below) {
    if (narrow && (narrow->chunk == 64 || lines)) return *narrow;
    return lines && w.in >= 8192 ? MmaKind{1, 32, 128, 2} : MmaKind{1, 32, 64, 4};
  }
  if (medium && w.out * w.in < medium_below && (medium->chunk == 64 || lines)) return *medium;
  return lines ? MmaKind{2, 8, 128, 2} : MmaKind{2, 8, 64, 4};
}

// One launch for up to kMaxMmaTargets weights of x's width (each taking the tensor-core path) and one MmaKind
// (matmul_many groups them so): wide weights 2 tiles a block of 8 warps (1 and 4 tiles measured slower on large
// matrices: docs/performance.md, "Fourteenth session"), narrow ones 1 tile a block of 32 warps (with 2 the
// attention's 0.6-2 MB projections ran on 9-48 blocks of 132). A tile's sums depend neither on the tiles beside
// it nor on the weights sharing the launch: every output gets the bits of its own one-weight launch. A sink
// applies to the first weight's outputs (a launch of one weight: cuda::matmul's).
void launch_fp8_mma(const float* x, int64_t M, int64_t xs, const DeviceWeight* const* w, float* const* y,
                    const int64_t* ys, int n, bool x_vectors, const OutputSink& sink = {}) {
  MmaTargets targets{};
  targets.n = n;
  const MmaKind kind = mma_kind(*w[0]);
  const int64_t rows_per_block = kind.tiles * kMmaTileRows;
  unsigned blocks = 0;
  for (int i = 0; i < n; ++i) {
    targets.w[i] = *w[i];
    targets.y[i] = y[i];
    targets.ys[i] = ys[i];
    targets.first_block[i] = blocks;
    blocks += unsigned((w[i]->out + rows_per_block - 1) / rows_per_block);
  }
  targets.first_block[n] = blocks;
  auto go = [&](auto shape) { launch_fp8_mma_tiles<decltype(shape)>(targets, x, M, xs, x_vectors, sink); };
  const auto is = [&](int t, int wp, int c, int st) { return kind == MmaKind{t, wp, c, st}; };
  if (is(1, 32, 64, 4)) go(MmaShape<1, 32, 64>{});
  else if (is(1, 32, 128, 2)) go(MmaShape<1, 32, 128>{});
  else if (is(2, 8, 64, 4)) go(MmaShape<2, 8, 64>{});
  else if (is(2, 8, 128, 2)) go(MmaShape<2, 8, 128>{});
  else if (is(1, 8, 128, 2)) go(MmaShape<1, 8, 128, 2>{});
  else if (is(1, 8, 128, 3)) go(MmaShape<1, 8, 128, 3>{});
  else if (is(1, 8, 128, 4)) go(MmaShape<1, 8, 128, 4>{});
  else if (is(2, 8, 128, 3)) go(MmaShape<2, 8, 128, 3>{});
  else if (is(1, 16, 128, 2)) go(MmaShape<1, 16, 128, 2>{});
  else if (is(1, 16, 64, 4)) go(MmaShape<1, 16, 64, 4>{});
  else if (is(1, 8, 64, 4)) go(MmaShape<1, 8, 64, 4>{});
  else throw Error("cuda: no FP8 kernel of the shape NEXTN_CUDA_FP8_MEDIUM / NARROW ask for");
}

// ---- RMSNorm ---------------------------------------------------------------------------------------------

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* __restrict__ x, int64_t d, const float* __restrict__ weight, float eps,
                    float* __restrict__ out) {
  begin_after_predecessor();
  __shared__ float part[kNormThreads];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  float s = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += kNormThreads) s = fmaf(xr[k], xr[k], s);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = kNormThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(part[0] / float(d) + eps);
  for (int64_t k = threadIdx.x; k < d; k += kNormThreads) o[k] = weight ? xr[k] * inv * weight[k] : xr[k] * inv;
}

struct CopyArgs {
  void* dst;
  const void* src;
  size_t bytes;
};

}  // namespace

// ---- device and memory -----------------------------------------------------------------------------------

bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no usable CUDA driver or device: ") + cudaGetErrorString(e)
                                     : std::string("no CUDA device");
    return false;
  }
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  if (p.major < 9) {
    if (why) *why = std::string("the kernels are built for sm_90 (Hopper); device 0 is ") + p.name;
    return false;
  }
  return true;
}

std::string device_name() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

size_t free_memory() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) check(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) throw Error("DeviceBuffer::upload: past the end of the buffer");
  check(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice), "upload");
}
void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) throw Error("DeviceBuffer::download: past the end of the buffer");
  check(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost), "download");
}

// rows rows of `bytes` bytes, `stride` bytes apart at host, packed into buf (one copy when they are contiguous).
static void upload_rows(DeviceBuffer& buf, const void* host, int64_t rows, size_t bytes, size_t stride) {
  if (stride == bytes) {
    buf.upload(host, size_t(rows) * bytes);
    return;
  }
  check(cudaMemcpy2D(buf.get(), bytes, host, stride, bytes, size_t(rows), cudaMemcpyHostToDevice), "upload");
}

DeviceLinear upload(const Linear& w) {
  const size_t es = elem_size(w.dtype);
  if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F8_E4M3)
    throw Error(std::string("cuda::upload: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  if (w.out <= 0 || w.in <= 0 || w.row_stride < w.in) throw Error("cuda::upload: bad weight shape");
  DeviceLinear d;
  d.w = w;
  // A column slice (a row-parallel shard's part: row_stride > in) is stored compact, its rows and its scale
  // rows packed: the device holds this rank's columns only.
  d.w.row_stride = w.in;
  d.data = DeviceBuffer(size_t(w.out * w.in) * es);
  upload_rows(d.data, w.data, w.out, size_t(w.in) * es, size_t(w.row_stride) * es);
  d.w.data = d.data.get();
  if (w.dtype == DType::F8_E4M3) {
    if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::BF16 && w.scale_dtype != DType::F8_E8M0)
      throw Error(std::string("cuda::upload: FP8 scales of dtype ") + dtype_name(w.scale_dtype) + " are not supported");
    const int64_t cols = w.block_in > 0 ? (w.in + w.block_in - 1) / w.block_in : 0;
    if (w.block_out <= 0 || w.block_in <= 0 || w.scale_cols < cols) throw Error("cuda::upload: bad FP8 block scales");
    const int64_t scale_rows = (w.scale_row0 + w.out + w.block_out - 1) / w.block_out;
    const size_t ses = elem_size(w.scale_dtype);
    d.w.scale_cols = cols;
    d.scale = DeviceBuffer(size_t(scale_rows * cols) * ses);
    upload_rows(d.scale, w.scale, scale_rows, size_t(cols) * ses, size_t(w.scale_cols) * ses);
    d.w.scale = d.scale.get();
  }
  if (w.bias) {
    d.bias = DeviceBuffer(size_t(w.out) * 4);
    d.bias.upload(w.bias, size_t(w.out) * 4);
    d.w.bias = d.bias.f32();
  }
  return d;
}

// ---- ops -------------------------------------------------------------------------------------------------

void matmul(const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride, int64_t y_stride,
            const OutputSink& sink) {
  if (M <= 0) return;
  const int64_t xs = x_stride < 0 ? w.in : x_stride, ys = y_stride < 0 ? w.out : y_stride;
  const DeviceWeight dw = device_weight(w);
  const size_t es = elem_size(w.dtype);
  const int64_t elems = int64_t(kVecBytes / es);
  // 16-byte weight loads need aligned rows; an FP8 vector must sit inside one scale block.
  const bool vectors = reinterpret_cast<uintptr_t>(w.data) % kVecBytes == 0 && (w.row_stride * int64_t(es)) % kVecBytes == 0 &&
                       (w.dtype != DType::F8_E4M3 || w.block_in % elems == 0);
  // float4 loads of x need 16-byte aligned rows (they change no value: the products are summed in the same order).
  const bool x_vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0;
  // The launch shape follows M (launch()): for verify rows, more columns share x and rows share the weights.
  switch (w.dtype) {
    case DType::F32: launch<WeightKind::kF32>(x, M, xs, dw, y, ys, vectors, x_vectors, sink); break;
    case DType::BF16: launch<WeightKind::kBF16>(x, M, xs, dw, y, ys, vectors, x_vectors, sink); break;
    case DType::F8_E4M3:
      if (fp8_mma_takes(dw)) {
        const DeviceWeight* one = &dw;
        launch_fp8_mma(x, M, xs, &one, &y, &ys, 1, x_vectors, sink);
      } else {
        launch<WeightKind::kFP8>(x, M, xs, dw, y, ys, vectors, x_vectors, sink);
      }
      break;
    default: throw Error(std::string("cuda::matmul: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  }
}

void matmul_many(const float* x, int64_t M, const ops::MatmulOut* outs, int64_t n_outs) {
  if (M <= 0) return;
  DeviceWeight descs[kMaxMmaTargets]{};
  const DeviceWeight* group[kMaxMmaTargets];
  float* ys[kMaxMmaTargets];
  int64_t strides[kMaxMmaTargets];
  int n = 0;
  auto launch_group = [&] {
    if (n == 0) return;
    const int64_t in = descs[0].in;
    launch_fp8_mma(x, M, in, group, ys, strides, n, reinterpret_cast<uintptr_t>(x) % 16 == 0 && in % 4 == 0);
    n = 0;
  };
  for (int64_t i = 0; i < n_outs; ++i) {
    const ops::MatmulOut& o = outs[i];
    const DeviceWeight d = device_weight(*o.w);
    if (o.w->dtype != DType::F8_E4M3 || !fp8_mma_takes(d) ||
        (n > 0 && (d.in != descs[0].in || mma_kind(d) != mma_kind(descs[0])))) {
      matmul(x, M, *o.w, o.y, -1, o.y_stride);
      continue;
    }
    if (n == kMaxMmaTargets) launch_group();
    descs[n] = d;
    group[n] = &descs[n];
    ys[n] = o.y;
    strides[n] = o.y_stride < 0 ? d.out : o.y_stride;
    ++n;
  }
  launch_group();
}

WeightTable weight_table(const Linear* const* weights, int64_t n) {
  if (n <= 0) throw Error("cuda::weight_table: no weights");
  WeightTable t;
  t.shape = *weights[0];
  t.count = n;
  const size_t es = elem_size(t.shape.dtype);
  t.vectors = es > 0;
  std::vector<DeviceWeight> d;
  for (int64_t e = 0; e < n; ++e) {
    const Linear& w = *weights[e];
    if (w.dtype != t.shape.dtype || w.out != t.shape.out || w.in != t.shape.in || w.scale_dtype != t.shape.scale_dtype)
      throw Error("cuda::weight_table: the weights differ in shape or dtype");
    // 16-byte weight loads need aligned rows; an FP8 vector must sit inside one scale block.
    t.vectors = t.vectors && reinterpret_cast<uintptr_t>(w.data) % kVecBytes == 0 &&
                (w.row_stride * int64_t(es)) % kVecBytes == 0 &&
                (w.dtype != DType::F8_E4M3 || w.block_in % int64_t(kVecBytes / es) == 0);
    d.push_back(device_weight(w));
  }
  t.descriptors = DeviceBuffer(d.size() * sizeof(DeviceWeight));
  t.descriptors.upload(d.data(), t.descriptors.bytes());
  return t;
}

void grouped_matmul(const float* x, const WeightTable& t, const int32_t* first, int64_t rows, float* y,
                    int64_t x_stride, int64_t y_stride) {
  if (rows <= 0) return;
  const Linear& w = t.shape;
  const int64_t xs = x_stride < 0 ? w.in : x_stride, ys = y_stride < 0 ? w.out : y_stride;
  const bool x_vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0;
  constexpr int C = 4, R = 4;
  // Row chunks sized for an even spread (rows / experts each), at most 8 passes: the split is decided on the
  // host, which does not know how the rows fall, so grid.z covers all rows falling to one expert (rows_per_z x
  // gridDim.z >= rows) and the chunks past an expert's rows return at once.
  constexpr int64_t kMaxChunkRows = 8 * R;
  const int64_t col_blocks = (w.out + C - 1) / C;
  const RowChunks even = row_chunks(col_blocks * t.count, (rows + t.count - 1) / t.count, R);
  const int64_t per = std::min(even.rows_per_chunk, kMaxChunkRows);
  const dim3 grid(unsigned(col_blocks), unsigned(t.count), unsigned(std::min<int64_t>((rows + per - 1) / per, 65535)));
  const dim3 block(kWarpsPerBlock * 32);
  if (int64_t(grid.z) * per < rows) throw Error("cuda::grouped_matmul: too many rows for one launch");
  const auto* table = static_cast<const DeviceWeight*>(t.descriptors.get());
  switch (w.dtype) {
    case DType::F32:
      launch_kernel(grouped_matmul_kernel<WeightKind::kF32, C, R, 1>, grid, block, 0, "grouped_matmul_kernel", x, xs,
                    table, first, y, ys, t.vectors, x_vectors, per);
      break;
    case DType::BF16:
      launch_kernel(grouped_matmul_kernel<WeightKind::kBF16, C, R, 1>, grid, block, 0, "grouped_matmul_kernel", x, xs,
                    table, first, y, ys, t.vectors, x_vectors, per);
      break;
    case DType::F8_E4M3:
      launch_kernel(grouped_matmul_kernel<WeightKind::kFP8, C, R, 1>, grid, block, 0, "grouped_matmul_kernel", x, xs,
                    table, first, y, ys, t.vectors, x_vectors, per);
      break;
    default: throw Error(std::string("cuda::grouped_matmul: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  }
}

void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, float eps, float* out) {
  if (rows <= 0) return;
  launch_kernel(rms_norm_kernel, unsigned(rows), kNormThreads, 0, "rms_norm_kernel", x, d, weight, eps, out);
}

void synchronize() { check(cudaDeviceSynchronize(), "kernel"); }

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}
Graph::Graph(Graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}
void Graph::launch() const {
  if (!exec_) throw Error("cuda::Graph::launch: an empty graph");
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cudaStreamPerThread), "graph launch");
}

namespace {

// The thread's side stream and the events that fork it from and join it to the thread's stream (created on
// first use and kept for the thread's life: CUDA may be torn down before thread-local destructors run).
struct BranchState {
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
  bool in_side = false;
  bool join_owed = false;  // (a branch ended and not yet joined)
};
BranchState& branch_state() {
  thread_local BranchState s;
  return s;
}

void close_branch() {
  branch_state().in_side = false;
  branch_state().join_owed = false;
}

}  // namespace

void* launch_stream() {
  const BranchState& b = branch_state();
  return b.in_side ? b.side : cudaStreamPerThread;
}

std::atomic<bool>& branches_switch() {
  static std::atomic<bool> on{!env_is("NEXTN_CUDA_BRANCHES", "0")};  // (on unless turned off)
  return on;
}
bool branches_on() { return branches_switch().load(std::memory_order_relaxed); }
void set_branches(bool on) { branches_switch().store(on, std::memory_order_relaxed); }

void branch_begin() {
  if (!branches_on()) return;
  BranchState& b = branch_state();
  if (b.in_side) close_branch();  // (one left open by a forward that threw: this forward starts afresh)
  if (!b.side) {
    check(cudaStreamCreate(&b.side), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&b.forked, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaEventRecord(b.forked, cudaStreamPerThread), "cudaEventRecord");
  check(cudaStreamWaitEvent(b.side, b.forked, 0), "cudaStreamWaitEvent");
  b.in_side = true;
}

void branch_end() {
  BranchState& b = branch_state();
  if (!b.in_side) return;  // (branches off when it began)
  b.in_side = false;
  b.join_owed = true;
  check(cudaEventRecord(b.done, b.side), "cudaEventRecord");
}

void branch_join() {
  BranchState& b = branch_state();
  if (b.in_side) throw Error("cuda::branch_join: the branch was not ended");
  if (!b.join_owed) return;
  b.join_owed = false;
  check(cudaStreamWaitEvent(cudaStreamPerThread, b.done, 0), "cudaStreamWaitEvent");
}

void begin_capture() {
  close_branch();  // (one left open by a forward that threw)
  check(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal), "begin capture");
}

Graph end_capture() {
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(cudaStreamPerThread, &g), "end capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check(e, "graph instantiate");
  Graph out;
  out.exec_ = exec;
  return out;
}

void abandon_capture() {
  close_branch();  // (one left open by a forward that threw)
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cudaStreamPerThread, &status) != cudaSuccess || status == cudaStreamCaptureStatusNone) return;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(cudaStreamPerThread, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // (the capture's error, if it broke, is not the next caller's)
}

double time_device(int iters, void (*fn)(void*), void* arg) {
  fn(arg);
  synchronize();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) fn(arg);
  check(cudaEventRecord(b), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3 / std::max(iters, 1);
}

double copy_bandwidth_gbps(size_t bytes, int iters) {
  const size_t half = bytes / 2;
  DeviceBuffer buf(2 * half);
  check(cudaMemset(buf.get(), 1, 2 * half), "cudaMemset");
  CopyArgs args{buf.get(), static_cast<char*>(buf.get()) + half, half};
  const double s = time_device(iters, [](void* p) {
    auto* a = static_cast<CopyArgs*>(p);
    check(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  }, &args);
  return 2.0 * double(half) / s / 1e9;
}

}  // namespace nextn::cuda
