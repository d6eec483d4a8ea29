// CPU matmul over checkpoint weights (F32, BF16, F16, F8_E4M3 + block scales), batch invariant.
//
// Every output element y[m][n] is produced by one dot-product routine whatever M, the tile it falls in,
// or the thread count:
//   * 16 independent fp32 lanes: lane j accumulates fma(x[k], w[k], lane) for k ≡ j (mod 16), k increasing;
//   * the k tail (K mod 16 elements) is loaded zero-padded into the same lanes (depends only on K);
//   * lanes are summed by a fixed tree: v[j] = l[j] + l[j+8] (j < 8), s[j] = v[j] + v[j+4] (j < 4),
//     t[j] = s[j] + s[j+2] (j < 2), dot = t[0] + t[1]; then y = dot + bias[n].
// The weight is dequantized to fp32 first (x·w products then use exactly the same fp32 weight values as
// dequant_row). Register tiles cover several x rows and weight rows at once, but each element keeps its
// own accumulators, so tiling never changes a value. Threads split the output columns (weight rows).
// The AVX2 path and the portable fallback compute bit-identical results (FMA is exactly rounded).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "ops/ops.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define NEXTN_MATMUL_AVX2 1
#include <immintrin.h>
#endif

namespace nextn {

namespace {

int64_t stride_of(const Linear& w) { return w.row_stride > 0 ? w.row_stride : w.in; }

int64_t scale_cols_of(const Linear& w) {
  return w.scale_cols > 0 ? w.scale_cols : (w.in + w.block_in - 1) / w.block_in;
}

void check_supported(const Linear& w, const char* what) {
  switch (w.dtype) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
      return;
    case DType::F8_E4M3:
      if (w.scale == nullptr) throw Error(std::string(what) + ": F8_E4M3 weight without block scales");
      if (w.block_out <= 0 || w.block_in <= 0)
        throw Error(std::string(what) + ": F8_E4M3 weight with non-positive scale block size");
      if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::BF16 && w.scale_dtype != DType::F8_E8M0)
        throw Error(std::string(what) + ": unsupported FP8 scale dtype " + dtype_name(w.scale_dtype));
      return;
    default:
      throw Error(std::string(what) + ": unsupported weight dtype " + dtype_name(w.dtype));
  }
}

const float* fp8_lut() {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return lut.data();
}

float load_scale(const Linear& w, int64_t idx) {
  switch (w.scale_dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, static_cast<const unsigned char*>(w.scale) + idx * 4, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t v;
      std::memcpy(&v, static_cast<const unsigned char*>(w.scale) + idx * 2, 2);
      return bf16_to_f32(v);
    }
    default:  // F8_E8M0 (checked by check_supported)
      return e8m0_to_f32(static_cast<const uint8_t*>(w.scale)[idx]);
  }
}

// ---- row conversion -------------------------------------------------------------------------------

void bf16_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef NEXTN_MATMUL_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void f16_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef NEXTN_MATMUL_AVX2
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// dst[i] = lut[src[i]] * scale (one fp32 multiply, same in both paths).
void fp8_row(const uint8_t* src, float* dst, int64_t n, float scale, const float* lut) {
  int64_t i = 0;
#ifdef NEXTN_MATMUL_AVX2
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    const __m256 v = _mm256_i32gather_ps(lut, _mm256_cvtepu8_epi32(b), 4);
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(v, s));
  }
#endif
  for (; i < n; ++i) dst[i] = lut[src[i]] * scale;
}

// Row r of w as fp32 into out[w.in]. w has been checked.
void dequant_row_impl(const Linear& w, int64_t r, float* out) {
  const int64_t K = w.in;
  const unsigned char* base = static_cast<const unsigned char*>(w.data);
  const int64_t off = r * stride_of(w);
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(out, base + off * 4, static_cast<size_t>(K) * 4);
      return;
    case DType::BF16:
      bf16_row(reinterpret_cast<const uint16_t*>(base + off * 2), out, K);
      return;
    case DType::F16:
      f16_row(reinterpret_cast<const uint16_t*>(base + off * 2), out, K);
      return;
    case DType::F8_E4M3: {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(base + off);
      const float* lut = fp8_lut();
      const int64_t srow = ((w.scale_row0 + r) / w.block_out) * scale_cols_of(w);
      for (int64_t c0 = 0, b = 0; c0 < K; c0 += w.block_in, ++b) {
        const int64_t c1 = std::min(K, c0 + w.block_in);
        fp8_row(src + c0, out + c0, c1 - c0, load_scale(w, srow + b), lut);
      }
      return;
    }
    default:
      throw Error(std::string("dequant_row: unsupported weight dtype ") + dtype_name(w.dtype));
  }
}

