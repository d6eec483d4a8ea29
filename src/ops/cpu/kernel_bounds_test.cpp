// Every kernel of ops (ops.h) with input, output and scratch buffers of exactly the size its contract
// states, on every target this CPU runs. Each buffer is its own heap block with canary zones right before
// and after it: under AddressSanitizer the zones are poisoned, so any read or write there is reported at
// once; otherwise they are compared byte by byte after the call. The canary bytes are 0xFF (NaN as a
// float), so a read past an input that reaches a result also shows as a non-finite output, and outputs
// start as NaN, so a slot the kernel leaves unwritten shows too. Sizes 1..65 cross every vector width
// (4, 8 and 16 floats) and every tail length.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "hwy/targets.h"
#include "ops/cpu/target_testing.h"
#include "ops/ops.h"

#if defined(__SANITIZE_ADDRESS__)
#define NEXTN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NEXTN_TEST_ASAN 1
#endif
#endif
#ifdef NEXTN_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace nextn {
namespace {

constexpr size_t kGuardBytes = 64;
constexpr unsigned char kCanary = 0xFF;

void poison(const unsigned char* p, size_t n) {
#ifdef NEXTN_TEST_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}
void unpoison(const unsigned char* p, size_t n) {
#ifdef NEXTN_TEST_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

// n elements of T, 64-byte aligned, in a heap block of their own between two canary zones.
template <class T>
class Guarded {
 public:
  explicit Guarded(size_t n) : n_(n), block_(static_cast<unsigned char*>(::operator new(total(), kAlign))) {
    std::memset(block_, kCanary, total());
    poison(block_, kGuardBytes);
    poison(end(), kGuardBytes);
  }
  Guarded(size_t n, const std::vector<T>& values) : Guarded(n) { std::copy_n(values.begin(), n, data()); }
  ~Guarded() {
    unpoison(block_, total());
    ::operator delete(block_, kAlign);
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;

  T* data() { return reinterpret_cast<T*>(block_ + kGuardBytes); }
  const T* data() const { return reinterpret_cast<const T*>(block_ + kGuardBytes); }
  T& operator[](size_t i) { return data()[i]; }
  size_t size() const { return n_; }

  // Whether both canary zones still hold only canary bytes.
  bool intact() const {
    unpoison(block_, kGuardBytes);
    unpoison(end(), kGuardBytes);
    bool ok = true;
    for (size_t i = 0; i < kGuardBytes; ++i) ok &= block_[i] == kCanary && end()[i] == kCanary;
    poison(block_, kGuardBytes);
    poison(end(), kGuardBytes);
    return ok;
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  size_t total() const { return kGuardBytes + n_ * sizeof(T) + kGuardBytes; }
  unsigned char* end() const { return block_ + kGuardBytes + n_ * sizeof(T); }
  size_t n_;
  unsigned char* block_;
};

#define ASSERT_INTACT(buf, what) ASSERT_TRUE((buf).intact()) << #buf << " overwritten around its ends: " << (what)

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element finite: nothing read from a canary reached it, and it was written.
template <class T>
void expect_finite(const Guarded<T>& out, const std::string& what) {
  for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out.data()[i])) << what << " element " << i;
}

std::string target_tag(int64_t target) { return std::string(hwy::TargetName(target)) + " "; }

constexpr int64_t kMaxSize = 65;

// ---- top-k ----------------------------------------------------------------------------------------------

// The k largest of x (ties: lower index first), ascending: the contract, by stable sort.
std::vector<int32_t> reference_topk(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(x.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

// Scores with many ties (few distinct values, -inf among them) or all distinct.
std::vector<float> topk_scores(int64_t n, bool ties, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x)
    v = ties ? (rng() % 9 == 0 ? -INFINITY : static_cast<float>(static_cast<int>(rng() % 5) - 2))
             : std::ldexp(static_cast<float>(rng() % 100000) - 50000.0f, -10);
  return x;
}

void check_topk(const std::vector<float>& scores, int64_t k, const std::string& what) {
  const int64_t n = static_cast<int64_t>(scores.size()), want_n = std::min(k, n);
  Guarded<float> x(static_cast<size_t>(n), scores), scratch(static_cast<size_t>(n));
  Guarded<int32_t> out(static_cast<size_t>(want_n));
  ASSERT_EQ(ops::topk_ascending(x.data(), n, k, out.data(), scratch.data()), want_n) << what;
  ASSERT_INTACT(x, what);
  ASSERT_INTACT(scratch, what);
  ASSERT_INTACT(out, what);
  const std::vector<int32_t> got(out.data(), out.data() + want_n);
  ASSERT_EQ(got, reference_topk(scores, k)) << what;
}

TEST(KernelBounds, TopkEveryKAtMostN) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (int64_t n = 1; n <= kMaxSize; ++n)
      for (bool ties : {false, true}) {
        const std::vector<float> scores = topk_scores(n, ties, static_cast<uint32_t>(n));
        for (int64_t k = 1; k <= n + 1; ++k) {
          check_topk(scores, k,
                     target_tag(target) + "n " + std::to_string(n) + " k " + std::to_string(k) + (ties ? " ties" : ""));
          if (HasFatalFailure()) return;
        }
      }
    for (int64_t n : {100, 127, 128, 129, 255, 300, 1000, 2049})
      for (bool ties : {false, true}) {
        const std::vector<float> scores = topk_scores(n, ties, static_cast<uint32_t>(n));
        for (int64_t k : {int64_t(1), int64_t(2), int64_t(7), int64_t(8), int64_t(9), int64_t(15), int64_t(16),
                          int64_t(17), int64_t(64), n / 2, n - 9, n - 1, n}) {
          check_topk(scores, k,
                     target_tag(target) + "n " + std::to_string(n) + " k " + std::to_string(k) + (ties ? " ties" : ""));
          if (HasFatalFailure()) return;
        }
      }
  }
}

// ---- per-row kernels (nn_hwy.cpp) -----------------------------------------------------------------------

// (a, b, c) triples in which each of the three sweeps 1..kMaxSize while the others vary.
struct Shape3 {
  int64_t a, b, c;
};
std::vector<Shape3> sweep3() {
  std::vector<Shape3> out;
  for (int64_t s = 1; s <= kMaxSize; ++s) {
    out.push_back({s, 1 + (s * 7) % kMaxSize, 1 + (s * 11) % kMaxSize});
    out.push_back({1 + (s * 5) % kMaxSize, s, 1 + (s * 3) % kMaxSize});
    out.push_back({1 + (s * 13) % kMaxSize, 1 + (s * 2) % kMaxSize, s});
  }
  return out;
}

TEST(KernelBounds, IndexerScores) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const auto [heads, dim, n] : sweep3()) {
      const std::string what = target_tag(target) + "heads " + std::to_string(heads) + " dim " + std::to_string(dim) +
                               " keys " + std::to_string(n);
      Guarded<float> q(heads * dim, randn(heads * dim, 1)), w(heads, randn(heads, 2)), keys(n * dim, randn(n * dim, 3));
      Guarded<float> out(n);
      ops::indexer_scores(q.data(), w.data(), heads, dim, keys.data(), n, out.data());
      ASSERT_INTACT(q, what);
      ASSERT_INTACT(w, what);
      ASSERT_INTACT(keys, what);
      ASSERT_INTACT(out, what);
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0;
          for (int64_t k = 0; k < dim; ++k) dot += double(q[h * dim + k]) * keys[j * dim + k];
          want += w[h] * std::max(dot, 0.0);
        }
        ASSERT_NEAR(out[j], want, 1e-3 * std::max(1.0, std::abs(want))) << what << " key " << j;
      }
    }
  }
}

