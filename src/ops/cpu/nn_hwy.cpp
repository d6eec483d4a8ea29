// SIMD kernels of the per-row work around the matmuls: the DSA indexer's key scores, the attention softmax
// (with its sink) and value sum, and the exp-based activations. One Highway source for every x86 target,
// chosen at run time like the matmul kernels.
//
// Numerics: each output element is computed by the same instructions in the same order whatever the
// number of rows, keys or threads of the call (keys are independent; chunks of keys give the same
// values), so results stay batch invariant. exp is Highway's (max error 1 ulp).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/nn_hwy.cpp"
#include "ops/cpu/hwy_targets.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// clang-format off
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/contrib/math/math-inl.h"
#include "ops/ops.h"
#include "ops/cpu/reduce-inl.h"
#include "ops/cpu/target_env.h"
#include "ops/cpu/thread_scratch.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace nextn::nn_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using nextn::simd::HWY_NAMESPACE::Fma;
using nextn::simd::HWY_NAMESPACE::ReduceMany;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int64_t kMaxLanes = 16;

// The last n < Lanes elements of p as a vector, the other lanes `fill`.
HWY_INLINE VF LoadTail(DF d, const float* p, int64_t n, float fill) {
  HWY_ALIGN float buf[kMaxLanes];
  for (int64_t i = 0; i < kMaxLanes; ++i) buf[i] = i < n ? p[i] : fill;
  return hn::Load(d, buf);
}
HWY_INLINE void StoreTail(DF d, VF v, int64_t n, float* p) {
  HWY_ALIGN float buf[kMaxLanes];
  hn::Store(v, d, buf);
  std::copy(buf, buf + n, p);
}

// out[j] = Σ_h w[h] · relu(q[h] · keys[j]) for j < n. Heads go across the lanes (q transposed once, padded
// with zero heads of weight 0), keys 8 at a time: per key, dim broadcast multiply-adds per head vector, then
// one lane reduction shared by the 8 keys.
constexpr int kKeyGroup = 8;
void IndexerScores(const float* q, const float* w, int64_t heads, int64_t dim, const float* keys, int64_t n,
                   float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t hv = (heads + N - 1) / N, width = hv * N;
  float* qt = ops::thread_scratch(ops::ScratchKind::kIndexer, static_cast<size_t>((dim + 1) * width + kMaxLanes));
  // qt [dim, width]: qt[k * width + h] = q[h, k]
  float* wp = qt + dim * width;  // [width]
  for (int64_t k = 0; k < dim; ++k)
    for (int64_t h = 0; h < width; ++h) qt[k * width + h] = h < heads ? q[h * dim + k] : 0.0f;
  for (int64_t h = 0; h < width; ++h) wp[h] = h < heads ? w[h] : 0.0f;
  const VF zero = hn::Zero(d);
  for (int64_t j0 = 0; j0 < n; j0 += kKeyGroup) {
    const int g = static_cast<int>(std::min<int64_t>(kKeyGroup, n - j0));
    const float* kr[kKeyGroup];
    for (int t = 0; t < kKeyGroup; ++t) kr[t] = keys + (j0 + std::min(t, g - 1)) * dim;  // short group: repeat
    VF sum[kKeyGroup];
    for (int64_t v = 0; v < hv; ++v) {
      VF acc[kKeyGroup];
      for (int t = 0; t < kKeyGroup; ++t) acc[t] = zero;
      for (int64_t k = 0; k < dim; ++k) {
        const VF qv = hn::LoadU(d, qt + k * width + v * N);
        for (int t = 0; t < kKeyGroup; ++t) acc[t] = Fma(hn::Set(d, kr[t][k]), qv, acc[t]);
      }
      const VF wv = hn::LoadU(d, wp + v * N);
      for (int t = 0; t < kKeyGroup; ++t) {
        const VF r = hn::Mul(hn::Max(acc[t], zero), wv);
        sum[t] = v == 0 ? r : hn::Add(sum[t], r);
      }
    }
    ReduceMany(sum, g, out + j0);
  }
}

