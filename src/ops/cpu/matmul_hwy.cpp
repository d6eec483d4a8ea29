// SIMD matmul kernels: one Highway source compiled for every x86 target (AVX3 = AVX-512, AVX2) plus the
// scalar fallback, selected at run time (HWY_DYNAMIC_DISPATCH) for the CPU it runs on.
//
// Numerics, per target (batch invariance): every output y[m][n] is one dot product computed the same way
// whatever M, the tile it falls in, the code path or the thread count:
//   * the weight is decoded to fp32 exactly: bf16 by a shift, f16 by the hardware conversion, FP8 e4m3
//     through f16 times its block scale (e4m3 · scale rounded once, the value dequant_row returns); the FP8
//     matmuls carry the block scale on the activations instead (x' = x · 256 · s, one rounding), and
//     decode-sized calls may take e4m3's bit fields straight into f32 with x' · 2^112 (DecFP8Bits): the
//     same products either way;
//   * N = Lanes(float) independent fp32 lanes: lane j accumulates fma(x[k], w[k], lane) for k ≡ j (mod N),
//     k increasing; the k tail (K mod N elements) is one zero-padded vector;
//   * the lanes are summed by one fixed tree per target (ReduceMany), then the bias is added.
// Tiling decides only which elements share registers, and whether a weight vector is decoded from memory
// or read back as the f32 a previous tile decoded: an element's own chain of fma never changes. Different
// targets have different N, so their results differ (each is self-consistent); activations are never
// rounded (no bf16 dot products).
//
// Work split:
//   * M <= kFusedMaxM (decode, speculative verification): fused tiles of T x rows by R weight rows, the
//     weights decoded in registers straight from memory and applied to all T rows; the next row group is
//     prefetched alongside. Up to kFusedTileM rows form one tile; for more, x is cut into tiles of at
//     most kFusedMultiTileM rows: the first decodes the row group and also stores it as f32 (L1), the
//     others read that copy. Each weight byte is read from memory once per call.
//   * larger M (prefill): panels of P weight rows are decoded once into an L2-resident f32 scratch (the
//     next panel prefetched while this one computes), then register tiles of kTileM x rows by kTileN
//     weight rows run over k chunks.
//
// NaN codes of e4m3 (0x7f, 0xff) are not special-cased by the SIMD decoder (they decode as ±480 · scale):
// a checkpoint never stores them.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/matmul_hwy.cpp"
#include "ops/cpu/hwy_targets.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// clang-format off
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/reduce-inl.h"
#include "ops/cpu/target_env.h"
#include "ops/cpu/thread_scratch.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace nextn::matmul_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kMaxLanes = 16;  // widest float vector of any compiled target (AVX-512)

// ---- per-target tiling (none of these changes a value) --------------------------------------------------

// Fused tiles: x rows per tile (at most kFusedTileM; M <= kFusedMaxM uses fused tiles only) and weight
// rows per tile for a tile of T x rows (accumulators T * R, plus the decoded weights, within the registers).
constexpr int kFusedTileM = 8;       // M <= kFusedTileM: one tile of all M rows
constexpr int kFusedMultiTileM = 4;  // larger M: tiles of at most this many rows
constexpr int64_t kFusedMaxM = 16;

// Number of x tiles for M rows (fused path).
constexpr int64_t FusedTiles(int64_t M) {
  return M <= kFusedTileM ? 1 : (M + kFusedMultiTileM - 1) / kFusedMultiTileM;
}
#if HWY_TARGET == HWY_SCALAR
template <int T>
constexpr int kFusedRows = 4;
template <int T>
constexpr int kBitsRows = kFusedRows<T>;
constexpr int kTileM = 4, kTileN = 4;
#elif HWY_TARGET <= HWY_AVX3  // 32 vector registers; weights decoded in pairs (2R registers)
// (T = 5, 6 with 4 rows spill a little, but verify steps of 5 and 6 rows measured 10-15% cheaper than
// with 3: fewer decodes per weight)
template <int T>
constexpr int kFusedRows = T <= 6 ? 4 : (T <= 7 ? 3 : 2);
template <int T>
constexpr int kBitsRows = kFusedRows<T>;
constexpr int kTileM = 4, kTileN = 4;
#else  // AVX2: 16 vector registers
// weight rows for T = 1..8 x rows, chosen by measuring variants (docs/performance.md, "AVX2 tiles"): more
// weight rows than registers strictly allow still pays at T = 3, 4 and 7, 8 (fewer decodes per weight)
inline constexpr int kAvx2FusedRows[] = {0, 4, 4, 3, 3, 2, 2, 2, 2};
template <int T>
constexpr int kFusedRows = kAvx2FusedRows[T];
// with DecFP8Bits (single-vector steps up to 6 x rows, see kPairFor): 3 weight rows at 2-3 x rows
inline constexpr int kAvx2BitsRows[] = {0, 4, 3, 3, 2, 2, 2, 2, 2};
template <int T>
constexpr int kBitsRows = kAvx2BitsRows[T];
constexpr int kTileM = 2, kTileN = 4;
#endif

// One x row against short weight rows (K <= kShortK): weight rows per tile (registers permitting).
constexpr int64_t kShortK = 2048;
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET <= HWY_AVX3
constexpr int kShortRowsOne = 8;
#else
constexpr int kShortRowsOne = kFusedRows<1>;
#endif
// FP8 decode and 2-row verify against large matrices of short rows read the rows as kShortRowsOne sequential
// streams (Fp8StreamedRows). (Streams for 3 and 4 x rows, with half as many streams, measured no faster than
// the contiguous tiles: docs/performance.md, forty-first session.)
constexpr int64_t kStreamMaxM = 2;
// Rows of at most kTinyKVectors vectors (the hyper-connection mixers' low-rank up projections, K = 16; small
// experts' down projections, K = 32..64) take TinyKCols: a fused tile there spends nearly all its time on its
// own setup and lane reduction, not on multiply-adds.
constexpr int64_t kTinyKVectors = 4;
#if HWY_TARGET == HWY_SCALAR
constexpr int kTinyRows = 4;
#elif HWY_TARGET <= HWY_AVX3
constexpr int kTinyRows = 16;  // ReduceMany's group: 16 accumulators share one transpose
#else
constexpr int kTinyRows = 8;
#endif

// Decode two weight vectors per step in the fused tiles (FP8: one double-width integer stage). On AVX-512
// for every weight type; on AVX2 (16 registers) for FP8 only, whose decode is most of the work there: one
// widen + shift + mask per 16 weights instead of per 8 gave 9-17% more FP8 weights per second at M = 1..8
// on an AMD EPYC (docs/performance.md, "Seventeenth session").
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET <= HWY_AVX3
constexpr bool kPairDecodeAll = true;
#else
constexpr bool kPairDecodeAll = false;
#endif
constexpr bool kPairDecodeFp8 = HWY_TARGET != HWY_SCALAR;