TEST(KernelBounds, SoftmaxWithSink) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (int64_t n = 1; n <= kMaxSize; ++n) {
      const std::string what = target_tag(target) + "n " + std::to_string(n);
      Guarded<float> x(n, randn(n, 5));
      const std::vector<float> in(x.data(), x.data() + n);
      const float scale = 0.5f, sink = 0.25f;
      ops::softmax_with_sink(x.data(), n, scale, sink);
      ASSERT_INTACT(x, what);
      double m = sink;
      for (float v : in) m = std::max(m, double(v) * scale);
      double z = std::exp(sink - m);
      for (float v : in) z += std::exp(double(v) * scale - m);
      for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(x[j], std::exp(double(in[j]) * scale - m) / z, 1e-6) << what << " at " << j;
    }
  }
}

TEST(KernelBounds, WeightedRowSum) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const auto [dim, n, pad] : sweep3()) {
      for (bool indexed : {false, true}) {
        const int64_t stride = dim + pad % 4;  // padded rows too
        // Indexed: n rows picked from `total`, the last row among them (the buffer's end is reached).
        const int64_t total = indexed ? n + pad : n;
        std::vector<int32_t> pick(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) pick[j] = static_cast<int32_t>(indexed ? (j * 7 + total - 1) % total : j);
        const std::string what = target_tag(target) + "dim " + std::to_string(dim) + " rows " + std::to_string(n) +
                                 " stride " + std::to_string(stride) + (indexed ? " indexed" : "");
        const size_t rows_size = static_cast<size_t>((total - 1) * stride + dim);
        Guarded<float> p(n, randn(n, 6)), rows(rows_size, randn(rows_size, 7)), out(dim);
        Guarded<int32_t> idx(n, pick);
        ops::weighted_row_sum(p.data(), rows.data(), n, dim, stride, out.data(), indexed ? idx.data() : nullptr);
        ASSERT_INTACT(p, what);
        ASSERT_INTACT(rows, what);
        ASSERT_INTACT(idx, what);
        ASSERT_INTACT(out, what);
        for (int64_t i = 0; i < dim; ++i) {
          double want = 0;
          for (int64_t j = 0; j < n; ++j) want += double(p[j]) * rows[pick[j] * stride + i];
          ASSERT_NEAR(out[i], want, 1e-4 * std::max(1.0, std::abs(want))) << what << " at " << i;
        }
      }
    }
  }
}

