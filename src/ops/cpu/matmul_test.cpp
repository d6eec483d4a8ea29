#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "hwy/targets.h"
#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/target_testing.h"
#include "ops/cpu_target.h"
#include "ops/ops.h"

namespace nextn {
namespace {

// ---- independent scalar decoders (do not reuse the library's conversions) ------------------------------

double ref_bf16(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double ref_f16(uint16_t v) {
  const int sign = (v >> 15) & 1, exp = (v >> 10) & 0x1f, mant = v & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -mag : mag;
}

double ref_fp8(uint8_t v) {
  const int sign = (v >> 7) & 1, exp = (v >> 3) & 0xf, mant = v & 0x7;
  const double mag = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
  return sign ? -mag : mag;
}

double ref_e8m0(uint8_t v) { return std::ldexp(1.0, static_cast<int>(v) - 127); }

// A test weight: owns its bytes, plus the dequantized values in double.
struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<uint8_t> u8;
  std::vector<float> scale_f32;
  std::vector<uint16_t> scale_u16;
  std::vector<uint8_t> scale_u8;
  std::vector<float> bias;
  std::vector<double> deq;  // [out][in]
  Linear lin;
};

// dtype: weight dtype; scale_dtype only for F8_E4M3.
std::unique_ptr<TestWeight> make_weight(DType dtype, int64_t out, int64_t in, uint32_t seed,
                                        bool with_bias = false, DType scale_dtype = DType::F32,
                                        int64_t block = 128) {
  auto t = std::make_unique<TestWeight>();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const size_t n = static_cast<size_t>(out * in);
  t->deq.resize(n);
  Linear& w = t->lin;
  w.dtype = dtype;
  w.out = out;
  w.in = in;
  w.row_stride = in;
  switch (dtype) {
    case DType::F32:
      t->f32.resize(n);
      for (size_t i = 0; i < n; ++i) t->deq[i] = t->f32[i] = uni(rng);
      w.data = t->f32.data();
      break;
    case DType::BF16:
      t->u16.resize(n);
      for (size_t i = 0; i < n; ++i) {
        t->u16[i] = f32_to_bf16(uni(rng));
        t->deq[i] = ref_bf16(t->u16[i]);
      }
      w.data = t->u16.data();
      break;
    case DType::F16:
      t->u16.resize(n);
      for (size_t i = 0; i < n; ++i) {
        // Random sign and mantissa, exponents 2^-6..2^1, plus some subnormals.
        const uint32_t r = rng();
        const uint16_t exp = (r % 16 == 0) ? 0 : static_cast<uint16_t>(9 + (r >> 4) % 8);
        t->u16[i] = static_cast<uint16_t>(((r >> 8) & 1) << 15 | exp << 10 | ((r >> 12) & 0x3ff));
        t->deq[i] = ref_f16(t->u16[i]);
      }
      w.data = t->u16.data();
      break;
    case DType::F8_E4M3: {
      t->u8.resize(n);
      for (size_t i = 0; i < n; ++i) {
        uint8_t v;
        do v = static_cast<uint8_t>(rng());
        while ((v & 0x7f) == 0x7f);  // no NaN
        t->u8[i] = v;
      }
      w.data = t->u8.data();
      w.block_out = w.block_in = block;
      const int64_t srows = (out + block - 1) / block, scols = (in + block - 1) / block;
      w.scale_cols = scols;
      w.scale_dtype = scale_dtype;
      std::vector<double> s(static_cast<size_t>(srows * scols));
      std::uniform_real_distribution<float> su(0.001f, 0.01f);
      for (size_t i = 0; i < s.size(); ++i) {
        if (scale_dtype == DType::F32) {
          t->scale_f32.push_back(su(rng));
          s[i] = t->scale_f32.back();
        } else if (scale_dtype == DType::BF16) {
          t->scale_u16.push_back(f32_to_bf16(su(rng)));
          s[i] = ref_bf16(t->scale_u16.back());
        } else {
          t->scale_u8.push_back(static_cast<uint8_t>(117 + rng() % 8));
          s[i] = ref_e8m0(t->scale_u8.back());
        }
      }
      w.scale = scale_dtype == DType::F32    ? static_cast<const void*>(t->scale_f32.data())
                : scale_dtype == DType::BF16 ? static_cast<const void*>(t->scale_u16.data())
                                             : static_cast<const void*>(t->scale_u8.data());
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c)
          t->deq[r * in + c] = ref_fp8(t->u8[r * in + c]) * s[(r / block) * scols + c / block];
      break;
    }
    default:
      ADD_FAILURE() << "unsupported test dtype";
  }
  if (with_bias) {
    t->bias.resize(static_cast<size_t>(out));
    for (float& b : t->bias) b = uni(rng);
    w.bias = t->bias.data();
  }
  return t;
}

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = uni(rng);
  return v;
}