// ---- the dot-product tile ---------------------------------------------------------------------------
//
// dot_tile<MT, NT>: out[i][j] = dot(xs[i], ws[j]) over K, for MT x rows and NT fp32 weight rows.

#ifdef NEXTN_MATMUL_AVX2

inline float lane_sum(__m256 lo8, __m256 hi8) {
  const __m256 v = _mm256_add_ps(lo8, hi8);                                             // l[j] + l[j+8]
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // v[j] + v[j+4]
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  // s[j] + s[j+2]
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, _MM_SHUFFLE(1, 1, 1, 1))));   // t[0] + t[1]
}

// Adds elements [k0, k1) of the dot products of MT x rows (xs) and NT weight rows (ws) into their 16-lane
// accumulators acc + (i * acc_stride + j) * 16. k0 is a multiple of 16; k1 is too unless k1 == K, the
// tail then being loaded zero-padded into the same lanes.
template <int MT, int NT>
void dot_tile(const float* const* xs, const float* const* ws, int64_t k0, int64_t k1, float* acc,
              int64_t acc_stride) {
  __m256 lo[MT][NT], hi[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      lo[i][j] = _mm256_loadu_ps(acc + (i * acc_stride + j) * 16);
      hi[i][j] = _mm256_loadu_ps(acc + (i * acc_stride + j) * 16 + 8);
    }
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    __m256 wl[NT], wh[NT];
    for (int j = 0; j < NT; ++j) {
      wl[j] = _mm256_loadu_ps(ws[j] + k);
      wh[j] = _mm256_loadu_ps(ws[j] + k + 8);
    }
    for (int i = 0; i < MT; ++i) {
      const __m256 xl = _mm256_loadu_ps(xs[i] + k);
      const __m256 xh = _mm256_loadu_ps(xs[i] + k + 8);
      for (int j = 0; j < NT; ++j) {
        lo[i][j] = _mm256_fmadd_ps(xl, wl[j], lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xh, wh[j], hi[i][j]);
      }
    }
  }
  if (k < k1) {  // tail: the missing elements load as 0 in both x and w, so they add +0 to their lanes
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int rem = static_cast<int>(k1 - k);
    const __m256i ml = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lane);
    const __m256i mh = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8), lane);
    __m256 wl[NT], wh[NT];
    for (int j = 0; j < NT; ++j) {
      wl[j] = _mm256_maskload_ps(ws[j] + k, ml);
      wh[j] = _mm256_maskload_ps(ws[j] + k + 8, mh);
    }
    for (int i = 0; i < MT; ++i) {
      const __m256 xl = _mm256_maskload_ps(xs[i] + k, ml);
      const __m256 xh = _mm256_maskload_ps(xs[i] + k + 8, mh);
      for (int j = 0; j < NT; ++j) {
        lo[i][j] = _mm256_fmadd_ps(xl, wl[j], lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xh, wh[j], hi[i][j]);
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      _mm256_storeu_ps(acc + (i * acc_stride + j) * 16, lo[i][j]);
      _mm256_storeu_ps(acc + (i * acc_stride + j) * 16 + 8, hi[i][j]);
    }
}

// The fixed reduction tree over 16 lanes.
inline float lane_sum(const float* l) { return lane_sum(_mm256_loadu_ps(l), _mm256_loadu_ps(l + 8)); }

#else  // portable fallback: the same lanes, the same fma order, the same tree

inline float lane_sum(const float* l) {
  float v[8], s[4], t[2];
  for (int j = 0; j < 8; ++j) v[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; ++j) s[j] = v[j] + v[j + 4];
  for (int j = 0; j < 2; ++j) t[j] = s[j] + s[j + 2];
  return t[0] + t[1];
}

template <int MT, int NT>
void dot_tile(const float* const* xs, const float* const* ws, int64_t k0, int64_t k1, float* acc,
              int64_t acc_stride) {
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      float* l = acc + (i * acc_stride + j) * 16;
      int64_t k = k0;
      for (; k + 16 <= k1; k += 16)
        for (int q = 0; q < 16; ++q) l[q] = std::fma(xs[i][k + q], ws[j][k + q], l[q]);
      if (k < k1) {  // tail lanes past the end get fma(0, 0, l) as in the vector path
        for (int q = 0; q < 16; ++q)
          l[q] = k + q < k1 ? std::fma(xs[i][k + q], ws[j][k + q], l[q]) : std::fma(0.0f, 0.0f, l[q]);
      }
    }
  }
}

#endif