TEST(KernelBounds, GatheredDots) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const auto [heads, dim, n] : sweep3()) {
      for (bool indexed : {false, true}) {
        const int64_t q_stride = dim + heads % 3, row_stride = dim + n % 3, out_stride = n + dim % 2;
        const int64_t total = indexed ? n + 3 : n;
        std::vector<int32_t> pick(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) pick[j] = static_cast<int32_t>(indexed ? (j * 5 + total - 1) % total : j);
        const std::string what = target_tag(target) + "heads " + std::to_string(heads) + " dim " + std::to_string(dim) +
                                 " rows " + std::to_string(n) + (indexed ? " indexed" : "");
        const size_t q_size = static_cast<size_t>((heads - 1) * q_stride + dim);
        const size_t rows_size = static_cast<size_t>((total - 1) * row_stride + dim);
        const size_t out_size = static_cast<size_t>((heads - 1) * out_stride + n);
        Guarded<float> q(q_size, randn(q_size, 8)), rows(rows_size, randn(rows_size, 9)), out(out_size);
        Guarded<int32_t> idx(n, pick);
        ops::gathered_dots(q.data(), heads, q_stride, rows.data(), row_stride, indexed ? idx.data() : nullptr, n, dim,
                           out.data(), out_stride);
        ASSERT_INTACT(q, what);
        ASSERT_INTACT(rows, what);
        ASSERT_INTACT(idx, what);
        ASSERT_INTACT(out, what);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (int64_t k = 0; k < dim; ++k) want += double(q[h * q_stride + k]) * rows[pick[j] * row_stride + k];
            ASSERT_NEAR(out[h * out_stride + j], want, 1e-4 * std::max(1.0, std::abs(want)))
                << what << " head " << h << " row " << j;
          }
      }
    }
  }
}