// y = bias + x · deqᵀ in double.
std::vector<double> ref_matmul(const std::vector<float>& x, int64_t M, const TestWeight& t) {
  const int64_t N = t.lin.out, K = t.lin.in;
  std::vector<double> y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = t.bias.empty() ? 0.0 : t.bias[n];
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[m * K + k]) * t.deq[n * K + k];
      y[m * N + n] = acc;
    }
  return y;
}

// Tolerance: max |got - ref| <= 1e-5 * max |ref| (fp32 accumulation over a few hundred to a few thousand
// terms of magnitude <= 1 stays far below this; a wrong weight, scale or index is far above it).
constexpr double kRelTol = 1e-5;

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  EXPECT_GT(max_ref, 0.0) << what;
  EXPECT_LE(max_err, kRelTol * max_ref) << what << ": max_err " << max_err << " max_ref " << max_ref;
}

struct Case {
  const char* name;
  DType dtype;
  DType scale_dtype;
  int64_t out, in, block;
};

const Case kCases[] = {
    {"f32", DType::F32, DType::F32, 72, 300, 128},
    {"bf16", DType::BF16, DType::F32, 72, 300, 128},
    {"f16", DType::F16, DType::F32, 72, 300, 128},
    {"fp8_f32_scale", DType::F8_E4M3, DType::F32, 256, 384, 128},
    {"fp8_e8m0_scale", DType::F8_E4M3, DType::F8_E8M0, 256, 384, 128},
    {"fp8_bf16_scale", DType::F8_E4M3, DType::BF16, 256, 256, 128},
    {"fp8_partial_blocks", DType::F8_E4M3, DType::F32, 200, 300, 128},
    {"fp8_e8m0_partial_blocks", DType::F8_E4M3, DType::F8_E8M0, 200, 300, 128},
    {"bf16_long_k", DType::BF16, DType::F32, 40, 1100, 128},  // several k passes + a 12-element tail
};

TEST(Matmul, MatchesDoubleReference) {
  ThreadPool pool(3);
  for (const Case& c : kCases) {
    for (bool with_bias : {false, true}) {
      auto t = make_weight(c.dtype, c.out, c.in, 1234, with_bias, c.scale_dtype, c.block);
      for (int64_t M : {1, 5, 16}) {
        const auto x = random_vec(static_cast<size_t>(M * c.in), 99);
        std::vector<float> y(static_cast<size_t>(M * c.out), -7.0f);
        ops::matmul(&pool, x.data(), M, t->lin, y.data());
        expect_close(y, ref_matmul(x, M, *t),
                     std::string(c.name) + (with_bias ? " +bias" : "") + " M=" + std::to_string(M));
      }
    }
  }
}

TEST(Matmul, DequantRowMatchesReference) {
  for (const Case& c : kCases) {
    auto t = make_weight(c.dtype, c.out, c.in, 77, false, c.scale_dtype, c.block);
    std::vector<float> row(static_cast<size_t>(c.in));
    for (int64_t r : {int64_t{0}, c.out / 2, c.out - 1}) {
      ops::dequant_row(t->lin, r, row.data());
      for (int64_t k = 0; k < c.in; ++k) {
        // fp8 value * scale is exact in double; the kernel rounds it once to fp32, as does this cast.
        ASSERT_EQ(row[k], static_cast<float>(t->deq[r * c.in + k])) << c.name << " r=" << r << " k=" << k;
      }
    }
  }
}