constexpr int64_t kPanelRows = 16;        // weight rows decoded per panel (at most)
constexpr int64_t kPanelBytes = 512 << 10;  // fp32 scratch budget of a panel (L2)
constexpr int64_t kChunk = 1024;          // k elements per pass over a panel (x tile in L1, weights in L2)
constexpr int64_t kMBlock = 64;           // x rows per accumulator block
static_assert(kChunk % kMaxLanes == 0 && kMBlock % 4 == 0 && kPanelRows % 4 == 0);

// ---- arithmetic (ops/cpu/reduce-inl.h) -------------------------------------------------------------------

using nextn::simd::HWY_NAMESPACE::Fma;
using nextn::simd::HWY_NAMESPACE::ReduceMany;

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

// e4m3 -> f16 bits by moving the fields: the sign-extended byte << 7 puts exponent and mantissa in place
// (e4m3 exponent e becomes f16 exponent e, subnormals included) and the sign at bits 14 and 15; clearing bit
// 14 leaves f16(v) = e4m3(v) · 2^-8 exactly, which the hardware widens to f32 (f32 subnormals, which would
// cost microcode assists in the multiply, never appear). The caller's scale vector holds 256 · s (exact
// for |s| < 2^120; larger scales take the table route), so the product is e4m3(v) · s rounded once, as
// the scalar table gives.
constexpr float kFp8ScaleBias = 256.0f;

// Unscaled: e4m3(v) · 2^-8 exactly. Matmuls take this route with the block scale carried by the
// activations (Fp8PrescaledCols). DecFP8 below multiplies by 256 · s: the e4m3 · s values of dequant_row.
#if HWY_TARGET == HWY_AVX2
// f16 -> f32 of the 8 halves at p, converted from memory. The register form's second uop is a shuffle on
// Intel's port 5, which the 8 -> 16-bit widening and the upper-half extract also need: 4 port-5 uops per 16
// FP8 weights bound a one-row decode there; the memory form takes its halves from a load port instead (one
// x row: 25% more weights a second cache-resident; with more rows, bound by their multiply-adds, the store and
// reload cost 10-20%: docs/performance.md, forty-fourth session). Inline assembly, because a compiler folds a
// store and the conversion of a reload back into the register form. (No gain on AVX-512, whose multiply-adds
// share port 5.)
HWY_INLINE VF PromoteF16FromMemory(const uint16_t* p) {
  __m256 v;
  asm("vcvtph2ps %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const __m128i*>(p)));
  return VF{v};
}
#endif

struct DecFP8Raw {
  using T = int8_t;
  static constexpr bool kScaled = false;
  static HWY_INLINE VF Load(DF d, const T* p, VF) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    auto h = hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::LoadU(d8, p)));
    h = hn::And(h, hn::Set(d16, static_cast<int16_t>(0xBFFF)));
    return hn::PromoteTo(d, hn::BitCast(dh, h));
  }
#if HWY_TARGET != HWY_SCALAR
  // Two vectors (elements [0, N) and [N, 2N)) from one double-width integer stage. kOneRow: for a tile of one
  // x row, whose multiply-adds leave the load ports idle (AVX2: the conversion from memory; the same values).
  template <bool kOneRow = false>
  static HWY_INLINE void Load2(DF d, const T* p, VF, VF& lo, VF& hi) {
    const hn::Repartition<int16_t, DF> d16;  // 2N lanes
    const hn::Rebind<int8_t, decltype(d16)> d8;
    auto h = hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::LoadU(d8, p)));
    h = hn::And(h, hn::Set(d16, static_cast<int16_t>(0xBFFF)));
#if HWY_TARGET == HWY_AVX2
    if constexpr (kOneRow) {
      alignas(32) uint16_t halves[16];
      hn::Store(h, d16, reinterpret_cast<int16_t*>(halves));
      lo = PromoteF16FromMemory(halves);
      hi = PromoteF16FromMemory(halves + 8);
      return;
    }
#endif
    const hn::Repartition<hwy::float16_t, DF> dh2;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto hf = hn::BitCast(dh2, h);
    lo = hn::PromoteTo(d, hn::LowerHalf(dh, hf));
    hi = hn::PromoteTo(d, hn::UpperHalf(dh, hf));
  }
#endif
};

// Scaled: e4m3(v) · s rounded once (the caller's scale vector holds 256 · s).
struct DecFP8 {
  using T = int8_t;
  static constexpr bool kScaled = true;
  static HWY_INLINE VF Load(DF d, const T* p, VF scale) { return hn::Mul(DecFP8Raw::Load(d, p, scale), scale); }
#if HWY_TARGET != HWY_SCALAR
  static HWY_INLINE void Load2(DF d, const T* p, VF scale, VF& lo, VF& hi) {
    DecFP8Raw::Load2(d, p, scale, lo, hi);
    lo = hn::Mul(lo, scale);
    hi = hn::Mul(hi, scale);
  }
#endif
};

// e4m3 -> f32 bits by moving the fields, no conversion instruction: the sign-extended byte << 20 puts
// exponent and mantissa at the bottom of f32's exponent and the top of its mantissa, the sign at bits 27-31;
// clearing bits 27-30 leaves f32(v) = e4m3(v) · 2^-120 exactly (e4m3 subnormals as f32 subnormals). The
// activations carry 2^112 more than DecFP8Raw's (x'' = x' · 2^112, exact while |x'| < 2^16), so every product
// x'' · w'' equals x' · w' and the results are DecFP8Raw's bits. Fp8BitsRoute says when it is used.
struct DecFP8Bits {
  using T = int8_t;
  static constexpr bool kScaled = false;
  static HWY_INLINE VF Load(DF d, const T* p, VF) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::RebindToSigned<DF> d32;
    const auto bits = hn::ShiftLeft<20>(hn::PromoteTo(d32, hn::LoadU(d8, p)));
    return hn::BitCast(d, hn::And(bits, hn::Set(d32, static_cast<int32_t>(0x87F00000u))));
  }
};
constexpr float kFp8BitsExtra = 0x1p112f;  // x'' = x' · kFp8BitsExtra
constexpr float kFp8BitsLimit = 0x1p16f;   // |x'| below this: x'' is finite

// Whether the loops over k of decoder Dec's weights take two vectors per step (see kPairDecodeAll).
template <class Dec>
constexpr bool kIsFp8 = std::is_same_v<Dec, DecFP8> || std::is_same_v<Dec, DecFP8Raw>;
template <class Dec>
constexpr bool kPairDecode = kPairDecodeAll || (kPairDecodeFp8 && kIsFp8<Dec>);
// DecFP8Bits decodes one vector with one widen, shift and mask: pairs of vectors save nothing there, and on
// AVX2 they cost registers. Single vectors up to 6 x rows, pairs for 7-8 x rows, and kBitsRows weight rows
// (nextn_bench_kernels BM_Matmul/fp8/2048x8192, one thread, AMD EPYC Zen 3: docs/performance.md,
// "Fortieth session").
template <class Dec, int T>
constexpr bool kPairFor = std::is_same_v<Dec, DecFP8Bits> ? (kPairDecodeAll || T >= 7) : kPairDecode<Dec>;
template <class Dec, int T>
constexpr int kRowsFor = std::is_same_v<Dec, DecFP8Bits> ? kBitsRows<T> : kFusedRows<T>;