TEST(KernelBounds, Activations) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (int64_t n = 1; n <= kMaxSize; ++n) {
      const std::string what = target_tag(target) + "n " + std::to_string(n);
      Guarded<float> a(n, randn(n, 10)), b(n, randn(n, 11));
      for (float limit : {0.0f, 0.5f}) {
        Guarded<float> out(n);
        ops::swiglu(a.data(), b.data(), n, limit, out.data());
        ASSERT_INTACT(a, what);
        ASSERT_INTACT(b, what);
        ASSERT_INTACT(out, what + " swiglu");
        expect_finite(out, what + " swiglu");
      }
      Guarded<float> out(n);
      ops::mul_sigmoid(a.data(), b.data(), n, out.data());
      ASSERT_INTACT(a, what);
      ASSERT_INTACT(b, what);
      ASSERT_INTACT(out, what + " mul_sigmoid");
      expect_finite(out, what + " mul_sigmoid");
    }
  }
}

// ---- scalar row kernels (nn.cpp): no dispatch, one pass suffices ----------------------------------------

TEST(KernelBounds, NormsRopeAndDot) {
  for (int64_t d = 1; d <= kMaxSize; ++d) {
    const std::string what = "d " + std::to_string(d);
    const int64_t rows = 1 + d % 3, x_stride = d + d % 2, out_stride = d + 1;
    const size_t x_size = static_cast<size_t>((rows - 1) * x_stride + d);
    const size_t out_size = static_cast<size_t>((rows - 1) * out_stride + d);
    Guarded<float> x(x_size, randn(x_size, 12)), weight(d, randn(d, 13)), bias(d, randn(d, 14));
    {
      Guarded<float> out(out_size);
      ops::rms_norm(x.data(), rows, d, weight.data(), 1e-6f, out.data(), x_stride, out_stride);
      ASSERT_INTACT(x, what);
      ASSERT_INTACT(weight, what);
      ASSERT_INTACT(out, what + " rms_norm");
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < d; ++i) ASSERT_TRUE(std::isfinite(out[r * out_stride + i])) << what << " rms_norm";
    }
    ASSERT_TRUE(std::isfinite(ops::inv_rms(x.data(), d, 1e-6f))) << what;
    ASSERT_TRUE(std::isfinite(ops::dot(x.data(), weight.data(), d))) << what;
    ASSERT_INTACT(x, what);
    {
      Guarded<float> dense(rows * d, randn(rows * d, 15)), out(rows * d);
      ops::layer_norm(dense.data(), rows, d, weight.data(), bias.data(), 1e-6f, out.data());
      ASSERT_INTACT(dense, what);
      ASSERT_INTACT(bias, what);
      ASSERT_INTACT(out, what + " layer_norm");
      expect_finite(out, what + " layer_norm");
    }
    {
      const int64_t half = d;  // rope over 2d elements, d table entries
      std::vector<float> freq(static_cast<size_t>(half));
      for (int64_t i = 0; i < half; ++i) freq[i] = std::pow(10000.0f, -static_cast<float>(i) / static_cast<float>(half));
      Guarded<float> inv_freq(half, freq), cos(half), sin(half), v(2 * half, randn(2 * half, 16));
      ops::rope_tables(inv_freq.data(), half, 17, 1.0f, cos.data(), sin.data());
      ops::rope_rotate_half(v.data(), 2 * half, cos.data(), sin.data());
      ASSERT_INTACT(inv_freq, what);
      ASSERT_INTACT(cos, what + " rope_tables");
      ASSERT_INTACT(sin, what + " rope_tables");
      ASSERT_INTACT(v, what + " rope_rotate_half");
      expect_finite(cos, what);
      expect_finite(sin, what);
      expect_finite(v, what);
    }
  }
}

// ---- matmul kernels -------------------------------------------------------------------------------------