// Batch invariance: y[m][n] must not depend on M, on the other rows of x, or on the thread count.
TEST(Matmul, BatchAndThreadInvariant) {
  ThreadPool pool1(1), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool1, &pool3};
  const int64_t Ms[] = {1, 7, 16, 50};
  for (const Case& c : kCases) {
    auto t = make_weight(c.dtype, c.out, c.in, 555, true, c.scale_dtype, c.block);
    const int64_t N = c.out, K = c.in;
    const auto x = random_vec(static_cast<size_t>(50 * K), 4242);
    // Every row of every call compared against the M = 1, serial result for that row.
    std::vector<float> single(static_cast<size_t>(50 * N));
    for (int64_t m = 0; m < 50; ++m) ops::matmul(nullptr, x.data() + m * K, 1, t->lin, single.data() + m * N);
    for (ThreadPool* p : pools) {
      for (int64_t M : Ms) {
        std::vector<float> y(static_cast<size_t>(M * N));
        ops::matmul(p, x.data(), M, t->lin, y.data());
        for (int64_t m = 0; m < M; ++m)
          ASSERT_EQ(0, std::memcmp(y.data() + m * N, single.data() + m * N, static_cast<size_t>(N) * 4))
              << c.name << " pool=" << (p ? p->size() : 0) << " M=" << M << " row " << m;
      }
    }
  }
}

TEST(Matmul, RowZeroBitIdenticalAcrossBatchSizes) {
  ThreadPool pool1(1), pool3(3);
  auto t = make_weight(DType::F8_E4M3, 200, 300, 9, true, DType::F8_E8M0, 128);
  const auto x = random_vec(16 * 300, 10);
  std::vector<float> ref(200), y7(7 * 200), y16(16 * 200);
  ops::matmul(nullptr, x.data(), 1, t->lin, ref.data());
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool1, &pool3}) {
    std::vector<float> y1(200);
    ops::matmul(p, x.data(), 1, t->lin, y1.data());
    ops::matmul(p, x.data(), 7, t->lin, y7.data());
    ops::matmul(p, x.data(), 16, t->lin, y16.data());
    EXPECT_EQ(0, std::memcmp(y1.data(), ref.data(), 200 * 4));
    EXPECT_EQ(0, std::memcmp(y7.data(), ref.data(), 200 * 4));
    EXPECT_EQ(0, std::memcmp(y16.data(), ref.data(), 200 * 4));
  }
}

// Several weights over one x in one pass: every output bit-identical to its own ops::matmul.
TEST(Matmul, ManyEqualsSeparateCalls) {
  ThreadPool pool3(3);
  auto a = make_weight(DType::F8_E4M3, 200, 300, 31, true, DType::F32, 128);
  auto b = make_weight(DType::BF16, 40, 300, 32);
  auto c = make_weight(DType::F8_E4M3, 130, 300, 33, false, DType::F8_E8M0, 128);
  const TestWeight* ws[] = {a.get(), b.get(), c.get()};
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool3}) {
    for (int64_t M : {1, 5, 33}) {
      const auto x = random_vec(static_cast<size_t>(M * 300), 34);
      std::vector<float> sep[3], many[3];
      ops::MatmulOut outs[3];
      for (int i = 0; i < 3; ++i) {
        const int64_t N = ws[i]->lin.out;
        sep[i].assign(static_cast<size_t>(M * N), 0.0f);
        many[i].assign(static_cast<size_t>(M * (N + 3)), -1.0f);
        ops::matmul(nullptr, x.data(), M, ws[i]->lin, sep[i].data());
        outs[i] = {&ws[i]->lin, many[i].data(), N + 3};
      }
      ops::matmul_many(p, x.data(), M, outs, 3);
      for (int i = 0; i < 3; ++i) {
        const int64_t N = ws[i]->lin.out;
        for (int64_t m = 0; m < M; ++m) {
          ASSERT_EQ(0, std::memcmp(many[i].data() + m * (N + 3), sep[i].data() + m * N, static_cast<size_t>(N) * 4))
              << "output " << i << " M=" << M << " row " << m;
          for (int64_t n = N; n < N + 3; ++n) ASSERT_EQ(many[i][m * (N + 3) + n], -1.0f) << "wrote past the row";
        }
      }
    }
  }
  auto narrow = make_weight(DType::F32, 8, 100, 35);
  ops::MatmulOut bad[2] = {{&a->lin, nullptr}, {&narrow->lin, nullptr}};
  std::vector<float> x(300);
  EXPECT_THROW(ops::matmul_many(nullptr, x.data(), 1, bad, 2), Error);
}