// Elements [0, 2N) as two vectors: the decoder's own double-width path if it has one (kOneRow: for a tile of
// one x row; the same values).
template <class Dec, bool kOneRow = false>
HWY_INLINE void Load2(DF d, const typename Dec::T* p, VF scale, VF& lo, VF& hi) {
  if constexpr (kPairDecodeFp8 && std::is_same_v<Dec, DecFP8Raw>) {
    Dec::template Load2<kOneRow>(d, p, scale, lo, hi);
  } else if constexpr (kPairDecodeFp8 && kIsFp8<Dec>) {
    Dec::Load2(d, p, scale, lo, hi);
  } else {
    lo = Dec::Load(d, p, scale);
    hi = Dec::Load(d, p + hn::Lanes(d), scale);
  }
}

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
    int64_t k = b;
    if constexpr (kPairDecode<Dec>) {
      for (; k + 2 * N <= e; k += 2 * N) {
        VF lo, hi;
        Load2<Dec>(d, row + k, s, lo, hi);
        hn::StoreU(lo, d, dst + (k - k0));
        hn::StoreU(hi, d, dst + (k - k0) + N);
      }
    }
    for (; k < e; k += N) hn::StoreU(Dec::Load(d, row + k, s), d, dst + (k - k0));
    if (k1 == w.K && Kfull < w.K && s0 + seg >= w.K)
      hn::StoreU(LoadTail<Dec>(d, row + Kfull, w.K - Kfull, s), d, dst + (Kfull - k0));
  }
}

// The scalar-table decoder for FP8 weights the SIMD decoder cannot take (Weight::fp8_table).
void DecodeRangeTable(DF d, const Weight& w, int64_t n, int64_t k0, int64_t k1, float* HWY_RESTRICT dst) {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
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

// Per-thread scratch (ops/cpu/thread_scratch.h: shared by every target, reserved up front per thread).
struct Scratch {
  ops::ScratchKind kind;
  float* get(size_t n) const { return ops::thread_scratch(kind, n); }
};
Scratch FusedScratch() { return {ops::ScratchKind::kFused}; }
Scratch PanelScratch() { return {ops::ScratchKind::kPanel}; }
Scratch AccScratch() { return {ops::ScratchKind::kAcc}; }

// ---- fused tiles: T x rows by R weight rows, decoded in registers, full K -----------------------------

// res[t * R + r] = dot(x row t, weight row n + r). xt + t * kMaxLanes: x row t's zero-padded tail vector.
// pf: element offset (from each row) of the bytes to prefetch alongside, the same k range of the rows of
// the next row group; 0 when there is none (the prefetch then touches the current rows, a no-op).
// kStore: also writes the decoded rows to dst[r] (Kpad floats each, the tail vector zero-padded), for
// the other x tiles of the same rows to read back as f32.
template <class Dec, int T, int R, bool kStore>
HWY_NOINLINE void FusedTile(const Weight& w, const float* const* xr, const float* xt, int64_t n, int64_t pf,
                            float* const* dst, float* res) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N;
  using TW = typename Dec::T;
  const TW* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = RowPtr<Dec>(w, n + r);
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = xr[t];
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
    int64_t k = s0;
    if constexpr (kPairFor<Dec, T>) {
      for (; k + 2 * N <= e; k += 2 * N) {
        if constexpr (!kStore)  // (with several x tiles the loop is compute-bound: no prefetch)
          for (int r = 0; r < R; ++r)
            for (size_t b = 0; b < 2 * N * sizeof(TW); b += 64)
              __builtin_prefetch(reinterpret_cast<const char*>(rows[r] + pf + k) + b, 0, 2);
        VF lo[R], hi[R];
        for (int r = 0; r < R; ++r) Load2<Dec, T == 1 && !kStore>(d, rows[r] + k, s[r], lo[r], hi[r]);
        if constexpr (kStore)
          for (int r = 0; r < R; ++r) {
            hn::Store(lo[r], d, dst[r] + k);
            hn::Store(hi[r], d, dst[r] + k + N);
          }
        for (int t = 0; t < T; ++t) {
          const VF x0 = hn::LoadU(d, x[t] + k);
          for (int r = 0; r < R; ++r) acc[t][r] = Fma(x0, lo[r], acc[t][r]);
          const VF x1 = hn::LoadU(d, x[t] + k + N);
          for (int r = 0; r < R; ++r) acc[t][r] = Fma(x1, hi[r], acc[t][r]);
        }
      }
    }
    for (; k < e; k += N) {
      if (!kStore && (k * static_cast<int64_t>(sizeof(TW))) % 64 == 0)
        for (int r = 0; r < R; ++r) __builtin_prefetch(rows[r] + pf + k, 0, 2);
      VF wv[R];
      for (int r = 0; r < R; ++r) wv[r] = Dec::Load(d, rows[r] + k, s[r]);
      if constexpr (kStore)
        for (int r = 0; r < R; ++r) hn::Store(wv[r], d, dst[r] + k);
      for (int t = 0; t < T; ++t) {
        const VF xv = hn::LoadU(d, x[t] + k);
        for (int r = 0; r < R; ++r) acc[t][r] = Fma(xv, wv[r], acc[t][r]);
      }
    }
  }
  if (Kfull < K) {
    VF wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadTail<Dec>(d, rows[r] + Kfull, K - Kfull, s[r]);
    if constexpr (kStore)
      for (int r = 0; r < R; ++r) hn::Store(wv[r], d, dst[r] + Kfull);
    for (int t = 0; t < T; ++t) {
      const VF xv = hn::LoadU(d, xt + t * kMaxLanes);
      for (int r = 0; r < R; ++r) acc[t][r] = Fma(xv, wv[r], acc[t][r]);
    }
  }
  ReduceMany(&acc[0][0], T * R, res);
}

// One x tile of T rows starting at x row m0 against rows [n, n + R) of w (the job's weight, or the f32
// copy of its rows a previous tile stored): computes and stores y[m0 .. m0 + T)[ny .. ny + R).
template <class Dec, int T, int R, bool kStore>
HWY_INLINE void FusedTileStore(const Job& job, const Weight& w, int64_t n, int64_t ny, const float* xt, int64_t m0,
                               int64_t pf, float* const* dst) {
  const float* xr[T];
  for (int t = 0; t < T; ++t) xr[t] = job.x + (m0 + t) * job.x_stride;
  float res[T * R];
  FusedTile<Dec, T, R, kStore>(w, xr, xt + m0 * kMaxLanes, n, pf, dst, res);
  const float* bias = job.w->bias;
  for (int t = 0; t < T; ++t) {
    float* yr = job.y + (m0 + t) * job.y_stride + ny;
    for (int r = 0; r < R; ++r) yr[r] = bias ? res[t * R + r] + bias[ny + r] : res[t * R + r];
  }
}

