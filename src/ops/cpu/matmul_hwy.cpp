// SIMD matmul kernels: one Highway source compiled for every x86 target (AVX3 = AVX-512, AVX2) plus the
// scalar fallback, selected at run time (HWY_DYNAMIC_DISPATCH) for the CPU it runs on.
//
// Numerics, per target (batch invariance): every output y[m][n] is one dot product computed the same way
// whatever M, the tile it falls in, the code path or the thread count:
//   * the weight is decoded to fp32 (bf16 by a shift, f16 by the hardware conversion, FP8 e4m3 through
//     f16, times its block scale: exactly the value e4m3 · scale rounded once to fp32);
//   * N = Lanes(float) independent fp32 lanes: lane j accumulates fma(x[k], w[k], lane) for k ≡ j (mod N),
//     k increasing; the k tail (K mod N elements) is one zero-padded vector;
//   * the lanes are summed by the target's fixed SumOfLanes tree, then the bias is added.
// Tiling decides only which elements share registers or which weight vectors are decoded once and reused:
// an element's own chain of fma never changes. Different targets have different N, so their results
// differ (each is self-consistent).
//
// Work split (memory-bound decode, M = 1..16, and prefill):
//   * M <= kFusedMaxM: "fused" tiles: R weight rows x M x rows, weights decoded in registers straight
//     from memory and applied to every x row, so each weight byte is read once per call;
//   * larger M: panels of P weight rows are decoded once into an L2-resident fp32 scratch (row by row, a
//     sequential stream, prefetched ahead while the previous panel computes), then register tiles of
//     TT x rows by RR weight rows run over K chunks that stay in L1.
//
// NaN codes of e4m3 (0x7f, 0xff) are not special-cased by the SIMD decoder (they decode as ±480 · scale):
// a checkpoint never stores them.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/matmul_hwy.cpp"
// Every attainable target (not only those better than the x86-64-v3 baseline), so the scalar fallback is
// compiled too and tests can force each one. SSSE3/SSE4 would add nothing here: AVX2 is the baseline.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// clang-format off
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cpu/matmul_kernels.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace nextn::matmul_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kMaxLanes = 16;  // widest float vector of any compiled target (AVX-512)

// ---- per-target tiling (none of these changes a value) --------------------------------------------------

#if HWY_TARGET == HWY_SCALAR
constexpr int kFusedMaxM = 4;
template <int T>
constexpr int kFusedRows = 4;
constexpr int kTileM = 4, kTileN = 4;
#elif HWY_TARGET <= HWY_AVX3  // 32 vector registers
constexpr int kFusedMaxM = 4;
template <int T>
constexpr int kFusedRows = 4;  // up to 16 accumulators + 4 weights + x
constexpr int kTileM = 4, kTileN = 4;
#else  // AVX2: 16 vector registers
constexpr int kFusedMaxM = 4;
template <int T>
constexpr int kFusedRows = T <= 2 ? 4 : 2;
constexpr int kTileM = 2, kTileN = 4;
#endif

constexpr int64_t kPanelRows = 16;        // weight rows decoded per panel (at most)
constexpr int64_t kPanelBytes = 512 << 10;  // fp32 scratch budget of a panel (L2)
constexpr int64_t kChunk = 256;           // k elements per pass over a panel (x and weights in L1)
constexpr int64_t kMBlock = 64;           // x rows per accumulator block
static_assert(kChunk % kMaxLanes == 0 && kMBlock % 4 == 0 && kPanelRows % 4 == 0);

// ---- arithmetic -----------------------------------------------------------------------------------------

HWY_INLINE VF Fma(DF d, VF a, VF b, VF c) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(d, std::fma(hn::GetLane(a), hn::GetLane(b), hn::GetLane(c)));  // fused, never contracted
#else
  (void)d;
  return hn::MulAdd(a, b, c);
#endif
}

HWY_INLINE float Reduce(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

// ---- weight decoders: Lanes(d) consecutive elements at p -> fp32 -------------------------------------

struct DecF32 {
  using T = float;
  static constexpr bool kScaled = false;
  static HWY_INLINE VF Load(DF d, const T* p, VF) { return hn::LoadU(d, p); }
};

struct DecBF16 {
  using T = hwy::bfloat16_t;
  static constexpr bool kScaled = false;
  static HWY_INLINE VF Load(DF d, const T* p, VF) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));
  }
};