TEST(Matmul, Strides) {
  ThreadPool pool(3);
  auto t = make_weight(DType::BF16, 64, 100, 3, true);
  const int64_t M = 5, xs = 107, ys = 70;
  const auto packed = random_vec(static_cast<size_t>(M * 100), 11);
  std::vector<float> xpad(static_cast<size_t>(M * xs), 1e30f);
  for (int64_t m = 0; m < M; ++m) std::copy_n(packed.data() + m * 100, 100, xpad.data() + m * xs);
  std::vector<float> y(static_cast<size_t>(M * 64)), ypad(static_cast<size_t>(M * ys), 5.0f);
  ops::matmul(&pool, packed.data(), M, t->lin, y.data());
  ops::matmul(&pool, xpad.data(), M, t->lin, ypad.data(), xs, ys);
  for (int64_t m = 0; m < M; ++m) {
    EXPECT_EQ(0, std::memcmp(ypad.data() + m * ys, y.data() + m * 64, 64 * 4)) << m;
    for (int64_t n = 64; n < ys; ++n) EXPECT_EQ(ypad[m * ys + n], 5.0f) << "wrote past the row";
  }
}

TEST(Matmul, WeightRowStride) {
  // A [out, in] view inside a wider [out, 130] f32 matrix.
  auto t = make_weight(DType::F32, 32, 130, 21);
  Linear narrow = t->lin;
  narrow.in = 100;
  const auto x = random_vec(3 * 100, 22);
  std::vector<float> y(3 * 32);
  ops::matmul(nullptr, x.data(), 3, narrow, y.data());
  std::vector<double> ref(3 * 32, 0.0);
  for (int m = 0; m < 3; ++m)
    for (int n = 0; n < 32; ++n)
      for (int k = 0; k < 100; ++k)
        ref[m * 32 + n] += static_cast<double>(x[m * 100 + k]) * t->deq[n * 130 + k];
  expect_close(y, ref, "row_stride");
}

TEST(Linear, RowsSliceMatchesFullMatmul) {
  struct SliceCase {
    DType dtype, scale_dtype;
    int64_t r0, n;
  };
  for (const SliceCase& s :
       {SliceCase{DType::BF16, DType::F32, 37, 50}, SliceCase{DType::F32, DType::F32, 5, 3},
        SliceCase{DType::F8_E4M3, DType::F32, 128, 72}, SliceCase{DType::F8_E4M3, DType::F8_E8M0, 0, 130},
        // slices starting inside a scale block (fused gate/up with I % 128 != 0)
        SliceCase{DType::F8_E4M3, DType::F32, 96, 96}, SliceCase{DType::F8_E4M3, DType::F8_E8M0, 64, 10}}) {
    auto t = make_weight(s.dtype, 200, 300, 31, true, s.scale_dtype, 128);
    const auto x = random_vec(4 * 300, 32);
    std::vector<float> full(4 * 200), part(static_cast<size_t>(4 * s.n));
    ops::matmul(nullptr, x.data(), 4, t->lin, full.data());
    const Linear sl = t->lin.rows(s.r0, s.n);
    EXPECT_EQ(sl.out, s.n);
    EXPECT_EQ(sl.in, 300);
    ops::matmul(nullptr, x.data(), 4, sl, part.data());
    if (s.r0 >= 64) {  // a slice of a slice lands on the same rows
      const Linear sl2 = t->lin.rows(s.r0 - 64, s.n + 64).rows(64, s.n);
      std::vector<float> part2(static_cast<size_t>(4 * s.n));
      ops::matmul(nullptr, x.data(), 4, sl2, part2.data());
      EXPECT_EQ(0, std::memcmp(part2.data(), part.data(), part.size() * 4));
    }
    for (int64_t m = 0; m < 4; ++m)
      EXPECT_EQ(
          0, std::memcmp(part.data() + m * s.n, full.data() + m * 200 + s.r0, static_cast<size_t>(s.n) * 4));
  }
  auto t = make_weight(DType::F8_E4M3, 200, 300, 31);
  EXPECT_THROW(t->lin.rows(128, 100), Error);  // past the end
}