// x[j] <- exp(scale · x[j] - m) / (exp(sink - m) + Σ_i exp(scale · x[i] - m)), m = max(sink, scale · x).
void SoftmaxWithSink(float* x, int64_t n, float scale, float sink) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), nf = n - n % N;
  const VF vs = hn::Set(d, scale);
  VF vmax = hn::Set(d, sink);
  for (int64_t j = 0; j < nf; j += N) {
    const VF v = hn::Mul(hn::LoadU(d, x + j), vs);
    hn::StoreU(v, d, x + j);
    vmax = hn::Max(vmax, v);
  }
  const float lowest = -std::numeric_limits<float>::infinity();
  if (nf < n) {
    const VF v = hn::Mul(LoadTail(d, x + nf, n - nf, lowest), vs);
    StoreTail(d, v, n - nf, x + nf);
    vmax = hn::Max(vmax, v);
  }
  const VF m = hn::Set(d, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  VF vsum = hn::Zero(d);
  for (int64_t j = 0; j < nf; j += N) {
    const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + j), m));
    hn::StoreU(e, d, x + j);
    vsum = hn::Add(vsum, e);
  }
  if (nf < n) {  // padding lanes are -inf: exp gives 0
    const VF e = hn::Exp(d, hn::Sub(LoadTail(d, x + nf, n - nf, lowest), m));
    StoreTail(d, e, n - nf, x + nf);
    vsum = hn::Add(vsum, e);
  }
  float total;
  ReduceMany(&vsum, 1, &total);
  total += hn::GetLane(hn::Exp(d, hn::Sub(hn::Set(d, sink), m)));
  const VF inv = hn::Set(d, 1.0f / total);
  for (int64_t j = 0; j < nf; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), inv), d, x + j);
  for (int64_t j = nf; j < n; ++j) x[j] *= hn::GetLane(inv);
}

#if HWY_TARGET != HWY_SCALAR
// acc += the lanes of v, promoted to double (two vectors' worth of double lanes added first).
template <class DD>
HWY_INLINE void AddAsDouble(DD dd, VF v, hn::Vec<DD>& acc) {
  const hn::Half<DF> dh;
  acc = hn::Add(acc, hn::Add(hn::PromoteTo(dd, hn::LowerHalf(dh, v)), hn::PromoteTo(dd, hn::UpperHalf(dh, v))));
}
#endif

// out[j] = exp(scale · x[j] - shift) for j < n; returns Σ_j out[j] (each vector's lanes added in double).
double ExpScaledSum(const float* x, int64_t n, float scale, float shift, float* out) {
  const DF d;
  const VF vs = hn::Set(d, scale), vm = hn::Set(d, shift);
#if HWY_TARGET == HWY_SCALAR
  double total = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = hn::GetLane(hn::Exp(d, hn::Sub(hn::Mul(hn::Set(d, x[j]), vs), vm)));
    total += out[j];
  }
  return total;
#else
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), nf = n - n % N;
  const hn::Repartition<double, DF> dd;
  auto acc = hn::Zero(dd);
  for (int64_t j = 0; j < nf; j += N) {
    const VF e = hn::Exp(d, hn::Sub(hn::Mul(hn::LoadU(d, x + j), vs), vm));
    hn::StoreU(e, d, out + j);
    AddAsDouble(dd, e, acc);
  }
  if (nf < n) {  // padding lanes are -inf: exp gives 0
    const VF e = hn::Exp(d, hn::Sub(hn::Mul(LoadTail(d, x + nf, n - nf, -std::numeric_limits<float>::infinity()), vs), vm));
    StoreTail(d, e, n - nf, out + nf);
    AddAsDouble(dd, e, acc);
  }
  return hn::GetLane(hn::SumOfLanes(dd, acc));
#endif
}

// Σ_j x[j] in double (each vector's lanes promoted and added).
double SumAsDouble(const float* x, int64_t n) {
#if HWY_TARGET == HWY_SCALAR
  double total = 0;
  for (int64_t j = 0; j < n; ++j) total += x[j];
  return total;
#else
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), nf = n - n % N;
  const hn::Repartition<double, DF> dd;
  auto acc = hn::Zero(dd);
  for (int64_t j = 0; j < nf; j += N) AddAsDouble(dd, hn::LoadU(d, x + j), acc);
  if (nf < n) AddAsDouble(dd, LoadTail(d, x + nf, n - nf, 0.0f), acc);
  return hn::GetLane(hn::SumOfLanes(dd, acc));
#endif
}