struct DecF16 {
  using T = hwy::float16_t;
  static constexpr bool kScaled = false;
  static HWY_INLINE VF Load(DF d, const T* p, VF) { return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, DF>(), p)); }
};

// e4m3 -> f32 by moving the fields: the sign-extended byte << 20, masked to sign | exponent | mantissa,
// is the f32 with biased exponent e and the 3 mantissa bits on top, i.e. exactly e4m3(v) · 2^-120
// (e = 0, the e4m3 subnormals, land on f32 subnormals with the same scaling). The caller's scale vector
// holds s · 2^120 (exact for |s| < 2^8; larger scales take the table route), so the product is
// e4m3(v) · s rounded once, as the scalar table gives.
constexpr float kFp8ScaleBias = 1329227995784915872903807060280344576.0f;  // 2^120
struct DecFP8 {
  using T = int8_t;
  static constexpr bool kScaled = true;
  static HWY_INLINE VF Load(DF d, const T* p, VF scale) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::RebindToSigned<DF> di;
    const auto v = hn::ShiftLeft<20>(hn::PromoteTo(di, hn::LoadU(d8, p)));
    return hn::Mul(hn::BitCast(d, hn::And(v, hn::Set(di, static_cast<int32_t>(0x87F00000u)))), scale);
  }
};

// The last, partial vector: n < Lanes elements, zero-padded (zero bytes decode to 0).
template <class Dec>
HWY_INLINE VF LoadTail(DF d, const typename Dec::T* p, int64_t n, VF scale) {
  HWY_ALIGN typename Dec::T buf[kMaxLanes] = {};
  std::memcpy(static_cast<void*>(buf), p, static_cast<size_t>(n) * sizeof(typename Dec::T));
  return Dec::Load(d, buf, scale);
}

template <class Dec>
HWY_INLINE const typename Dec::T* RowPtr(const Weight& w, int64_t n) {
  return reinterpret_cast<const typename Dec::T*>(w.data) + n * w.row_stride;
}

template <class Dec>
HWY_INLINE VF SegmentScale(DF d, const Weight& w, int64_t n, int64_t k) {
  if constexpr (Dec::kScaled) {
    return hn::Set(d, scale_of(w, n, k / w.block_in) * kFp8ScaleBias);
  } else {
    return hn::Set(d, 1.0f);
  }
}

// The k range a scale is constant over (a multiple of Lanes, checked by the caller).
template <class Dec>
HWY_INLINE int64_t SegmentLength(const Weight& w) {
  if constexpr (Dec::kScaled) {
    return w.block_in;
  } else {
    return w.K > 0 ? w.K : 1;
  }
}

// Decodes row n, elements [k0, k1), into dst as whole vectors: when k1 == K and K is not a multiple of
// Lanes the last vector is the zero-padded tail (dst then holds k1 - k0 rounded up to Lanes).
template <class Dec>
void DecodeRange(DF d, const Weight& w, int64_t n, int64_t k0, int64_t k1, float* HWY_RESTRICT dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t Kfull = w.K - w.K % N;
  const typename Dec::T* row = RowPtr<Dec>(w, n);
  const int64_t seg = SegmentLength<Dec>(w);
  for (int64_t s0 = k0 - k0 % seg; s0 < k1; s0 += seg) {
    const VF s = SegmentScale<Dec>(d, w, n, s0);
    const int64_t b = std::max(s0, k0), e = std::min({s0 + seg, k1, Kfull});
    for (int64_t k = b; k < e; k += N) hn::StoreU(Dec::Load(d, row + k, s), d, dst + (k - k0));
    if (k1 == w.K && Kfull < w.K && s0 + seg >= w.K)
      hn::StoreU(LoadTail<Dec>(d, row + Kfull, w.K - Kfull, s), d, dst + (Kfull - k0));
  }
}