TEST(Linear, WeightBytes) {
  auto a = make_weight(DType::BF16, 10, 20, 1);
  EXPECT_EQ(a->lin.weight_bytes(), 10u * 20u * 2u);
  auto b = make_weight(DType::F32, 10, 20, 1, true);
  EXPECT_EQ(b->lin.weight_bytes(), 10u * 20u * 4u + 10u * 4u);
  auto c = make_weight(DType::F8_E4M3, 200, 300, 1, false, DType::F32, 128);
  EXPECT_EQ(c->lin.weight_bytes(), 200u * 300u + 2u * 3u * 4u);
  auto d = make_weight(DType::F8_E4M3, 200, 300, 1, false, DType::F8_E8M0, 128);
  EXPECT_EQ(d->lin.weight_bytes(), 200u * 300u + 2u * 3u);
}

TEST(Matmul, MatmulTransposedMatchesReference) {
  for (const Case& c : kCases) {
    auto t = make_weight(c.dtype, c.out, c.in, 808, false, c.scale_dtype, c.block);
    const auto x = random_vec(static_cast<size_t>(c.out), 809);
    auto y = random_vec(static_cast<size_t>(c.in), 810);
    std::vector<double> ref(y.begin(), y.end());
    for (int64_t r = 0; r < c.out; ++r)
      for (int64_t k = 0; k < c.in; ++k) ref[k] += static_cast<double>(x[r]) * t->deq[r * c.in + k];
    ops::matmul_transposed(x.data(), t->lin, y.data());
    expect_close(y, ref, std::string("transposed ") + c.name);
  }
}

TEST(Matmul, UnsupportedDtypeThrows) {
  std::vector<int32_t> data(16);
  Linear w;
  w.dtype = DType::I32;
  w.out = 4;
  w.in = 4;
  w.data = data.data();
  std::vector<float> x(4), y(4);
  EXPECT_THROW(ops::matmul(nullptr, x.data(), 1, w, y.data()), Error);
  w.dtype = DType::F8_E4M3;  // FP8 without scales
  EXPECT_THROW(ops::matmul(nullptr, x.data(), 1, w, y.data()), Error);
}

// ---- every SIMD target (test-backend-ops style) -----------------------------------------------------------
//
// The kernels are compiled for several Highway targets (AVX3 = AVX-512, AVX2, scalar) and dispatched at run
// time. Each target supported by this CPU is forced in turn; for each, every weight dtype and shape is
// compared against the double-precision reference, and every row must be bit-identical whatever the number
// of rows in the call and the thread count (targets differ from each other, never from themselves).