// M <= kFusedMaxM: x split into FusedTiles(M) tiles of TM or TM - 1 rows (TM = the largest). For
// each group of R weight rows: the first tile decodes them from memory (prefetching the next group), and
// when there are more tiles it also stores the decoded f32 rows, which the other tiles then read from L1.
template <class Dec, int TM, int R = kRowsFor<Dec, TM>>
void FusedCols(const Job& job, const float* xt) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t tiles = FusedTiles(job.M);
  const int64_t big = job.M - tiles * (TM - 1);  // tiles of TM rows (the others have TM - 1)
  const int64_t stride = job.w->row_stride;
  // f32 copy of the current rows: R rows of Kpad floats, pitch an odd number of vectors (no L1 aliasing).
  const int64_t Kpad = (job.w->K + N - 1) / N * N;
  const int64_t pitch = Kpad + (Kpad / N % 2 == 0 ? N : 0);
  float* copy = tiles > 1 ? FusedScratch().get(static_cast<size_t>(R * pitch)) : nullptr;
  Weight cw;  // the copy as a weight
  cw.dtype = DType::F32;
  cw.N = R;
  cw.K = job.w->K;
  cw.data = reinterpret_cast<const unsigned char*>(copy);
  cw.row_stride = pitch;
  auto group = [&](int64_t n, int64_t pf, auto rows_tag) {
    constexpr int RR = decltype(rows_tag)::value;
    float* dst[RR];
    // One tile keeps no copy (copy is null, and null + offset is undefined even unused).
    for (int r = 0; r < RR; ++r) dst[r] = copy != nullptr ? copy + r * pitch : nullptr;
    if (tiles == 1) {
      FusedTileStore<Dec, TM, RR, false>(job, *job.w, n, n, xt, 0, pf, dst);
      return;
    }
    int64_t m0 = 0;
    for (int64_t i = 0; i < tiles; ++i) {
      if (i == 0) {  // tiles > 1: the first is a big one
        FusedTileStore<Dec, TM, RR, true>(job, *job.w, n, n, xt, m0, pf, dst);
        m0 += TM;
      } else if (i < big) {
        FusedTileStore<DecF32, TM, RR, false>(job, cw, 0, n, xt, m0, 0, dst);
        m0 += TM;
      } else if constexpr (TM > 1) {
        FusedTileStore<DecF32, TM - 1, RR, false>(job, cw, 0, n, xt, m0, 0, dst);
        m0 += TM - 1;
      }
    }
  };
  const int64_t pf_end = std::max(job.n1, job.prefetch_end);
  int64_t n = job.n0;
  for (; n + R <= job.n1; n += R)
    group(n, n + 2 * R <= pf_end ? R * stride : 0, std::integral_constant<int, R>());
  for (; n < job.n1; ++n) group(n, 0, std::integral_constant<int, 1>());
}

// ---- tiny K: rows of at most kTinyKVectors vectors ------------------------------------------------------

// M <= kFusedMaxM, K <= kTinyKVectors · Lanes, unscaled decoders. Each group of kTinyRows weight rows is
// decoded once into an L1 buffer; every x row then runs the group's chains from there and reduces them
// together. The chain of each output is FusedTile's: lane j sums fma(x[k], w[k]) over k ≡ j (mod Lanes),
// ascending, from zero, the k tail as one zero-padded vector (x's from xt, as the fused tiles read it),
// then ReduceMany and the bias.
template <class Dec, int NV>  // NV = ceil(K / Lanes): whole groups stay in registers
void TinyKColsN(const Job& job, const float* xt) {
  static_assert(!Dec::kScaled);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const Weight& w = *job.w;
  const int64_t K = w.K, Kfull = K - K % N;
  const VF one = hn::Set(d, 1.0f);
  HWY_ALIGN float buf[kTinyRows * NV * kMaxLanes];
  float res[kTinyRows];
  const float* bias = w.bias;
  for (int64_t n = job.n0; n < job.n1; n += kTinyRows) {
    const int g = static_cast<int>(std::min<int64_t>(kTinyRows, job.n1 - n));
    for (int r = 0; r < g; ++r) {
      const typename Dec::T* row = RowPtr<Dec>(w, n + r);
      float* dst = buf + r * NV * N;
      for (int v = 0; v < NV; ++v)
        hn::Store(v * N < Kfull ? Dec::Load(d, row + v * N, one) : LoadTail<Dec>(d, row + Kfull, K - Kfull, one), d,
                  dst + v * N);
    }
    for (int64_t m = 0; m < job.M; ++m) {
      const float* x = job.x + m * job.x_stride;
      VF xv[NV];
      for (int v = 0; v < NV; ++v) xv[v] = v * N < Kfull ? hn::LoadU(d, x + v * N) : hn::Load(d, xt + m * kMaxLanes);
      VF acc[kTinyRows];
      for (int r = 0; r < kTinyRows; ++r) {  // (rows past g: zero, never stored)
        const float* wr = buf + r * NV * N;
        acc[r] = hn::Zero(d);
        if (r < g)
          for (int v = 0; v < NV; ++v) acc[r] = Fma(xv[v], hn::Load(d, wr + v * N), acc[r]);
      }
      float* y = job.y + m * job.y_stride + n;
      if (bias) {
        ReduceMany(acc, g, res);
        for (int r = 0; r < g; ++r) y[r] = res[r] + bias[n + r];
      } else {
        ReduceMany(acc, g, y);
      }
    }
  }
}

template <class Dec>
void TinyKCols(const Job& job, const float* xt) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  static_assert(kTinyKVectors == 4);
  switch ((job.w->K + N - 1) / N) {
    case 1:
      return TinyKColsN<Dec, 1>(job, xt);
    case 2:
      return TinyKColsN<Dec, 2>(job, xt);
    case 3:
      return TinyKColsN<Dec, 3>(job, xt);
    default:
      return TinyKColsN<Dec, 4>(job, xt);
  }
}

// ---- panel tiles: TT x rows by RR fp32 weight rows, accumulators in memory ----------------------------