// Blocking. None of these affects any value: lane j of every accumulator still sees k ≡ j (mod 16) in
// increasing order, and k blocks are multiples of 16.
constexpr int64_t kRowBlock = 16;  // weight rows dequantized at once (and the thread grain)
constexpr int64_t kKBlock = 512;   // k elements per pass (prefill), so x and w tiles stay in L1/L2
constexpr int64_t kMBlock = 48;    // x rows per accumulator block (prefill)
constexpr int kTileM = 3;          // register tile: 3 x rows by 2 weight rows = 12 accumulator pairs
constexpr int kTileN = 2;
constexpr int kDecodeTileN = 4;  // M == 1: 4 weight rows per tile
static_assert(kKBlock % 16 == 0 && kMBlock % kTileM == 0 && kRowBlock % kDecodeTileN == 0);

// mt (1..3) x rows by NT weight rows over [k0, k1), accumulators at acc (x row stride acc_stride).
template <int NT>
void tile_rows(const float* const* xr, int64_t mt, const float* const* ws, int64_t k0, int64_t k1, float* acc,
               int64_t acc_stride) {
  switch (mt) {
    case 3:
      dot_tile<3, NT>(xr, ws, k0, k1, acc, acc_stride);
      return;
    case 2:
      dot_tile<2, NT>(xr, ws, k0, k1, acc, acc_stride);
      return;
    default:
      dot_tile<1, NT>(xr, ws, k0, k1, acc, acc_stride);
      return;
  }
}

// y[n] = lane_sum(acc) (+ bias[n]).
inline float finish(const float* acc, const float* bias, int64_t n) {
  const float d = lane_sum(acc);
  return bias ? d + bias[n] : d;
}

// Output columns [n0, n1) for all M rows.
void matmul_cols(const float* x, int64_t M, int64_t xs, const Linear& w, float* y, int64_t ys, int64_t n0,
                 int64_t n1) {
  const int64_t K = w.in;
  const bool direct = w.dtype == DType::F32;
  thread_local std::vector<float> scratch;  // dequantized weight rows [kRowBlock][pitch]
  thread_local std::vector<float> accbuf;   // accumulators [kMBlock][kRowBlock][16]
  // Scratch rows are padded to an odd number of cache lines so the block's rows do not all map to the same
  // L1 sets (a power-of-two K would otherwise make them alias).
  const int64_t pitch = ((K + 15) / 16 | 1) * 16;
  if (!direct && scratch.size() < static_cast<size_t>(kRowBlock * pitch))
    scratch.resize(static_cast<size_t>(kRowBlock * pitch));
  if (accbuf.size() < static_cast<size_t>(kMBlock * kRowBlock * 16))
    accbuf.resize(static_cast<size_t>(kMBlock * kRowBlock * 16));
  float* acc = accbuf.data();
  const float* wrow[kRowBlock];

  for (int64_t nb = n0; nb < n1; nb += kRowBlock) {
    const int64_t cnt = std::min(kRowBlock, n1 - nb);
    for (int64_t j = 0; j < cnt; ++j) {
      if (direct) {
        wrow[j] = static_cast<const float*>(w.data) + (nb + j) * stride_of(w);
      } else {
        dequant_row_impl(w, nb + j, scratch.data() + j * pitch);
        wrow[j] = scratch.data() + j * pitch;
      }
    }

    if (M == 1) {  // decode: one pass over k, kDecodeTileN weight rows per tile
      std::fill(acc, acc + cnt * 16, 0.0f);
      int64_t j = 0;
      for (; j + kDecodeTileN <= cnt; j += kDecodeTileN)
        dot_tile<1, kDecodeTileN>(&x, wrow + j, 0, K, acc + j * 16, 0);
      for (; j < cnt; ++j) dot_tile<1, 1>(&x, wrow + j, 0, K, acc + j * 16, 0);
      for (j = 0; j < cnt; ++j) y[nb + j] = finish(acc + j * 16, w.bias, nb + j);
      continue;
    }

    // Prefill: x rows in blocks of kMBlock; per block, k in passes of kKBlock; per pass, x register tiles
    // outer and weight rows inner, so a tile of x is reused from L1 across the whole weight block.
    for (int64_t mb = 0; mb < M; mb += kMBlock) {
      const int64_t mcnt = std::min(kMBlock, M - mb);
      std::fill(acc, acc + mcnt * kRowBlock * 16, 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
        const int64_t k1 = std::min(K, k0 + kKBlock);
        for (int64_t m = 0; m < mcnt; m += kTileM) {
          const int64_t mt = std::min<int64_t>(kTileM, mcnt - m);
          const float* xr[kTileM];
          for (int64_t i = 0; i < mt; ++i) xr[i] = x + (mb + m + i) * xs;
          float* am = acc + m * kRowBlock * 16;
          int64_t j = 0;
          for (; j + kTileN <= cnt; j += kTileN)
            tile_rows<kTileN>(xr, mt, wrow + j, k0, k1, am + j * 16, kRowBlock);
          for (; j < cnt; ++j) tile_rows<1>(xr, mt, wrow + j, k0, k1, am + j * 16, kRowBlock);
        }
      }
      for (int64_t m = 0; m < mcnt; ++m) {
        float* yr = y + (mb + m) * ys;
        for (int64_t j = 0; j < cnt; ++j) yr[nb + j] = finish(acc + (m * kRowBlock + j) * 16, w.bias, nb + j);
      }
    }
  }
}

}  // namespace