// K = 300 and 1100 are not multiples of any vector width (16, 8 lanes); 200 rows / 300 columns leave
// partial FP8 scale blocks on both axes; block 100 is not a multiple of 16 (the scalar-table FP8 route);
// 600 x 1100 is large enough to be split across threads even for one row. FP8 of 1 MB and more with rows of
// at most 2048 takes, for 1 or 2 x rows, the streamed route (rows read as sequential streams, Fp8StreamedRows):
// 1000 x 1100 and 520 x 2048, whose thread chunks start inside scale blocks and leave remainder rows.
const Case kKernelCases[] = {
    {"f32", DType::F32, DType::F32, 72, 300, 128},
    {"f32_k1100", DType::F32, DType::F32, 33, 1100, 128},
    {"bf16", DType::BF16, DType::F32, 72, 300, 128},
    {"bf16_k1100", DType::BF16, DType::F32, 40, 1100, 128},
    {"bf16_wide", DType::BF16, DType::F32, 600, 1100, 128},
    {"f16", DType::F16, DType::F32, 72, 300, 128},
    {"f16_k1100", DType::F16, DType::F32, 21, 1100, 128},
    {"fp8_f32_scale", DType::F8_E4M3, DType::F32, 256, 384, 128},
    {"fp8_f32_scale_edges", DType::F8_E4M3, DType::F32, 200, 300, 128},
    {"fp8_bf16_scale_edges", DType::F8_E4M3, DType::BF16, 130, 1100, 128},
    {"fp8_e8m0_scale_edges", DType::F8_E4M3, DType::F8_E8M0, 200, 300, 128},
    {"fp8_e8m0_wide", DType::F8_E4M3, DType::F8_E8M0, 600, 1100, 128},
    {"fp8_block64", DType::F8_E4M3, DType::F32, 100, 300, 64},
    {"fp8_block100_table", DType::F8_E4M3, DType::BF16, 150, 300, 100},
    {"fp8_streamed", DType::F8_E4M3, DType::F32, 1000, 1100, 128},
    {"fp8_streamed_e8m0", DType::F8_E4M3, DType::F8_E8M0, 520, 2048, 128},
    // Rows of a few vectors (the tiny-K route: mixers' low-rank projections, small experts' down
    // projections), with and without a k tail on each target, and row counts that leave partial row groups.
    {"bf16_k16", DType::BF16, DType::F32, 72, 16, 128},
    {"f32_k24", DType::F32, DType::F32, 40, 24, 128},
    {"bf16_k40", DType::BF16, DType::F32, 50, 40, 128},
    {"f16_k48", DType::F16, DType::F32, 33, 48, 128},
    {"fp8_k32", DType::F8_E4M3, DType::F32, 70, 32, 128},
    {"fp8_k64_e8m0", DType::F8_E4M3, DType::F8_E8M0, 130, 64, 128},
};

constexpr int64_t kKernelMs[] = {1, 2, 3, 4, 5, 6, 7, 16, 33};

TEST(MatmulKernels, EveryTargetMatchesDoubleReference) {
  ThreadPool pool(3);
  const std::vector<int64_t> targets = kernel_targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    ForceTarget force(target);
    for (const Case& c : kKernelCases) {
      for (bool with_bias : {false, true}) {
        auto t = make_weight(c.dtype, c.out, c.in, 4321, with_bias, c.scale_dtype, c.block);
        for (int64_t M : kKernelMs) {
          const auto x = random_vec(static_cast<size_t>(M * c.in), 17 + static_cast<uint32_t>(M));
          std::vector<float> y(static_cast<size_t>(M * c.out), -7.0f);
          ops::matmul(&pool, x.data(), M, t->lin, y.data());
          expect_close(y, ref_matmul(x, M, *t),
                       std::string(hwy::TargetName(target)) + " " + c.name + (with_bias ? " +bias" : "") +
                           " M=" + std::to_string(M));
        }
      }
    }
  }
}

TEST(MatmulKernels, EveryTargetBatchAndThreadInvariant) {
  ThreadPool pool1(1), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool1, &pool3};
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    const char* tname = hwy::TargetName(target);
    for (const Case& c : kKernelCases) {
      auto t = make_weight(c.dtype, c.out, c.in, 987, true, c.scale_dtype, c.block);
      const int64_t N = c.out, K = c.in, Mmax = 33;
      const auto x = random_vec(static_cast<size_t>(Mmax * K), 2024);
      // Reference: each row alone (M = 1) on the calling thread.
      std::vector<float> single(static_cast<size_t>(Mmax * N));
      for (int64_t m = 0; m < Mmax; ++m) ops::matmul(nullptr, x.data() + m * K, 1, t->lin, single.data() + m * N);
      for (ThreadPool* p : pools) {
        for (int64_t M : kKernelMs) {
          std::vector<float> y(static_cast<size_t>(M * N));
          ops::matmul(p, x.data(), M, t->lin, y.data());
          for (int64_t m = 0; m < M; ++m)
            ASSERT_EQ(0, std::memcmp(y.data() + m * N, single.data() + m * N, static_cast<size_t>(N) * 4))
                << tname << " " << c.name << " threads=" << (p ? p->size() : 0) << " M=" << M << " row " << m;
        }
        // The same rows at an offset inside a larger batch, with padded strides.
        const int64_t M = 9, off = 5, xs = K + 3, ys = N + 1;
        std::vector<float> xpad(static_cast<size_t>(M * xs), 0.0f), ypad(static_cast<size_t>(M * ys));
        for (int64_t m = 0; m < M; ++m) std::copy_n(x.data() + (off + m) * K, K, xpad.data() + m * xs);
        ops::matmul(p, xpad.data(), M, t->lin, ypad.data(), xs, ys);
        for (int64_t m = 0; m < M; ++m)
          ASSERT_EQ(0, std::memcmp(ypad.data() + m * ys, single.data() + (off + m) * N, static_cast<size_t>(N) * 4))
              << tname << " " << c.name << " strided row " << m;
      }
    }
  }
}