// The largest of x[0..n) (-inf for n = 0).
float MaxValue(const float* x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), nf = n - n % N;
  const float lowest = -std::numeric_limits<float>::infinity();
  VF m = hn::Set(d, lowest);
  for (int64_t j = 0; j < nf; j += N) m = hn::Max(m, hn::LoadU(d, x + j));
  if (nf < n) m = hn::Max(m, LoadTail(d, x + nf, n - nf, lowest));
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// out[h · out_stride + j] = q_h · row(j) over dim, row(j) = rows + (idx ? idx[j] : j) · row_stride, for h < heads,
// j < n: tiles of 4 heads x 4 rows (16 accumulators), lane l summing k ≡ l (mod Lanes) in ascending k, the
// dim tail as one zero-padded vector, the lanes by ReduceMany — the chain ops::matmul uses, so the values
// are those of a matmul over the gathered rows.
constexpr int kDotTile = 4;
void GatheredDots(const float* q, int64_t heads, int64_t q_stride, const float* rows, int64_t row_stride,
                  const int32_t* idx, int64_t n, int64_t dim, float* out, int64_t out_stride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), dfull = dim - dim % N;
  for (int64_t h0 = 0; h0 < heads; h0 += kDotTile) {
    const int64_t hc = std::min<int64_t>(kDotTile, heads - h0);
    const float* qr[kDotTile];
    for (int a = 0; a < kDotTile; ++a) qr[a] = q + (h0 + std::min<int64_t>(a, hc - 1)) * q_stride;
    for (int64_t j0 = 0; j0 < n; j0 += kDotTile) {
      const int64_t jc = std::min<int64_t>(kDotTile, n - j0);
      const float* kr[kDotTile];
      for (int b = 0; b < kDotTile; ++b) {
        const int64_t j = j0 + std::min<int64_t>(b, jc - 1);
        kr[b] = rows + (idx ? int64_t(idx[j]) : j) * row_stride;
      }
      VF acc[kDotTile][kDotTile];
      for (int a = 0; a < kDotTile; ++a)
        for (int b = 0; b < kDotTile; ++b) acc[a][b] = hn::Zero(d);
      for (int64_t k = 0; k < dfull; k += N) {
        VF kv[kDotTile];
        for (int b = 0; b < kDotTile; ++b) kv[b] = hn::LoadU(d, kr[b] + k);
        for (int a = 0; a < kDotTile; ++a) {
          const VF qv = hn::LoadU(d, qr[a] + k);
          for (int b = 0; b < kDotTile; ++b) acc[a][b] = Fma(qv, kv[b], acc[a][b]);
        }
      }
      if (dfull < dim) {
        VF kv[kDotTile];
        for (int b = 0; b < kDotTile; ++b) kv[b] = LoadTail(d, kr[b] + dfull, dim - dfull, 0.0f);
        for (int a = 0; a < kDotTile; ++a) {
          const VF qv = LoadTail(d, qr[a] + dfull, dim - dfull, 0.0f);
          for (int b = 0; b < kDotTile; ++b) acc[a][b] = Fma(qv, kv[b], acc[a][b]);
        }
      }
      float res[kDotTile * kDotTile];
      ReduceMany(&acc[0][0], kDotTile * kDotTile, res);
      for (int64_t a = 0; a < hc; ++a)
        for (int64_t b = 0; b < jc; ++b) out[(h0 + a) * out_stride + j0 + b] = res[a * kDotTile + b];
    }
  }
}

// out[i] = Σ_j p[j] · row(j)[i] for i < dim, j ascending (one fused multiply-add per term), row(j) =
// rows + (idx ? idx[j] : j) · stride.
constexpr int64_t kSumBlock = 8;  // vectors of out kept in registers while the rows stream past
void WeightedRowSum(const float* p, const float* rows, const int32_t* idx, int64_t n, int64_t dim, int64_t stride,
                    float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), dfull = dim - dim % N;
  for (int64_t i0 = 0; i0 < dfull; i0 += kSumBlock * N) {
    const int64_t nv = std::min(kSumBlock, (dfull - i0) / N);
    VF acc[kSumBlock];
    for (int64_t b = 0; b < nv; ++b) acc[b] = hn::Zero(d);
    for (int64_t j = 0; j < n; ++j) {
      const VF pj = hn::Set(d, p[j]);
      const float* r = rows + (idx ? int64_t(idx[j]) : j) * stride + i0;
      for (int64_t b = 0; b < nv; ++b) acc[b] = Fma(pj, hn::LoadU(d, r + b * N), acc[b]);
    }
    for (int64_t b = 0; b < nv; ++b) hn::StoreU(acc[b], d, out + i0 + b * N);
  }
  for (int64_t i = dfull; i < dim; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc = std::fma(p[j], rows[(idx ? int64_t(idx[j]) : j) * stride + i], acc);
    out[i] = acc;
  }
}