// One weight layout: dtype, and for FP8 its scales' dtype and blocks.
struct Layout {
  const char* name;
  DType dtype;
  DType scale_dtype = DType::F32;
  int64_t block_out = 128, block_in = 128;
  int64_t scale_row0 = 0;
};
const Layout kLayouts[] = {
    {"f32", DType::F32},
    {"bf16", DType::BF16},
    {"f16", DType::F16},
    {"fp8", DType::F8_E4M3, DType::F32, 128, 128},
    {"fp8_block16_e8m0", DType::F8_E4M3, DType::F8_E8M0, 2, 16, 1},  // a slice starting inside a scale block
    {"fp8_bf16_table", DType::F8_E4M3, DType::BF16, 3, 8},           // block_in % 16 != 0: scalar table
};

// A random finite element of dtype t, as its stored bytes.
void random_element(DType t, std::mt19937& rng, unsigned char* dst) {
  switch (t) {
    case DType::F32: {
      const float f = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -10);
      std::memcpy(dst, &f, 4);
      return;
    }
    case DType::BF16: {
      const uint16_t b = f32_to_bf16(std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -10));
      std::memcpy(dst, &b, 2);
      return;
    }
    case DType::F16: {  // sign, exponent 10..17 (values 2^-5 .. 2^2), any mantissa
      const uint16_t h = static_cast<uint16_t>(((rng() & 1u) << 15) | ((10 + rng() % 8) << 10) | (rng() & 0x3FFu));
      std::memcpy(dst, &h, 2);
      return;
    }
    default: {  // e4m3: any code but the NaNs 0x7f, 0xff
      uint8_t v;
      do v = static_cast<uint8_t>(rng());
      while ((v & 0x7F) == 0x7F);
      *dst = v;
    }
  }
}

// A weight of `out` rows of `in` columns, `stride` elements apart, its data, scales and bias each in an
// exact-size guarded block.
struct GuardedWeight {
  Linear lin;
  Guarded<unsigned char> data, scale;
  Guarded<float> bias;
  std::vector<double> deq;  // [out, in] dequantized values (for references)

  GuardedWeight(const Layout& l, int64_t out, int64_t in, int64_t stride, bool with_bias, uint32_t seed)
      : data(static_cast<size_t>((out - 1) * stride + in) * dtype_size(l.dtype)),
        scale(l.dtype == DType::F8_E4M3 ? scale_entries(l, out, in) * dtype_size(l.scale_dtype) : 0),
        bias(with_bias ? out : 0, randn(with_bias ? out : 0, seed + 1)) {
    std::mt19937 rng(seed);
    const size_t es = dtype_size(l.dtype);
    for (int64_t r = 0; r < out; ++r)
      for (int64_t k = 0; k < in; ++k) random_element(l.dtype, rng, data.data() + (r * stride + k) * es);
    lin.dtype = l.dtype;
    lin.out = out;
    lin.in = in;
    lin.row_stride = stride;
    lin.data = data.data();
    lin.bias = with_bias ? bias.data() : nullptr;
    if (l.dtype == DType::F8_E4M3) {
      lin.scale = scale.data();
      lin.scale_dtype = l.scale_dtype;
      lin.block_out = l.block_out;
      lin.block_in = l.block_in;
      lin.scale_row0 = l.scale_row0;
      lin.scale_cols = (in + l.block_in - 1) / l.block_in;
      for (size_t i = 0; i < scale.size() / dtype_size(l.scale_dtype); ++i) {
        const float s = std::ldexp(1.0f + static_cast<float>(rng() % 4) * 0.25f, -static_cast<int>(rng() % 6) - 2);
        if (l.scale_dtype == DType::F32) {
          std::memcpy(scale.data() + 4 * i, &s, 4);
        } else if (l.scale_dtype == DType::BF16) {
          const uint16_t b = f32_to_bf16(s);
          std::memcpy(scale.data() + 2 * i, &b, 2);
        } else {
          scale[i] = static_cast<uint8_t>(127 - rng() % 8);  // 2^0 .. 2^-7
        }
      }
    }
    deq.resize(static_cast<size_t>(out * in));
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = 0; r < out; ++r) {
      ops::dequant_row(lin, r, row.data());
      std::copy(row.begin(), row.end(), deq.begin() + r * in);
    }
  }

  // Scale entries the contract asks for: ceil((scale_row0 + out) / block_out) block rows of scale_cols.
  static size_t scale_entries(const Layout& l, int64_t out, int64_t in) {
    return static_cast<size_t>((l.scale_row0 + out + l.block_out - 1) / l.block_out * ((in + l.block_in - 1) / l.block_in));
  }
  bool intact() const { return data.intact() && scale.intact() && bias.intact(); }
};