// Adds nvec vectors of (x row t) · (weight row r) into acc + (t * acc_stride + r) * Lanes.
template <int TT, int RR>
HWY_NOINLINE void PanelTile(const float* const* xr, const float* const* wr, int64_t nvec, float* acc,
                            int64_t acc_stride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a[TT][RR];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < RR; ++r) a[t][r] = hn::Load(d, acc + (t * acc_stride + r) * N);
  const float* x[TT];
  const float* w[RR];
  for (int t = 0; t < TT; ++t) x[t] = xr[t];
  for (int r = 0; r < RR; ++r) w[r] = wr[r];
  for (int64_t j = 0; j < nvec * N; j += N) {
    VF wv[RR];
    for (int r = 0; r < RR; ++r) wv[r] = hn::Load(d, w[r] + j);
    for (int t = 0; t < TT; ++t) {
      const VF xv = hn::LoadU(d, x[t] + j);
      for (int r = 0; r < RR; ++r) a[t][r] = Fma(xv, wv[r], a[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < RR; ++r) hn::Store(a[t][r], d, acc + (t * acc_stride + r) * N);
}

template <int TT>
void PanelTileRows(int rr, const float* const* xr, const float* const* wr, int64_t nvec, float* acc,
                   int64_t acc_stride) {
  static_assert(kTileN == 4);
  switch (rr) {
    case 4:
      return PanelTile<TT, 4>(xr, wr, nvec, acc, acc_stride);
    case 3:
      return PanelTile<TT, 3>(xr, wr, nvec, acc, acc_stride);
    case 2:
      return PanelTile<TT, 2>(xr, wr, nvec, acc, acc_stride);
    default:
      return PanelTile<TT, 1>(xr, wr, nvec, acc, acc_stride);
  }
}

void PanelTileDispatch(int tt, int rr, const float* const* xr, const float* const* wr, int64_t nvec, float* acc,
                       int64_t acc_stride) {
  if constexpr (kTileM >= 4) {
    if (tt == 4) return PanelTileRows<4>(rr, xr, wr, nvec, acc, acc_stride);
    if (tt == 3) return PanelTileRows<3>(rr, xr, wr, nvec, acc, acc_stride);
  }
  if (tt == 2) return PanelTileRows<2>(rr, xr, wr, nvec, acc, acc_stride);
  return PanelTileRows<1>(rr, xr, wr, nvec, acc, acc_stride);
}

// Asks for bytes [b0, b1) of weight row n into L2 (ahead of their decode).
HWY_INLINE void PrefetchRow(const Weight& w, size_t esize, int64_t n, int64_t b0, int64_t b1) {
  const unsigned char* row = w.data + static_cast<size_t>(n * w.row_stride) * esize;
  for (int64_t b = b0; b < b1; b += 64) __builtin_prefetch(row + b, 0, 2);
}

template <class Dec>
void PanelCols(const Job& job) {
  const DF d;
  const Weight& w = *job.w;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N, Kpad = (K + N - 1) / N * N;
  const size_t esize = sizeof(typename Dec::T);
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
      // The next panel's rows are fetched while this one computes: chunk c prefetches their bytes of
      // the same k range (first x-row block only).
      const int64_t next0 = nb + pc, next1 = std::min(job.n1, next0 + P);
      for (int64_t k0 = 0; k0 < Kpad; k0 += kChunk) {
        const int64_t k1 = std::min(Kpad, k0 + kChunk);
        const bool tail = k1 == Kpad && Kfull < K;
        const int64_t nfull = (k1 - k0) / N - (tail ? 1 : 0);
        if (mb == 0)
          for (int64_t r = next0; r < next1; ++r)
            PrefetchRow(w, esize, r, k0 * static_cast<int64_t>(esize),
                        std::min(k1, K) * static_cast<int64_t>(esize));
        for (int64_t m = 0; m < mc; m += kTileM) {
          const int tt = static_cast<int>(std::min<int64_t>(kTileM, mc - m));
          const float* xr[kTileM];
          const float* xtr[kTileM];
          for (int t = 0; t < tt; ++t) {
            xr[t] = job.x + (mb + m + t) * job.x_stride + k0;
            xtr[t] = xt + (m + t) * kMaxLanes;
          }
          for (int64_t r = 0; r < pc; r += kTileN) {
            const int rr = static_cast<int>(std::min<int64_t>(kTileN, pc - r));
            const float* wr[kTileN];
            for (int j = 0; j < rr; ++j) wr[j] = panel + (r + j) * pitch + k0;
            float* a = acc + (m * pc + r) * N;
            PanelTileDispatch(tt, rr, xr, wr, nfull, a, pc);
            if (tail) {
              for (int j = 0; j < rr; ++j) wr[j] += nfull * N;
              PanelTileDispatch(tt, rr, xtr, wr, 1, a, pc);
            }
          }
        }
      }
      for (int64_t m = 0; m < mc; ++m) {
        float* yr = job.y + (mb + m) * job.y_stride;
        float dots[kPanelRows];
        VF v[kPanelRows];
        for (int64_t r = 0; r < pc; ++r) v[r] = hn::Load(d, acc + (m * pc + r) * N);
        ReduceMany(v, static_cast<int>(pc), dots);
        for (int64_t r = 0; r < pc; ++r) yr[nb + r] = w.bias ? dots[r] + w.bias[nb + r] : dots[r];
      }
    }
  }
}

template <class Dec>
void ColsFor(const Job& job);

Scratch PrescaleScratch() { return {ops::ScratchKind::kPrescale}; }

void Fp8StreamedRows(const Job& job, bool bits);

// o[k] = x[k] · 256 · s(n, k / block_in) for k < K: x' for the scale-block row that holds weight row n; with
// `bits`, x'' = x' · 2^112 (DecFP8Bits). Returns false when some |x'| >= 2^16 (x'' would overflow: the caller
// forms x' again without `bits` and takes DecFP8Raw).
bool PrescaleX(const Weight& w, int64_t n, const float* x, float* o, bool bits) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float extra = bits ? kFp8BitsExtra : 1.0f;
  const VF ev = hn::Set(d, extra);
  VF vmax = hn::Zero(d);
  float smax = 0.0f;
  for (int64_t b0 = 0; b0 < w.K; b0 += w.block_in) {
    const float s = scale_of(w, n, b0 / w.block_in) * kFp8ScaleBias;
    const VF sv = hn::Set(d, s);
    const int64_t b1 = std::min(w.K, b0 + w.block_in);
    int64_t k = b0;
    for (; k + N <= b1; k += N) {
      const VF t = hn::Mul(hn::LoadU(d, x + k), sv);
      vmax = hn::Max(vmax, hn::Abs(t));
      hn::Store(hn::Mul(t, ev), d, o + k);
    }
    for (; k < b1; ++k) {
      const float t = x[k] * s;
      smax = std::max(smax, std::fabs(t));
      o[k] = t * extra;
    }
  }
  // (NaN x: a NaN output whichever route, as the scalar reference gives)
  return !bits || std::max(hn::GetLane(hn::MaxOfLanes(d, vmax)), smax) < kFp8BitsLimit;
}

// The end of the run of rows from n that share row n's scale block (rows of w; at most n1).
HWY_INLINE int64_t ScaleBlockEnd(const Weight& w, int64_t n, int64_t n1) {
  return std::min(n1, ((w.scale_row0 + n) / w.block_out + 1) * w.block_out - w.scale_row0);
}

// Whether this target's decode-sized FP8 matmuls take DecFP8Bits (matmul_kernels.h, Fp8Decode).
bool Fp8BitsRoute();