HWY_INLINE VF Sigmoid(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(x))));
}

// out[i] = silu(min(gate[i], limit)) · clamp(up[i], -limit, limit) (no clamp when limit <= 0).
void Swiglu(const float* gate, const float* up, int64_t n, float limit, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const bool clamp = limit > 0;
  const VF hi = hn::Set(d, limit), lo = hn::Set(d, -limit);
  auto one = [&](VF g, VF u) {
    if (clamp) {
      g = hn::Min(g, hi);
      u = hn::Min(hn::Max(u, lo), hi);
    }
    return hn::Mul(hn::Mul(g, Sigmoid(d, g)), u);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(one(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, out + i);
  if (i < n) StoreTail(d, one(LoadTail(d, gate + i, n - i, 0.0f), LoadTail(d, up + i, n - i, 0.0f)), n - i, out + i);
}

// out[i] = x[i] · sigmoid(g[i]).
void MulSigmoid(const float* x, const float* g, int64_t n, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), Sigmoid(d, hn::LoadU(d, g + i))), d, out + i);
  if (i < n)
    StoreTail(d, hn::Mul(LoadTail(d, x + i, n - i, 0.0f), Sigmoid(d, LoadTail(d, g + i, n - i, 0.0f))), n - i,
              out + i);
}

// ---- top-k selection -------------------------------------------------------------------------------------

using DI = hn::RebindToSigned<DF>;
using VI = hn::Vec<DI>;