TEST(MatmulKernels, EveryTargetDequantRowExact) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Case& c : kKernelCases) {
      auto t = make_weight(c.dtype, c.out, c.in, 55, false, c.scale_dtype, c.block);
      std::vector<float> row(static_cast<size_t>(c.in));
      for (int64_t r : {int64_t{0}, c.out / 2, c.out - 1}) {
        ops::dequant_row(t->lin, r, row.data());
        for (int64_t k = 0; k < c.in; ++k)
          ASSERT_EQ(row[k], static_cast<float>(t->deq[r * c.in + k]))
              << hwy::TargetName(target) << " " << c.name << " r=" << r << " k=" << k;
      }
    }
  }
}

TEST(MatmulKernels, EveryTargetTransposedMatchesReference) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Case& c : kKernelCases) {
      auto t = make_weight(c.dtype, c.out, c.in, 808, false, c.scale_dtype, c.block);
      const auto x = random_vec(static_cast<size_t>(c.out), 809);
      auto y = random_vec(static_cast<size_t>(c.in), 810);
      std::vector<double> ref(y.begin(), y.end());
      for (int64_t r = 0; r < c.out; ++r)
        for (int64_t k = 0; k < c.in; ++k) ref[k] += static_cast<double>(x[r]) * t->deq[r * c.in + k];
      ops::matmul_transposed(x.data(), t->lin, y.data());
      expect_close(y, ref, std::string(hwy::TargetName(target)) + " transposed " + c.name);
    }
  }
}

// Several rows in one transposed call: each row bit-identical to its own one-row call (the attention
// absorbs all rows of a head at once), for row counts around the 4-row blocks.
TEST(MatmulKernels, EveryTargetTransposedRowsEqualOneRowCalls) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    for (const Case& c : kKernelCases) {
      auto t = make_weight(c.dtype, c.out, c.in, 811, false, c.scale_dtype, c.block);
      for (int64_t M : {2, 3, 4, 5, 6, 7, 9, 13}) {
        const int64_t xs = c.out + 3, ys = c.in + 5;  // strided rows
        const auto x = random_vec(static_cast<size_t>(M * xs), 812);
        const auto y0 = random_vec(static_cast<size_t>(M * ys), 813);
        std::vector<float> many = y0, one = y0;
        ops::matmul_transposed(x.data(), M, xs, t->lin, many.data(), ys);
        for (int64_t m = 0; m < M; ++m) ops::matmul_transposed(x.data() + m * xs, t->lin, one.data() + m * ys);
        ASSERT_EQ(0, std::memcmp(many.data(), one.data(), many.size() * sizeof(float)))
            << hwy::TargetName(target) << " " << c.name << " M=" << M;
      }
    }
  }
}

// FP8 scales >= 2^120 (the SIMD decoder would overflow pre-multiplying them by 256) take the scalar-table
// route: still exact, still batch invariant.
TEST(MatmulKernels, HugeFp8ScalesExact) {
  ThreadPool pool(3);
  auto t = make_weight(DType::F8_E4M3, 48, 64, 99, false, DType::F8_E8M0, 32);
  for (uint8_t& s : t->scale_u8) s = 247;  // 2^120
  for (size_t i = 0; i < t->u8.size(); ++i) {
    t->u8[i] &= 0xBF;  // exponent <= 7: |e4m3| < 2, products stay finite
    t->deq[i] = ref_fp8(t->u8[i]) * std::ldexp(1.0, 120);
  }
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    std::vector<float> row(64);
    ops::dequant_row(t->lin, 5, row.data());
    for (int64_t k = 0; k < 64; ++k) ASSERT_EQ(row[k], static_cast<float>(t->deq[5 * 64 + k])) << k;
    const auto x = random_vec(16 * 64, 3);
    std::vector<float> y(16 * 48), y1(48);
    ops::matmul(&pool, x.data(), 16, t->lin, y.data());
    expect_close(y, ref_matmul(x, 16, *t), std::string(hwy::TargetName(target)) + " huge scales");
    for (int64_t m = 0; m < 16; ++m) {
      ops::matmul(nullptr, x.data() + m * 64, 1, t->lin, y1.data());
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + m * 48, 48 * 4)) << m;
    }
  }
}