Linear Linear::rows(int64_t r0, int64_t n) const {
  if (r0 < 0 || n < 0 || r0 + n > out)
    throw Error("Linear::rows: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                ") out of range for a weight with " + std::to_string(out) + " rows");
  Linear s = *this;
  const int64_t stride = stride_of(*this);
  s.out = n;
  s.row_stride = stride;
  s.data = static_cast<const unsigned char*>(data) + static_cast<size_t>(r0 * stride) * dtype_size(dtype);
  if (bias) s.bias = bias + r0;
  if (dtype == DType::F8_E4M3) {
    // A slice may start inside a scale block (e.g. `up` rows of a fused [2I, H] expert with I % 128 != 0):
    // point at the block row holding r0 and remember r0's offset inside it.
    if (block_out <= 0) throw Error("Linear::rows: FP8 weight with non-positive scale block height");
    s.scale_cols = scale_cols_of(*this);
    const int64_t first = scale_row0 + r0;
    s.scale_row0 = first % block_out;
    if (scale)
      s.scale = static_cast<const unsigned char*>(scale) +
                static_cast<size_t>((first / block_out) * s.scale_cols) * dtype_size(scale_dtype);
  }
  return s;
}

size_t Linear::weight_bytes() const {
  size_t bytes = static_cast<size_t>(out) * static_cast<size_t>(in) * dtype_size(dtype);
  if (dtype == DType::F8_E4M3 && scale && block_out > 0) {
    const int64_t scale_rows = (scale_row0 + out + block_out - 1) / block_out;
    bytes += static_cast<size_t>(scale_rows * scale_cols_of(*this)) * dtype_size(scale_dtype);
  }
  if (bias) bytes += static_cast<size_t>(out) * sizeof(float);
  return bytes;
}

namespace ops {

void matmul(ThreadPool* pool, const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride,
            int64_t y_stride) {
  if (M <= 0 || w.out <= 0) return;
  check_supported(w, "matmul");
  const int64_t xs = x_stride < 0 ? w.in : x_stride;
  const int64_t ys = y_stride < 0 ? w.out : y_stride;
  struct Job {
    const float* x;
    int64_t M, xs;
    const Linear* w;
    float* y;
    int64_t ys;
  } job{x, M, xs, &w, y, ys};
  // Hand-offs cost microseconds: below ~256k multiply-adds a call runs on the caller's thread alone.
  // (Which thread computes an output never changes its value: results stay batch invariant.)
  const int64_t work = M * w.out * w.in;
  ThreadPool* use = work < (int64_t(1) << 18) ? nullptr : pool;
  // Captures one pointer, so std::function stores it inline (no allocation).
  parallel_for(use, w.out, kRowBlock, [j = &job](int64_t n0, int64_t n1, int) {
    matmul_cols(j->x, j->M, j->xs, *j->w, j->y, j->ys, n0, n1);
  });
}

void matmul_transposed(const float* x, const Linear& w, float* y) {
  if (w.out <= 0 || w.in <= 0) return;
  check_supported(w, "matmul_transposed");
  const int64_t K = w.in;
  thread_local std::vector<float> scratch;
  if (w.dtype != DType::F32 && scratch.size() < static_cast<size_t>(K))
    scratch.resize(static_cast<size_t>(K));
  for (int64_t r = 0; r < w.out; ++r) {
    const float* wr;
    if (w.dtype == DType::F32) {
      wr = static_cast<const float*>(w.data) + r * stride_of(w);
    } else {
      dequant_row_impl(w, r, scratch.data());
      wr = scratch.data();
    }
    const float xr = x[r];
    int64_t c = 0;
#ifdef NEXTN_MATMUL_AVX2
    const __m256 xv = _mm256_set1_ps(xr);
    for (; c + 8 <= K; c += 8)
      _mm256_storeu_ps(y + c, _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr + c), _mm256_loadu_ps(y + c)));
#endif
    for (; c < K; ++c) y[c] = std::fma(xr, wr[c], y[c]);
  }
}

void dequant_row(const Linear& w, int64_t r, float* out) {
  check_supported(w, "dequant_row");
  if (r < 0 || r >= w.out)
    throw Error("dequant_row: row " + std::to_string(r) + " out of range [0, " + std::to_string(w.out) + ")");
  dequant_row_impl(w, r, out);
}

}  // namespace ops
}  // namespace nextn