// An int32 key per float with the same order (larger value, larger key; -0 and +0 equal). Scores are never
// NaN.
HWY_INLINE VI OrderKey(DI di, VF v) {
  const VI b = hn::BitCast(di, hn::Add(v, hn::Zero(DF())));  // -0 + 0 = +0
  return hn::Xor(b, hn::And(hn::ShiftRight<31>(b), hn::Set(di, 0x7FFFFFFF)));  // negatives: value bits flipped
}
HWY_INLINE int32_t OrderKey(float f) {
  int32_t b;
  f += 0.0f;
  std::memcpy(&b, &f, 4);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

// Indices of the k largest of x[0, n) (ties: lower index first), ascending; 0 < k < n. The k-th largest key
// is found bit by bit (32 counting passes at most, each a vector compare over the keys, stopping early
// when a threshold has exactly k keys at or above it), then one pass keeps the keys above it and the
// lowest-index keys equal to it.
int64_t TopkAscending(const float* x, int64_t n, int64_t k, int32_t* out, float* scratch) {
  const DF d;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t nfull = n - n % N;
  int32_t* keys = reinterpret_cast<int32_t*>(scratch);
  VI lo = hn::Set(di, std::numeric_limits<int32_t>::max()), hi = hn::Set(di, std::numeric_limits<int32_t>::min());
  for (int64_t i = 0; i < nfull; i += N) {
    const VI kv = OrderKey(di, hn::LoadU(d, x + i));
    hn::StoreU(kv, di, keys + i);
    lo = hn::Min(lo, kv);
    hi = hn::Max(hi, kv);
  }
  int32_t kmin = hn::GetLane(hn::MinOfLanes(di, lo)), kmax = hn::GetLane(hn::MaxOfLanes(di, hi));
  for (int64_t i = nfull; i < n; ++i) {
    keys[i] = OrderKey(x[i]);
    kmin = std::min(kmin, keys[i]);
    kmax = std::max(kmax, keys[i]);
  }
  auto count_ge = [&](int32_t t) {
    if (t == std::numeric_limits<int32_t>::min()) return n;
    const VI tv = hn::Set(di, t - 1);  // key >= t <=> key > t - 1
    int64_t c = 0;
    for (int64_t i = 0; i < nfull; i += N) c += static_cast<int64_t>(hn::CountTrue(di, hn::Gt(hn::LoadU(di, keys + i), tv)));
    for (int64_t i = nfull; i < n; ++i) c += keys[i] >= t;
    return c;
  };
  // Largest t (in the unsigned image u = key ^ 2^31) with count(key >= t) >= k: the k-th largest key. It
  // lies in [kmin, kmax], so it starts with their common leading bits; the search covers the rest.
  const uint32_t umin = static_cast<uint32_t>(kmin) ^ 0x80000000u, umax = static_cast<uint32_t>(kmax) ^ 0x80000000u;
  const int top = umin == umax ? -1 : 31 - __builtin_clz(umin ^ umax);
  uint32_t u = top < 0 ? umin : umin & ~((uint32_t(2) << top) - 1);  // (2 << 31 wraps to 0: all bits free)
  bool exact = false;  // count(key >= t) == k: every key >= t is taken, no ties to cut
  for (int bit = top; bit >= 0 && !exact; --bit) {
    const uint32_t cand = u | (uint32_t(1) << bit);
    const int64_t c = count_ge(static_cast<int32_t>(cand ^ 0x80000000u));
    if (c >= k) {
      u = cand;
      exact = c == k;
    }
  }
  const int32_t t = static_cast<int32_t>(u ^ 0x80000000u);
  // Keys equal to t that may be taken (the lowest indices): all of them when the count was exact.
  int64_t ties = exact ? n : k - (t == std::numeric_limits<int32_t>::max() ? 0 : count_ge(t + 1));
  const VI tv = hn::Set(di, t);
  int64_t m = 0;
  auto scalar = [&](int64_t i) {
    if (keys[i] > t || (keys[i] == t && ties-- > 0)) out[m++] = static_cast<int32_t>(i);
  };
  int64_t i = 0;
  for (; i < nfull; i += N) {
    const VI kv = hn::LoadU(di, keys + i);
    const auto eq = hn::Eq(kv, tv);
    const int64_t neq = static_cast<int64_t>(hn::CountTrue(di, eq));
    if (neq > ties) {  // the vector where the ties run out: lane by lane
      for (int64_t j = i; j < i + N; ++j) scalar(j);
      continue;
    }
    ties -= neq;
    // CompressBlendedStore writes only the selected lanes; CompressStore may write all N (it does on
    // targets without a native compress-store, AVX2 and the scalar ones), past out's k slots.
    m += static_cast<int64_t>(
        hn::CompressBlendedStore(hn::Iota(di, static_cast<int32_t>(i)), hn::Or(hn::Gt(kv, tv), eq), di, out + m));
  }
  for (; i < n; ++i) scalar(i);
  return m;
}

// One token of the gated delta rule on a head's state S [dk, dv] (row a: key element a; columns: value
// elements): S <- S · decay; u = beta · (v - Sᵀk); S <- S + k ⊗ u; o = Sᵀq. Columns are independent: each
// chunk of Lanes columns runs both passes over the rows (a ascending, one rounding per multiply-add), so a
// column's value does not depend on the chunk it falls in, nor on dv.
void GatedDeltaStep(float* S, int64_t dk, int64_t dv, const float* q, const float* k, const float* v, float decay,
                    float beta, float* o) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vdecay = hn::Set(d, decay), vbeta = hn::Set(d, beta);
  for (int64_t e = 0; e < dv; e += N) {
    const int64_t w = std::min(N, dv - e);
    auto load = [&](const float* p) { return w == N ? hn::LoadU(d, p) : LoadTail(d, p, w, 0.0f); };
    auto store = [&](VF x, float* p) {
      if (w == N)
        hn::StoreU(x, d, p);
      else
        StoreTail(d, x, w, p);
    };
    VF kv = hn::Zero(d);
    for (int64_t a = 0; a < dk; ++a) {
      float* row = S + a * dv + e;
      const VF sa = hn::Mul(load(row), vdecay);
      store(sa, row);
      kv = Fma(sa, hn::Set(d, k[a]), kv);
    }
    const VF u = hn::Mul(hn::Sub(load(v + e), kv), vbeta);
    VF out = hn::Zero(d);
    for (int64_t a = 0; a < dk; ++a) {
      float* row = S + a * dv + e;
      const VF sa = Fma(hn::Set(d, k[a]), u, load(row));
      store(sa, row);
      out = Fma(sa, hn::Set(d, q[a]), out);
    }
    store(out, o + e);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace nextn::nn_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace nextn::nn_kernels {

HWY_EXPORT(IndexerScores);
HWY_EXPORT(SoftmaxWithSink);
HWY_EXPORT(ExpScaledSum);
HWY_EXPORT(MaxValue);
HWY_EXPORT(SumAsDouble);
HWY_EXPORT(WeightedRowSum);
HWY_EXPORT(GatheredDots);
HWY_EXPORT(Swiglu);
HWY_EXPORT(MulSigmoid);
HWY_EXPORT(GatedDeltaStep);
HWY_EXPORT(TopkAscending);

// NEXTN_CPU_TARGET is applied before main (also when these kernels are linked without the matmul ones).
[[maybe_unused]] const bool kCpuTargetApplied = (cpu_target::apply_env(), true);

}  // namespace nextn::nn_kernels

namespace nextn::ops {

void indexer_scores(const float* q, const float* w, int64_t heads, int64_t dim, const float* keys, int64_t n,
                    float* out) {
  using namespace nn_kernels;
  if (n > 0 && heads > 0) HWY_DYNAMIC_DISPATCH(IndexerScores)(q, w, heads, dim, keys, n, out);
}
void softmax_with_sink(float* x, int64_t n, float scale, float sink) {
  using namespace nn_kernels;
  HWY_DYNAMIC_DISPATCH(SoftmaxWithSink)(x, n, scale, sink);
}
double exp_scaled_sum(const float* x, int64_t n, float scale, float shift, float* out) {
  using namespace nn_kernels;
  return n > 0 ? HWY_DYNAMIC_DISPATCH(ExpScaledSum)(x, n, scale, shift, out) : 0.0;
}
double sum_as_double(const float* x, int64_t n) {
  using namespace nn_kernels;
  return n > 0 ? HWY_DYNAMIC_DISPATCH(SumAsDouble)(x, n) : 0.0;
}
float max_value(const float* x, int64_t n) {
  using namespace nn_kernels;
  return n > 0 ? HWY_DYNAMIC_DISPATCH(MaxValue)(x, n) : -std::numeric_limits<float>::infinity();
}
void weighted_row_sum(const float* p, const float* rows, int64_t n, int64_t dim, int64_t stride, float* out,
                      const int32_t* idx) {
  using namespace nn_kernels;
  HWY_DYNAMIC_DISPATCH(WeightedRowSum)(p, rows, idx, n, dim, stride, out);
}
void gathered_dots(const float* q, int64_t heads, int64_t q_stride, const float* rows, int64_t row_stride,
                   const int32_t* idx, int64_t n, int64_t dim, float* out, int64_t out_stride) {
  using namespace nn_kernels;
  if (heads > 0 && n > 0) HWY_DYNAMIC_DISPATCH(GatheredDots)(q, heads, q_stride, rows, row_stride, idx, n, dim, out, out_stride);
}
void swiglu(const float* gate, const float* up, int64_t n, float limit, float* out) {
  using namespace nn_kernels;
  HWY_DYNAMIC_DISPATCH(Swiglu)(gate, up, n, limit, out);
}
void mul_sigmoid(const float* x, const float* g, int64_t n, float* out) {
  using namespace nn_kernels;
  HWY_DYNAMIC_DISPATCH(MulSigmoid)(x, g, n, out);
}
void gated_delta_step(float* state, int64_t dk, int64_t dv, const float* q, const float* k, const float* v,
                      float decay, float beta, float* out) {
  using namespace nn_kernels;
  if (dk > 0 && dv > 0) HWY_DYNAMIC_DISPATCH(GatedDeltaStep)(state, dk, dv, q, k, v, decay, beta, out);
}
int64_t topk_ascending(const float* x, int64_t n, int64_t k, int32_t* out, float* scratch) {
  using namespace nn_kernels;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
    return std::max<int64_t>(n, 0);
  }
  if (k <= 0) return 0;
  return HWY_DYNAMIC_DISPATCH(TopkAscending)(x, n, k, out, scratch);
}

}  // namespace nextn::ops
#endif  // HWY_ONCE