// FP8 through activations that carry the scale: for each scale-block row of weight rows, x' = x · 256 · s
// (one rounding, per k block) is formed once and multiplied by the unscaled weights (DecFP8Raw, or x'' and
// DecFP8Bits for decode-sized calls where that is faster), which saves the decoder's multiply per weight
// vector. x' depends only on x and the scales, so every path (fused or panel, any M, any thread split, either
// decoder) computes each output from the same products in the same chain.
constexpr int64_t kPrescaleRows = 256;  // x rows prepared at once for prefill (x' scratch bounded)
void Fp8PrescaledCols(const Job& job) {
  const bool bits = job.M <= kFusedMaxM && Fp8BitsRoute();
  // Decode and verify against a matrix that streams from memory (1 MB and more: far from cache-resident in
  // a model that has it) with rows of at most 2 KB: rows as sequential streams (Fp8StreamedRows).
  // Cache-resident weights (the bundled model's) and longer rows keep the contiguous tiles, faster there.
  if (job.M <= kStreamMaxM && job.w->K <= kShortK && job.w->N * job.w->K >= (int64_t(1) << 20) &&
      job.n1 - job.n0 >= 2 * kShortRowsOne)
    return Fp8StreamedRows(job, bits);
  const Weight& w = *job.w;
  const int64_t K = w.K, pitch = (K + kMaxLanes - 1) / kMaxLanes * kMaxLanes;
  const int64_t MC = std::min(job.M, job.M <= kFusedMaxM ? kFusedMaxM : kPrescaleRows);
  float* xs = PrescaleScratch().get(static_cast<size_t>(MC * pitch));
  for (int64_t m0 = 0; m0 < job.M; m0 += MC) {
    const int64_t mc = std::min(MC, job.M - m0);
    for (int64_t n = job.n0; n < job.n1;) {
      const int64_t ne = ScaleBlockEnd(w, n, job.n1);
      auto prescale = [&](bool with_bits) {
        bool fits = true;
        for (int64_t m = 0; m < mc; ++m)
          fits &= PrescaleX(w, n, job.x + (m0 + m) * job.x_stride, xs + m * pitch, with_bits);
        return fits;
      };
      const bool use_bits = bits && prescale(true);
      if (!use_bits) prescale(false);  // (the f16 route, or some |x'| >= 2^16)
      Job sub = job;
      sub.x = xs;
      sub.x_stride = pitch;
      sub.M = mc;
      sub.y = job.y + m0 * job.y_stride;
      sub.n0 = n;
      sub.n1 = ne;
      sub.prefetch_end = std::max(job.n1, job.prefetch_end);
      if (use_bits)
        ColsFor<DecFP8Bits>(sub);
      else
        ColsFor<DecFP8Raw>(sub);
      n = ne;
    }
  }
}

// ---- decode and verify rows, FP8, weight rows read as sequential streams ----------------------------

// res[t * R + r] = dot(x'_{t,r}, weight row rows[r]) for T x rows and R weight rows anywhere in w, prefetching
// row rows[r] + 1 (Dec: DecFP8Raw, or DecFP8Bits with x''). x'_{t,r} (x row t's x' for the scale block of row
// rows[r], zero-padded to a whole vector past K) is x[t * R + r], or x[t] for every r when kSharedX (the R rows
// share a scale block: each x vector is loaded once for all of them). Each output's chain is FusedTile<Dec, 1,
// R>'s (multiply-adds in k order, pairs of vectors or single ones alike, then the tail, then ReduceMany, which
// sums each accumulator on its own), so the values are the contiguous tiles', for any T.
template <class Dec, int T, int R, bool kSharedX>
HWY_NOINLINE void StreamTile(const Weight& w, const int64_t* row, const float* const* x, bool prefetch, float* res) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N;
  const VF one = hn::Set(d, 1.0f);
  auto xp = [&](int t, int r) { return x[kSharedX ? t : t * R + r]; };
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = RowPtr<Dec>(w, row[r]);
  const int64_t pf = prefetch ? w.row_stride : 0;
  VF acc[T * R];
  for (int i = 0; i < T * R; ++i) acc[i] = hn::Zero(d);
  int64_t k = 0;
  if constexpr (kPairFor<Dec, 1>) {
    for (; k + 2 * N <= Kfull; k += 2 * N) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(rows[r] + pf + k, 0, 2);
      if constexpr (kSharedX) {
        VF xlo[T], xhi[T];
        for (int t = 0; t < T; ++t) {
          xlo[t] = hn::LoadU(d, x[t] + k);
          xhi[t] = hn::LoadU(d, x[t] + k + N);
        }
        for (int r = 0; r < R; ++r) {
          VF lo, hi;
          Load2<Dec, T == 1>(d, rows[r] + k, one, lo, hi);
          for (int t = 0; t < T; ++t) {
            acc[t * R + r] = Fma(xlo[t], lo, acc[t * R + r]);
            acc[t * R + r] = Fma(xhi[t], hi, acc[t * R + r]);
          }
        }
      } else {
        for (int r = 0; r < R; ++r) {
          VF lo, hi;
          Load2<Dec, T == 1>(d, rows[r] + k, one, lo, hi);
          for (int t = 0; t < T; ++t) {
            VF& a = acc[t * R + r];
            a = Fma(hn::LoadU(d, xp(t, r) + k), lo, a);
            a = Fma(hn::LoadU(d, xp(t, r) + k + N), hi, a);
          }
        }
      }
    }
  }
  for (; k < Kfull; k += N) {
    if (k % 64 == 0)
      for (int r = 0; r < R; ++r) __builtin_prefetch(rows[r] + pf + k, 0, 2);
    for (int r = 0; r < R; ++r) {
      const VF wv = Dec::Load(d, rows[r] + k, one);
      for (int t = 0; t < T; ++t) acc[t * R + r] = Fma(hn::LoadU(d, xp(t, r) + k), wv, acc[t * R + r]);
    }
  }
  if (Kfull < K)
    for (int r = 0; r < R; ++r) {
      const VF wv = LoadTail<Dec>(d, rows[r] + Kfull, K - Kfull, one);
      for (int t = 0; t < T; ++t) acc[t * R + r] = Fma(hn::LoadU(d, xp(t, r) + Kfull), wv, acc[t * R + r]);
    }
  ReduceMany(acc, T * R, res);
}

// Rows [n0, n1) read as R sequential streams, tile g taking row g of each of R equal sub-ranges: the hardware
// prefetcher follows one stream per 4 KB page, and R rows interleaved inside the same pages defeat it (a
// standalone loop on the 2-vCPU Xeon read rows of 768 / 2048 / 4096 bytes at 12.1 / 13.4 / 14.5 GB/s as
// contiguous tiles and 16.4 / 15.6 / 16.0 GB/s as streams; one core, 16.9 GB/s read bandwidth). One x row
// (T = 1) streams over the whole range, each row with its own scale block's x'. Two x rows (a k = 1 verify)
// stream within each scale block, whose rows share x': one x load per x row and weight vector for all R rows
// instead of one per row (streams over the whole range made k = 1 on the 48-layer FP8 synthetic slower than
// the contiguous tiles, within blocks 3-4% faster: docs/performance.md, forty-first session).
// xs: [T][scale blocks of the range][pitch], x' formed as Fp8PrescaledCols does.
template <class Dec, int T>
void StreamRows(const Job& job, const float* xs, int64_t b0, int64_t nblocks, int64_t pitch) {
  constexpr int R = kShortRowsOne;
  constexpr bool kShared = T > 1;
  const Weight& w = *job.w;
  auto x_of = [&](int t, int64_t n) -> const float* {
    return xs + (t * nblocks + (w.scale_row0 + n) / w.block_out - b0) * pitch;
  };
  auto store = [&](const int64_t* row, const float* res, int count) {
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < count; ++r) {
        const float v = res[t * count + r];
        job.y[t * job.y_stride + row[r]] = w.bias ? v + w.bias[row[r]] : v;
      }
  };
  int64_t row[R];
  const float* x[T * R];
  float res[T * R];
  auto run = [&](int64_t n0, int64_t n1) {
    const int64_t G = (n1 - n0) / R;  // rows per stream
    for (int64_t g = 0; g < G; ++g) {
      for (int r = 0; r < R; ++r) row[r] = n0 + r * G + g;
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < (kShared ? 1 : R); ++r) x[kShared ? t : t * R + r] = x_of(t, row[r]);
      StreamTile<Dec, T, R, kShared>(w, row, x, g + 1 < G, res);
      store(row, res, R);
    }
    for (int64_t n = n0 + R * G; n < n1; ++n) {  // the remainder, one row at a time
      row[0] = n;
      for (int t = 0; t < T; ++t) x[t] = x_of(t, n);
      StreamTile<Dec, T, 1, true>(w, row, x, false, res);
      store(row, res, 1);
    }
  };
  if constexpr (!kShared) {
    run(job.n0, job.n1);
  } else {
    for (int64_t n = job.n0; n < job.n1;) {  // scale block by scale block
      const int64_t ne = ScaleBlockEnd(w, n, job.n1);
      run(n, ne);
      n = ne;
    }
  }
}