// y[M, N] (row stride ys) against the double reference of x[M, K] (row stride xs) · deqᵀ + bias.
void expect_matmul(const Guarded<float>& y, int64_t ys, const Guarded<float>& x, int64_t xs, int64_t M,
                   const GuardedWeight& w, const std::string& what) {
  const int64_t N = w.lin.out, K = w.lin.in;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = w.lin.bias ? w.lin.bias[n] : 0.0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += double(x.data()[m * xs + k]) * w.deq[n * K + k];
        mag += std::abs(double(x.data()[m * xs + k]) * w.deq[n * K + k]);
      }
      ASSERT_NEAR(y.data()[m * ys + n], want, 1e-5 * std::max(1.0, mag)) << what << " y[" << m << ", " << n << "]";
    }
}

constexpr int64_t kMatmulMs[] = {1, 2, 3, 5, 8, 9, 16, 17, 70};  // fused tiles (<= 16 rows), panels beyond

void check_matmul(const Layout& l, int64_t M, int64_t N, int64_t K, uint32_t seed, int64_t target) {
  const bool padded = (N + K + M) % 2 == 1;  // strided rows every other shape
  const int64_t stride = padded ? K + 3 : K, xs = padded ? K + 5 : K, ys = padded ? N + 2 : N;
  const std::string what = target_tag(target) + l.name + " M " + std::to_string(M) + " N " + std::to_string(N) +
                           " K " + std::to_string(K) + (padded ? " strided" : "");
  const GuardedWeight w(l, N, K, stride, seed % 2 == 0, seed);
  const size_t x_size = static_cast<size_t>((M - 1) * xs + K), y_size = static_cast<size_t>((M - 1) * ys + N);
  Guarded<float> x(x_size, randn(x_size, seed + 2)), y(y_size);
  ops::matmul(nullptr, x.data(), M, w.lin, y.data(), xs, ys);
  ASSERT_TRUE(w.intact()) << what;
  ASSERT_INTACT(x, what);
  ASSERT_INTACT(y, what);
  expect_matmul(y, ys, x, xs, M, w, what);
}

TEST(KernelBounds, MatmulEveryK) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Layout& l : kLayouts)
      for (int64_t K = 1; K <= kMaxSize; ++K)
        for (int64_t M : kMatmulMs) {
          const int64_t N = 1 + (K * 7 + M) % 37;  // every weight-row group remainder
          check_matmul(l, M, N, K, static_cast<uint32_t>(K * 100 + M), target);
          if (HasFatalFailure()) return;
        }
  }
}

// Long rows (panel k chunks, the FP8 streamed-row path of 1 MB+ matrices) with tails.
TEST(KernelBounds, MatmulLongRows) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Layout& l : kLayouts) {
      for (const auto [M, N, K] : {Shape3{1, 1029, 1029}, Shape3{1, 1040, 1024}, Shape3{17, 5, 1100}, Shape3{3, 9, 2051}}) {
        check_matmul(l, M, N, K, static_cast<uint32_t>(M + N + K), target);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(KernelBounds, MatmulMany) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (int64_t K = 1; K <= kMaxSize; ++K)
      for (int64_t M : {1, 4, 17}) {
        const std::string what = target_tag(target) + "M " + std::to_string(M) + " K " + std::to_string(K);
        const GuardedWeight a(kLayouts[1], 1 + K % 5, K, K, true, 31), b(kLayouts[0], 1 + K % 9, K, K, false, 32);
        Guarded<float> x(M * K, randn(M * K, 33)), ya(M * a.lin.out), yb(M * b.lin.out);
        const ops::MatmulOut outs[] = {{&a.lin, ya.data(), -1}, {&b.lin, yb.data(), -1}};
        ops::matmul_many(nullptr, x.data(), M, outs, 2);
        ASSERT_TRUE(a.intact() && b.intact()) << what;
        ASSERT_INTACT(x, what);
        ASSERT_INTACT(ya, what);
        ASSERT_INTACT(yb, what);
        expect_matmul(ya, a.lin.out, x, K, M, a, what + " a");
        expect_matmul(yb, b.lin.out, x, K, M, b, what + " b");
      }
  }
}