// The two FP8 decoders of decode-sized calls (matmul_kernels.h, Fp8Decode) give the same bits on every target,
// for every FP8 case and row count, including activations too large for the bit route (x · scale >= 256: that
// call falls back to the f16 route), and the measured choice is one of them.
class Fp8DecodeSetting {
 public:
  explicit Fp8DecodeSetting(matmul_kernels::Fp8Decode how) { matmul_kernels::set_fp8_decode(how); }
  ~Fp8DecodeSetting() { matmul_kernels::set_fp8_decode(before_); }
  Fp8DecodeSetting(const Fp8DecodeSetting&) = delete;
  Fp8DecodeSetting& operator=(const Fp8DecodeSetting&) = delete;

 private:
  matmul_kernels::Fp8Decode before_ = matmul_kernels::fp8_decode_setting();
};

TEST(MatmulKernels, EveryTargetFp8DecodeRoutesAgree) {
  using matmul_kernels::Fp8Decode;
  ThreadPool pool(3);
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    const std::string auto_name = [] {
      Fp8DecodeSetting a(Fp8Decode::kAuto);
      return std::string(ops::cpu_fp8_decode_name());
    }();
    EXPECT_TRUE(auto_name == "bits" || auto_name == "f16") << auto_name;
    for (const Case& c : kKernelCases) {
      if (c.dtype != DType::F8_E4M3) continue;
      auto t = make_weight(c.dtype, c.out, c.in, 31, true, c.scale_dtype, c.block);
      for (float gain : {1.0f, 1e9f}) {
        for (int64_t M : {1, 3, 7, 16}) {
          auto x = random_vec(static_cast<size_t>(M * c.in), 41 + static_cast<uint32_t>(M));
          for (float& v : x) v *= gain;
          std::vector<float> y[2];
          for (int route = 0; route < 2; ++route) {
            Fp8DecodeSetting how(route == 0 ? Fp8Decode::kF16 : Fp8Decode::kBits);
            y[route].assign(static_cast<size_t>(M * c.out), -7.0f);
            ops::matmul(&pool, x.data(), M, t->lin, y[route].data());
          }
          ASSERT_EQ(0, std::memcmp(y[0].data(), y[1].data(), y[0].size() * sizeof(float)))
              << hwy::TargetName(target) << " " << c.name << " M=" << M << " gain " << gain;
          if (gain == 1.0f) expect_close(y[1], ref_matmul(x, M, *t), std::string(c.name) + " bits route");
        }
      }
    }
  }
}

// Row slices starting inside an FP8 scale block (scale_row0 != 0) on every target.
TEST(MatmulKernels, EveryTargetFp8RowSlices) {
  auto t = make_weight(DType::F8_E4M3, 300, 1100, 7, true, DType::F32, 128);
  const auto x = random_vec(7 * 1100, 8);
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    std::vector<float> full(7 * 300);
    ops::matmul(nullptr, x.data(), 7, t->lin, full.data());
    for (auto [r0, n] : {std::pair<int64_t, int64_t>{96, 70}, {130, 150}, {1, 3}}) {
      std::vector<float> part(static_cast<size_t>(7 * n));
      ops::matmul(nullptr, x.data(), 7, t->lin.rows(r0, n), part.data());
      for (int64_t m = 0; m < 7; ++m)
        ASSERT_EQ(0, std::memcmp(part.data() + m * n, full.data() + m * 300 + r0, static_cast<size_t>(n) * 4))
            << hwy::TargetName(target) << " rows " << r0 << "+" << n << " m=" << m;
    }
  }
}

}  // namespace
}  // namespace nextn