template <class Dec>
void StreamRowsFor(const Job& job, const float* xs, int64_t b0, int64_t nblocks, int64_t pitch) {
  static_assert(kStreamMaxM == 2);
  if (job.M == 1) return StreamRows<Dec, 1>(job, xs, b0, nblocks, pitch);
  StreamRows<Dec, 2>(job, xs, b0, nblocks, pitch);
}

void Fp8StreamedRows(const Job& job, bool bits) {
  const Weight& w = *job.w;
  const int64_t K = w.K, pitch = (K + kMaxLanes - 1) / kMaxLanes * kMaxLanes;
  const int64_t b0 = (w.scale_row0 + job.n0) / w.block_out, b1 = (w.scale_row0 + job.n1 - 1) / w.block_out;
  const int64_t nblocks = b1 - b0 + 1;
  float* xs = PrescaleScratch().get(static_cast<size_t>(job.M * nblocks * pitch));  // [M, blocks, pitch]
  auto prescale = [&](bool with_bits) {
    bool fits = true;
    for (int64_t m = 0; m < job.M; ++m)
      for (int64_t b = b0; b <= b1; ++b) {
        float* o = xs + (m * nblocks + b - b0) * pitch;
        const int64_t n = std::max(job.n0, b * w.block_out - w.scale_row0);  // (a row of block b)
        fits &= PrescaleX(w, n, job.x + m * job.x_stride, o, with_bits);
        std::fill(o + K, o + pitch, 0.0f);
      }
    return fits;
  };
  if (bits && prescale(true)) return StreamRowsFor<DecFP8Bits>(job, xs, b0, nblocks, pitch);
  prescale(false);  // (the f16 route, or some |x'| >= 2^16)
  StreamRowsFor<DecFP8Raw>(job, xs, b0, nblocks, pitch);
}

template <class Dec>
void ColsFor(const Job& job) {
  if constexpr (std::is_same_v<Dec, DecFP8>) {
    if (!job.w->fp8_table) return Fp8PrescaledCols(job);
  }
  if (job.M <= kFusedMaxM && !job.w->fp8_table) {
    const DF d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    const int64_t K = job.w->K, Kfull = K - K % N;
    HWY_ALIGN float xt[kFusedMaxM * kMaxLanes] = {};
    if (Kfull < K)
      for (int64_t m = 0; m < job.M; ++m) std::copy_n(job.x + m * job.x_stride + Kfull, K - Kfull, xt + m * kMaxLanes);
    // (one x row with 3-4 vectors a row: the buffer's round trip costs what the reductions save, measured
    // on AVX2; the fused tile keeps the weights in registers)
    if constexpr (!Dec::kScaled)
      if (K <= (job.M > 1 ? kTinyKVectors : 2) * N) return TinyKCols<Dec>(job, xt);
    const int64_t tiles = FusedTiles(job.M);
    switch ((job.M + tiles - 1) / tiles) {  // rows of the largest x tile
      case 1:
        // Short rows (small experts, attention projections): twice the weight rows per tile halve the
        // per-tile cost (setup, the lane reduction) per weight; measured 5-10% faster for K = 96..2048.
        if (kShortRowsOne > kFusedRows<1> && K <= kShortK) return FusedCols<Dec, 1, kShortRowsOne>(job, xt);
        return FusedCols<Dec, 1>(job, xt);
      case 2:
        return FusedCols<Dec, 2>(job, xt);
      case 3:
        return FusedCols<Dec, 3>(job, xt);
      case 4:
        return FusedCols<Dec, 4>(job, xt);
      case 5:
        return FusedCols<Dec, 5>(job, xt);
      case 6:
        return FusedCols<Dec, 6>(job, xt);
      case 7:
        return FusedCols<Dec, 7>(job, xt);
      default:
        return FusedCols<Dec, 8>(job, xt);
    }
  }
  PanelCols<Dec>(job);
}

// ---- which FP8 decoder decode-sized calls take (matmul_kernels.h, Fp8Decode) ----------------------------