TEST(KernelBounds, MatmulTransposed) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Layout& l : kLayouts)
      for (int64_t K = 1; K <= kMaxSize; ++K)
        for (int64_t M : {1, 2, 6, 7}) {
          const int64_t N = 1 + (K * 5 + M) % 23, xs = N + M % 2, ys = K + M % 3;
          const std::string what = target_tag(target) + l.name + " M " + std::to_string(M) + " N " + std::to_string(N) +
                                   " K " + std::to_string(K);
          const GuardedWeight w(l, N, K, K, false, static_cast<uint32_t>(K + M));
          const size_t x_size = static_cast<size_t>((M - 1) * xs + N), y_size = static_cast<size_t>((M - 1) * ys + K);
          Guarded<float> x(x_size, randn(x_size, 34)), y(y_size, randn(y_size, 35));
          const std::vector<float> y0(y.data(), y.data() + y_size);
          if (M == 1)
            ops::matmul_transposed(x.data(), w.lin, y.data());
          else
            ops::matmul_transposed(x.data(), M, xs, w.lin, y.data(), ys);
          ASSERT_TRUE(w.intact()) << what;
          ASSERT_INTACT(x, what);
          ASSERT_INTACT(y, what);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t k = 0; k < K; ++k) {
              double want = y0[m * ys + k], mag = std::abs(want);
              for (int64_t r = 0; r < N; ++r) {
                want += double(x[m * xs + r]) * w.deq[r * K + k];
                mag += std::abs(double(x[m * xs + r]) * w.deq[r * K + k]);
              }
              ASSERT_NEAR(y[m * ys + k], want, 1e-5 * std::max(1.0, mag)) << what << " y[" << m << ", " << k << "]";
            }
          if (HasFatalFailure()) return;
        }
  }
}

TEST(KernelBounds, DequantRow) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Layout& l : kLayouts)
      for (int64_t K = 1; K <= kMaxSize; ++K) {
        const int64_t N = 1 + K % 7;
        const GuardedWeight w(l, N, K, K + K % 2, false, static_cast<uint32_t>(K));
        for (int64_t r : {int64_t(0), N - 1}) {
          const std::string what = target_tag(target) + l.name + " K " + std::to_string(K) + " row " + std::to_string(r);
          Guarded<float> out(K);
          ops::dequant_row(w.lin, r, out.data());
          ASSERT_TRUE(w.intact()) << what;
          ASSERT_INTACT(out, what);
          for (int64_t k = 0; k < K; ++k) ASSERT_EQ(out[k], static_cast<float>(w.deq[r * K + k])) << what << " at " << k;
        }
      }
  }
}

// The guard itself: a write one element past the end, or one before the start, is seen (without ASan;
// with it, such a write would be reported as an error instead).
#ifndef NEXTN_TEST_ASAN
TEST(KernelBounds, GuardSeesWritesJustOutside) {
  Guarded<float> after(5), before(5);
  ASSERT_TRUE(after.intact());
  after.data()[5] = 1.0f;
  EXPECT_FALSE(after.intact());
  before.data()[-1] = 1.0f;
  EXPECT_FALSE(before.intact());
  // The canary bytes back: intact again.
  std::memset(after.data() + 5, kCanary, sizeof(float));
  std::memset(before.data() - 1, kCanary, sizeof(float));
  EXPECT_TRUE(after.intact() && before.intact());
}
#endif

}  // namespace
}  // namespace nextn
