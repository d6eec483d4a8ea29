// Highway per-target header (included once per target by foreach_target): the arithmetic the SIMD kernels
// share, so that they all multiply-add and sum a vector's lanes the same way.
#if defined(NEXTN_OPS_CPU_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NEXTN_OPS_CPU_REDUCE_INL_H_
#undef NEXTN_OPS_CPU_REDUCE_INL_H_
#else
#define NEXTN_OPS_CPU_REDUCE_INL_H_
#endif

#include <algorithm>
#include <cmath>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace nextn::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a · b + c rounded once, on every target (the scalar one included: never left to the compiler).
template <class V>
HWY_INLINE V Fma(V a, V b, V c) {
#if HWY_TARGET == HWY_SCALAR
  const hn::DFromV<V> d;
  return hn::Set(d, std::fma(hn::GetLane(a), hn::GetLane(b), hn::GetLane(c)));
#else
  return hn::MulAdd(a, b, c);
#endif
}

// out[i] = the sum of the lanes of acc[i], i < n, by one fixed tree per target whatever n and whatever the
// other accumulators (they only share shuffles, never additions), so a dot product's value does not depend
// on the tile it was computed in. Several accumulators are reduced together by transposing them, which
// costs about 3 instructions per accumulator instead of ~8 for one-at-a-time reductions: small-K products
// (attention scores, the indexer, small experts) spend most of their time here otherwise.
//   AVX-512: lane j + lane j+8, then + (j+4 + j+12), then within each 4-lane block (l0 + l2) + (l1 + l3).
//   AVX2:    lane j + lane j+4, then (l0 + l2) + (l1 + l3).
//   others:  the target's SumOfLanes.
#if HWY_TARGET <= HWY_AVX2
// The last stage of ReduceMany on x86: within each 128-bit block, lane j of the result is
// (t_j.l0 + t_j.l2) + (t_j.l1 + t_j.l3) (a 4x4 transpose by interleaving, adding as it goes).
template <class VF>
HWY_INLINE VF SumBlocksOf4(VF t0, VF t1, VF t2, VF t3) {
  const hn::DFromV<VF> d;
  const hn::Repartition<double, decltype(d)> dd;
  const VF u01 = hn::Add(hn::InterleaveLower(d, t0, t1), hn::InterleaveUpper(d, t0, t1));
  const VF u23 = hn::Add(hn::InterleaveLower(d, t2, t3), hn::InterleaveUpper(d, t2, t3));
  const auto a = hn::BitCast(dd, u01), b = hn::BitCast(dd, u23);
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, a, b)), hn::BitCast(d, hn::InterleaveUpper(dd, a, b)));
}
#endif

template <class VF>
HWY_INLINE void ReduceMany(const VF* acc, int n, float* out) {
#if HWY_TARGET <= HWY_AVX3
  const __m512 z = _mm512_setzero_ps();
  for (int g0 = 0; g0 < n; g0 += 16) {
    const int m = std::min(16, n - g0);
    __m512 t[4];  // t[q] block k: accumulator 4q + k folded to 4 lanes
    for (int q = 0; q < 4; ++q) {
      if (4 * q >= m) {
        t[q] = z;
        continue;
      }
      __m512 v[4];
      for (int i = 0; i < 4; ++i) v[i] = 4 * q + i < m ? acc[g0 + 4 * q + i].raw : z;
      // [a.B0+a.B2, a.B1+a.B3, b.B0+b.B2, b.B1+b.B3] for the pairs (a, b) = (v0, v1), (v2, v3)
      const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
      const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
      t[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
    }
    // block k, lane j holds accumulator 4j + k: lane 4 (i % 4) + i / 4 goes to out[i], stored in one go
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 sums = _mm512_permutexvar_ps(order, SumBlocksOf4(VF{t[0]}, VF{t[1]}, VF{t[2]}, VF{t[3]}).raw);
    _mm512_mask_storeu_ps(out + g0, static_cast<__mmask16>((1u << m) - 1), sums);
  }
#elif HWY_TARGET == HWY_AVX2
  const __m256 z = _mm256_setzero_ps();
  for (int g0 = 0; g0 < n; g0 += 8) {
    const int m = std::min(8, n - g0);
    __m256 t[4];  // t[p] block k: accumulator 2p + k folded to 4 lanes
    for (int p = 0; p < 4; ++p) {
      const __m256 a = 2 * p < m ? acc[g0 + 2 * p].raw : z, b = 2 * p + 1 < m ? acc[g0 + 2 * p + 1].raw : z;
      t[p] = 2 * p < m ? _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)) : z;
    }
    // block k, lane j holds accumulator 2j + k: lane 4 (i % 2) + i / 2 goes to out[i]
    const __m256 sums = _mm256_permutevar8x32_ps(SumBlocksOf4(VF{t[0]}, VF{t[1]}, VF{t[2]}, VF{t[3]}).raw,
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (m == 8) {
      _mm256_storeu_ps(out + g0, sums);
    } else {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, sums);
      for (int i = 0; i < m; ++i) out[g0 + i] = lanes[i];
    }
  }
#else
  const hn::ScalableTag<float> d;
  for (int i = 0; i < n; ++i) out[i] = hn::GetLane(hn::SumOfLanes(d, acc[i]));
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace nextn::simd
HWY_AFTER_NAMESPACE();

#endif  // NEXTN_OPS_CPU_REDUCE_INL_H_