// Times both decoders on cache-resident FP8 rows holding every finite e4m3 code, subnormals included, and
// checks that they give the same bits (a CPU flushing subnormal inputs, DAZ, would not): the bit route when
// it agrees and is at least 10% faster (the fastest of 5 interleaved rounds of each; ~0.2 ms in all).
bool MeasureBitsRoute() {
  constexpr int R = kFusedRows<1>;
  constexpr int64_t kRows = 4 * R, K = 1024, kReps = 16;
  std::vector<int8_t> bytes(static_cast<size_t>(kRows * K));
  uint32_t rng = 12345;
  for (int8_t& b : bytes) {
    do rng = rng * 1664525u + 1013904223u;
    while (((rng >> 24) & 0x7f) == 0x7f);  // (no NaN codes)
    b = static_cast<int8_t>(rng >> 24);
  }
  HWY_ALIGN float x[K], x2[K], xt[kMaxLanes] = {};
  for (int64_t k = 0; k < K; ++k) {
    rng = rng * 1664525u + 1013904223u;
    x[k] = static_cast<float>(static_cast<int32_t>(rng)) * 0x1p-31f;
    x2[k] = x[k] * kFp8BitsExtra;
  }
  Weight w;
  w.dtype = DType::F8_E4M3;
  w.N = kRows;
  w.K = K;
  w.row_stride = K;
  w.data = reinterpret_cast<const unsigned char*>(bytes.data());
  float res[2][kRows];
  float* const no_dst[R] = {};
  auto run = [&](auto dec) {
    using Dec = decltype(dec);
    const bool bits = std::is_same_v<Dec, DecFP8Bits>;
    const float* xr[1] = {bits ? x2 : x};
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t rep = 0; rep < kReps; ++rep)
      for (int64_t n = 0; n < kRows; n += R) FusedTile<Dec, 1, R, false>(w, xr, xt, n, 0, no_dst, res[bits] + n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double f16 = 1e9, fields = 1e9;
  for (int round = 0; round < 5; ++round) {
    f16 = std::min(f16, run(DecFP8Raw{}));
    fields = std::min(fields, run(DecFP8Bits{}));
  }
  return std::memcmp(res[0], res[1], sizeof(res[0])) == 0 && fields < 0.9 * f16;
}

bool Fp8BitsRoute() {
  if constexpr (HWY_TARGET == HWY_SCALAR) return false;
  switch (fp8_decode_setting()) {
    case Fp8Decode::kF16:
      return false;
    case Fp8Decode::kBits:
      return true;
    default:
      break;
  }
  static const bool measured = MeasureBitsRoute();  // (once per target)
  return measured;
}

const char* ActiveFp8DecodeName() { return Fp8BitsRoute() ? "bits" : "f16"; }

// Calls f(Dec{}) with the decoder of weight dtype t (validated by the caller: F32, BF16, F16, F8_E4M3).
template <class F>
HWY_INLINE void WithDecoder(DType t, const F& f) {
  switch (t) {
    case DType::F32:
      return f(DecF32{});
    case DType::BF16:
      return f(DecBF16{});
    case DType::F16:
      return f(DecF16{});
    default:  // F8_E4M3
      return f(DecFP8{});
  }
}

void MatmulCols(const Job* job) {
  WithDecoder(job->w->dtype, [&](auto dec) { ColsFor<decltype(dec)>(*job); });
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
  WithDecoder(w->dtype, [&](auto dec) { DequantFor<decltype(dec)>(*w, r, out); });
}

// y[m][k] += Σ_r x[m][r] · w[r][k], r ascending for every (m, k): the same chain of fused multiply-adds
// whatever M (one row-by-row axpy per element). y is kept in registers over blocks of vectors while the
// rows stream past (decoded per block, once for up to kTransRows rows of x), instead of being read and
// written once per weight row.
constexpr int64_t kTransBlock = 8;  // vectors of y per block, one x row
constexpr int64_t kTransRows = 6;   // x rows per block with several rows (at most)
constexpr int64_t kTransRowBlock = 4;  // vectors of y per block then (kTransRows x kTransRowBlock accumulators)
template <class Dec>
void TransposedFor(const float* x, int64_t M, int64_t x_stride, const Weight& w, float* y, int64_t y_stride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = w.K, Kfull = K - K % N;
  HWY_ALIGN float buf[kTransBlock * kMaxLanes];
  auto decode = [&](int64_t r, int64_t k0, int64_t k1) {
    if (w.fp8_table)
      DecodeRangeTable(d, w, r, k0, k1, buf);
    else
      DecodeRange<Dec>(d, w, r, k0, k1, buf);
  };
  // Rows [m0, m0 + MC) of x over vectors [k0, k0 + nv·N) of y.
  auto block = [&](auto mc_tag, int64_t m0, int64_t k0, int64_t nv) {
    constexpr int64_t MC = decltype(mc_tag)::value;
    constexpr int64_t NV = MC == 1 ? kTransBlock : kTransRowBlock;
    VF acc[MC][NV];
    for (int64_t m = 0; m < MC; ++m)
      for (int64_t j = 0; j < nv; ++j) acc[m][j] = hn::LoadU(d, y + (m0 + m) * y_stride + k0 + j * N);
    for (int64_t r = 0; r < w.N; ++r) {
      decode(r, k0, k0 + nv * N);
      for (int64_t m = 0; m < MC; ++m) {
        const VF xv = hn::Set(d, x[(m0 + m) * x_stride + r]);
        for (int64_t j = 0; j < nv; ++j) acc[m][j] = Fma(xv, hn::Load(d, buf + j * N), acc[m][j]);
      }
    }
    for (int64_t m = 0; m < MC; ++m)
      for (int64_t j = 0; j < nv; ++j) hn::StoreU(acc[m][j], d, y + (m0 + m) * y_stride + k0 + j * N);
  };
  const int64_t step = (M == 1 ? kTransBlock : kTransRowBlock) * N;
  for (int64_t k0 = 0; k0 < Kfull; k0 += step) {
    const int64_t nv = std::min(step, Kfull - k0) / N;
    if (M == 1) {
      block(std::integral_constant<int64_t, 1>(), 0, k0, nv);
      continue;
    }
    int64_t m0 = 0;
    // Blocks of up to kTransRows rows (a verify step of k + 1 <= 6 rows decodes each weight row once).
    for (; m0 + kTransRows <= M; m0 += kTransRows) block(std::integral_constant<int64_t, kTransRows>(), m0, k0, nv);
    using std::integral_constant;
    static_assert(kTransRows <= 6, "the rest below is at most 5 rows");
    switch (M - m0) {  // the rest (< kTransRows rows) as one block
      case 5: block(integral_constant<int64_t, 5>(), m0, k0, nv); break;
      case 4: block(integral_constant<int64_t, 4>(), m0, k0, nv); break;
      case 3: block(integral_constant<int64_t, 3>(), m0, k0, nv); break;
      case 2: block(integral_constant<int64_t, 2>(), m0, k0, nv); break;
      case 1: block(integral_constant<int64_t, 1>(), m0, k0, nv); break;
      default: break;
    }
  }
  if (Kfull < K)
    for (int64_t r = 0; r < w.N; ++r) {
      decode(r, Kfull, K);
      for (int64_t m = 0; m < M; ++m) {
        float* yr = y + m * y_stride;
        const float xr = x[m * x_stride + r];
        for (int64_t k = Kfull; k < K; ++k) yr[k] = std::fma(xr, buf[k - Kfull], yr[k]);
      }
    }
}

void MatmulTransposed(const float* x, int64_t M, int64_t x_stride, const Weight* w, float* y, int64_t y_stride) {
  WithDecoder(w->dtype, [&](auto dec) { TransposedFor<decltype(dec)>(x, M, x_stride, *w, y, y_stride); });
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
HWY_EXPORT(ActiveFp8DecodeName);

void matmul_cols(const Job& job) { HWY_DYNAMIC_DISPATCH(MatmulCols)(&job); }
void dequant_row(const Weight& w, int64_t r, float* out) { HWY_DYNAMIC_DISPATCH(DequantRow)(&w, r, out); }
void matmul_transposed(const float* x, int64_t M, int64_t x_stride, const Weight& w, float* y, int64_t y_stride) {
  HWY_DYNAMIC_DISPATCH(MatmulTransposed)(x, M, x_stride, &w, y, y_stride);
}
const char* active_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
const char* active_fp8_decode_name() { return HWY_DYNAMIC_DISPATCH(ActiveFp8DecodeName)(); }
int64_t compiled_targets() { return HWY_TARGETS; }

// NEXTN_CPU_TARGET is applied before main, so before the first kernel call of any program with these kernels.
[[maybe_unused]] const bool kCpuTargetApplied = (cpu_target::apply_env(), true);

}  // namespace nextn::matmul_kernels
#endif  // HWY_ONCE