// The scalar-table decoder for FP8 weights the SIMD decoder cannot take (Weight::fp8_table).
void DecodeRangeTable(DF d, const Weight& w, int64_t n, int64_t k0, int64_t k1, float* HWY_RESTRICT dst) {
  static const auto* lut = [] {
    auto* t = new float[256];
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const uint8_t* row = w.data + n * w.row_stride;
  for (int64_t k = k0; k < k1;) {
    const int64_t b = k / w.block_in, e = std::min(k1, (b + 1) * w.block_in);
    const float s = scale_of(w, n, b);
    for (; k < e; ++k) dst[k - k0] = lut[row[k]] * s;
  }
  for (int64_t k = k1; (k - k0) % N != 0; ++k) dst[k - k0] = 0.0f;  // tail padding
}

// ---- fused tiles: T x rows by R weight rows, decoded in registers, full K -----------------------------

// res[t * R + r] = dot(x row t, weight row n + r). xt[t]: x row t's zero-padded tail vector.
template <class Dec, int T, int R>
HWY_NOINLINE void FusedTile(const Weight& w, const float* const* xr, const float* xt, int64_t n, float* res) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N;
  const typename Dec::T* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = RowPtr<Dec>(w, n + r);
  VF acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = hn::Zero(d);
  VF s[R];
  for (int r = 0; r < R; ++r) s[r] = hn::Set(d, 1.0f);
  const int64_t seg = SegmentLength<Dec>(w);
  for (int64_t s0 = 0; s0 < K; s0 += seg) {
    if constexpr (Dec::kScaled)
      for (int r = 0; r < R; ++r) s[r] = SegmentScale<Dec>(d, w, n + r, s0);
    const int64_t e = std::min(s0 + seg, Kfull);
    for (int64_t k = s0; k < e; k += N) {
      VF wv[R];
      for (int r = 0; r < R; ++r) wv[r] = Dec::Load(d, rows[r] + k, s[r]);
      for (int t = 0; t < T; ++t) {
        const VF xv = hn::LoadU(d, xr[t] + k);
        for (int r = 0; r < R; ++r) acc[t][r] = Fma(d, xv, wv[r], acc[t][r]);
      }
    }
  }
  if (Kfull < K) {
    VF wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadTail<Dec>(d, rows[r] + Kfull, K - Kfull, s[r]);
    for (int t = 0; t < T; ++t) {
      const VF xv = hn::LoadU(d, xt + t * kMaxLanes);
      for (int r = 0; r < R; ++r) acc[t][r] = Fma(d, xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) res[t * R + r] = Reduce(d, acc[t][r]);
}

template <class Dec, int T>
void FusedCols(const Job& job, const float* xt) {
  const Weight& w = *job.w;
  const float* xr[T];
  for (int t = 0; t < T; ++t) xr[t] = job.x + t * job.x_stride;
  constexpr int R = kFusedRows<T>;
  float res[T * R];
  auto emit = [&](int64_t n, int rows) {
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < rows; ++r) {
        const float b = w.bias ? w.bias[n + r] : 0.0f;
        job.y[t * job.y_stride + n + r] = w.bias ? res[t * rows + r] + b : res[t * rows + r];
      }
  };
  int64_t n = job.n0;
  for (; n + R <= job.n1; n += R) {
    FusedTile<Dec, T, R>(w, xr, xt, n, res);
    emit(n, R);
  }
  for (; n < job.n1; ++n) {
    FusedTile<Dec, T, 1>(w, xr, xt, n, res);
    emit(n, 1);
  }
}

// ---- panel tiles: TT x rows by RR fp32 weight rows over one k chunk, accumulators in memory ------------

// acc + (t * acc_stride + r) * Lanes: the accumulators of (x row t, weight row r). xr/wr point at the
// chunk start; nfull whole vectors, then (tail) one more with x from xt.
template <int TT, int RR>
HWY_NOINLINE void PanelTile(const float* const* xr, const float* xt, const float* const* wr, int64_t nfull,
                            bool tail, float* acc, int64_t acc_stride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a[TT][RR];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < RR; ++r) a[t][r] = hn::Load(d, acc + (t * acc_stride + r) * N);
  for (int64_t j = 0; j < nfull; ++j) {
    VF wv[RR];
    for (int r = 0; r < RR; ++r) wv[r] = hn::Load(d, wr[r] + j * N);
    for (int t = 0; t < TT; ++t) {
      const VF xv = hn::LoadU(d, xr[t] + j * N);
      for (int r = 0; r < RR; ++r) a[t][r] = Fma(d, xv, wv[r], a[t][r]);
    }
  }
  if (tail) {
    VF wv[RR];
    for (int r = 0; r < RR; ++r) wv[r] = hn::Load(d, wr[r] + nfull * N);
    for (int t = 0; t < TT; ++t) {
      const VF xv = hn::Load(d, xt + t * kMaxLanes);
      for (int r = 0; r < RR; ++r) a[t][r] = Fma(d, xv, wv[r], a[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < RR; ++r) hn::Store(a[t][r], d, acc + (t * acc_stride + r) * N);
}

template <int TT>
void PanelTileRows(int rr, const float* const* xr, const float* xt, const float* const* wr, int64_t nfull,
                   bool tail, float* acc, int64_t acc_stride) {
  static_assert(kTileN == 4);
  switch (rr) {
    case 4:
      return PanelTile<TT, 4>(xr, xt, wr, nfull, tail, acc, acc_stride);
    case 3:
      return PanelTile<TT, 3>(xr, xt, wr, nfull, tail, acc, acc_stride);
    case 2:
      return PanelTile<TT, 2>(xr, xt, wr, nfull, tail, acc, acc_stride);
    default:
      return PanelTile<TT, 1>(xr, xt, wr, nfull, tail, acc, acc_stride);
  }
}

void PanelTileDispatch(int tt, int rr, const float* const* xr, const float* xt, const float* const* wr,
                       int64_t nfull, bool tail, float* acc, int64_t acc_stride) {
  if constexpr (kTileM >= 4) {
    if (tt == 4) return PanelTileRows<4>(rr, xr, xt, wr, nfull, tail, acc, acc_stride);
    if (tt == 3) return PanelTileRows<3>(rr, xr, xt, wr, nfull, tail, acc, acc_stride);
  }
  if (tt == 2) return PanelTileRows<2>(rr, xr, xt, wr, nfull, tail, acc, acc_stride);
  return PanelTileRows<1>(rr, xr, xt, wr, nfull, tail, acc, acc_stride);
}

// 64-byte aligned, grow-only per-thread buffers.
struct Scratch {
  std::vector<float> buf;
  float* get(size_t n) {
    if (buf.size() < n + 16) buf.resize(n + 16);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return buf.data() + ((64 - p % 64) % 64) / sizeof(float);
  }
};
Scratch& PanelScratch() {
  static thread_local Scratch s;
  return s;
}
Scratch& AccScratch() {
  static thread_local Scratch s;
  return s;
}

template <class Dec>
void PanelCols(const Job& job) {
  const DF d;
  const Weight& w = *job.w;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N, Kpad = (K + N - 1) / N * N;
  // Rows per panel: kPanelRows, fewer (multiples of kTileN) when K is long, so the panel stays in L2.
  const int64_t pitch = Kpad + (Kpad / N % 2 == 0 ? N : 0);  // odd number of vectors: rows do not alias
  const int64_t P = std::clamp<int64_t>(kPanelBytes / (pitch * 4) / kTileN * kTileN, kTileN, kPanelRows);
  float* panel = PanelScratch().get(static_cast<size_t>(P * pitch));
  float* acc = AccScratch().get(static_cast<size_t>(kMBlock * P * N));
  HWY_ALIGN float xt[kMBlock * kMaxLanes];

  for (int64_t nb = job.n0; nb < job.n1; nb += P) {
    const int64_t pc = std::min(P, job.n1 - nb);
    for (int64_t r = 0; r < pc; ++r) {
      if (w.fp8_table)
        DecodeRangeTable(d, w, nb + r, 0, K, panel + r * pitch);
      else
        DecodeRange<Dec>(d, w, nb + r, 0, K, panel + r * pitch);
    }
    for (int64_t mb = 0; mb < job.M; mb += kMBlock) {
      const int64_t mc = std::min(kMBlock, job.M - mb);
      for (int64_t m = 0; m < mc; ++m) {
        float* dst = xt + m * kMaxLanes;
        std::fill(dst, dst + kMaxLanes, 0.0f);
        if (Kfull < K) std::copy_n(job.x + (mb + m) * job.x_stride + Kfull, K - Kfull, dst);
      }
      std::fill(acc, acc + mc * pc * N, 0.0f);
      for (int64_t k0 = 0; k0 < Kpad; k0 += kChunk) {
        const int64_t k1 = std::min(Kpad, k0 + kChunk);
        const bool tail = k1 == Kpad && Kfull < K;
        const int64_t nfull = (k1 - k0) / N - (tail ? 1 : 0);
        for (int64_t m = 0; m < mc; m += kTileM) {
          const int tt = static_cast<int>(std::min<int64_t>(kTileM, mc - m));
          const float* xr[kTileM];
          for (int t = 0; t < tt; ++t) xr[t] = job.x + (mb + m + t) * job.x_stride + k0;
          for (int64_t r = 0; r < pc; r += kTileN) {
            const int rr = static_cast<int>(std::min<int64_t>(kTileN, pc - r));
            const float* wr[kTileN];
            for (int j = 0; j < rr; ++j) wr[j] = panel + (r + j) * pitch + k0;
            PanelTileDispatch(tt, rr, xr, xt + m * kMaxLanes, wr, nfull, tail, acc + (m * pc + r) * N, pc);
          }
        }
      }
      for (int64_t m = 0; m < mc; ++m) {
        float* yr = job.y + (mb + m) * job.y_stride;
        for (int64_t r = 0; r < pc; ++r) {
          const float dot = Reduce(d, hn::Load(d, acc + (m * pc + r) * N));
          yr[nb + r] = w.bias ? dot + w.bias[nb + r] : dot;
        }
      }
    }
  }
}

template <class Dec>
void ColsFor(const Job& job) {
  if (job.M <= kFusedMaxM && !job.w->fp8_table) {
    const DF d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    const int64_t K = job.w->K, Kfull = K - K % N;
    HWY_ALIGN float xt[4 * kMaxLanes] = {};
    for (int64_t m = 0; m < job.M; ++m)
      if (Kfull < K) std::copy_n(job.x + m * job.x_stride + Kfull, K - Kfull, xt + m * kMaxLanes);
    switch (job.M) {
      case 1:
        return FusedCols<Dec, 1>(job, xt);
      case 2:
        return FusedCols<Dec, 2>(job, xt);
      case 3:
        return FusedCols<Dec, 3>(job, xt);
      default:
        return FusedCols<Dec, 4>(job, xt);
    }
  }
  PanelCols<Dec>(job);
}

void MatmulCols(const Job* job) {
  switch (job->w->dtype) {
    case DType::F32:
      return ColsFor<DecF32>(*job);
    case DType::BF16:
      return ColsFor<DecBF16>(*job);
    case DType::F16:
      return ColsFor<DecF16>(*job);
    default:  // F8_E4M3 (validated by the caller)
      return ColsFor<DecFP8>(*job);
  }
}

template <class Dec>
void DequantFor(const Weight& w, int64_t r, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N;
  // Whole vectors straight into out; the tail through a padded buffer.
  if (Kfull > 0) {
    if (w.fp8_table)
      DecodeRangeTable(d, w, r, 0, Kfull, out);
    else
      DecodeRange<Dec>(d, w, r, 0, Kfull, out);
  }
  if (Kfull < K) {
    HWY_ALIGN float tail[kMaxLanes];
    if (w.fp8_table)
      DecodeRangeTable(d, w, r, Kfull, K, tail);
    else
      DecodeRange<Dec>(d, w, r, Kfull, K, tail);
    std::copy_n(tail, K - Kfull, out + Kfull);
  }
}

void DequantRow(const Weight* w, int64_t r, float* out) {
  switch (w->dtype) {
    case DType::F32:
      return DequantFor<DecF32>(*w, r, out);
    case DType::BF16:
      return DequantFor<DecBF16>(*w, r, out);
    case DType::F16:
      return DequantFor<DecF16>(*w, r, out);
    default:
      return DequantFor<DecFP8>(*w, r, out);
  }
}

void MatmulTransposed(const float* x, const Weight* w, float* y) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w->K;
  static thread_local Scratch row_buf;
  float* row = row_buf.get(static_cast<size_t>(K + N));
  for (int64_t r = 0; r < w->N; ++r) {
    DequantRow(w, r, row);
    const VF xv = hn::Set(d, x[r]);
    int64_t k = 0;
    for (; k + N <= K; k += N) hn::StoreU(Fma(d, xv, hn::LoadU(d, row + k), hn::LoadU(d, y + k)), d, y + k);
    for (; k < K; ++k) y[k] = std::fma(x[r], row[k], y[k]);
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace nextn::matmul_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace nextn::matmul_kernels {

HWY_EXPORT(MatmulCols);
HWY_EXPORT(DequantRow);
HWY_EXPORT(MatmulTransposed);
HWY_EXPORT(TargetName);

void matmul_cols(const Job& job) { HWY_DYNAMIC_DISPATCH(MatmulCols)(&job); }
void dequant_row(const Weight& w, int64_t r, float* out) { HWY_DYNAMIC_DISPATCH(DequantRow)(&w, r, out); }
void matmul_transposed(const float* x, const Weight& w, float* y) {
  HWY_DYNAMIC_DISPATCH(MatmulTransposed)(x, &w, y);
}
const char* active_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
int64_t compiled_targets() { return HWY_TARGETS; }

}  // namespace nextn::matmul_kernels
#endif  // HWY_ONCE
