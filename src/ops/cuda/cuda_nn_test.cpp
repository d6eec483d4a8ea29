// The CUDA backend's own ops (cuda_nn.h, and the grouped matmul of cuda_ops.h) against the CPU ops, op by op:
// the expert-grouped matmul, the DSA top-k (exact indices, ties included), norms and gates. Without a usable
// device every test reports itself skipped, saying why.
#include "ops/cuda/cuda_nn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/finite.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace nextn {
namespace {

using namespace cuda_test;

// A bf16 [out, in] weight of its own bytes.
struct Bf16Weight {
  std::vector<uint16_t> bytes;
  Linear w;
  Bf16Weight(int64_t out, int64_t in, uint32_t seed) : bytes(size_t(out * in)) {
    const auto v = normal(bytes.size(), seed, 0.05f);
    for (size_t i = 0; i < v.size(); ++i) bytes[i] = f32_to_bf16(v[i]);
    w.dtype = DType::BF16;
    w.out = out;
    w.in = in;
    w.row_stride = in;
    w.data = bytes.data();
  }
};

// Rows of 5 experts (0, 3, 1, 0 and 37 rows: several row chunks) through grouped_matmul: each row within the CPU's rounding of
// ops::matmul, and bit-identical to the same row run with every expert holding one row.
TEST(CudaNn, GroupedMatmulMatchesTheCpuAndNoRowDependsOnItsNeighbours) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t E = 5, out = 96, in = 256;
  std::vector<Bf16Weight> host;
  std::vector<cuda::DeviceLinear> dev;
  std::vector<const Linear*> table_of;
  for (int64_t e = 0; e < E; ++e) host.emplace_back(out, in, 10 + uint32_t(e));
  for (int64_t e = 0; e < E; ++e) dev.push_back(cuda::upload(host[size_t(e)].w));
  for (const auto& d : dev) table_of.push_back(&d.w);
  const cuda::WeightTable table = cuda::weight_table(table_of.data(), E);
  const std::vector<int32_t> first = {0, 0, 3, 4, 4, 41};
  const int64_t rows = first.back();
  const auto x = normal(size_t(rows * in), 3);
  const auto dx = to_device(x), dfirst = to_device(first);
  cuda::DeviceBuffer dy(size_t(rows * out) * 4);
  cuda::grouped_matmul(dx.f32(), table, static_cast<const int32_t*>(dfirst.get()), rows, dy.f32());
  const auto got = to_host<float>(dy, size_t(rows * out));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = first[size_t(e)]; r < first[size_t(e) + 1]; ++r) {
      std::vector<float> want(static_cast<size_t>(out));
      ops::matmul(nullptr, x.data() + r * in, 1, host[size_t(e)].w, want.data());
      for (int64_t n = 0; n < out; ++n)
        ASSERT_NEAR(got[size_t(r * out + n)], want[size_t(n)], 1e-5 * (1 + std::fabs(want[size_t(n)])))
            << "expert " << e << " row " << r;
      // the row alone: expert e's one row, the others none
      std::vector<int32_t> alone_first(size_t(E + 1), 0);
      for (int64_t i = e + 1; i <= E; ++i) alone_first[size_t(i)] = 1;
      const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
      const auto dxr = to_device(xr), daf = to_device(alone_first);
      cuda::DeviceBuffer dyr(size_t(out) * 4);
      cuda::grouped_matmul(dxr.f32(), table, static_cast<const int32_t*>(daf.get()), 1, dyr.f32());
      const auto alone = to_host<float>(dyr, size_t(out));
      EXPECT_EQ(0, std::memcmp(alone.data(), got.data() + r * out, size_t(out) * 4)) << "expert " << e << " row " << r;
    }
}

// The DSA top-k: the CPU's indices for every row (scores with many exact ties, as ReLU scores have), for k
// below, at and above the row's length.
TEST(CudaNn, TopkRowsPicksTheCpusIndicesTiesIncluded) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 40, stride = 700;
  std::mt19937 rng(5);
  std::vector<float> scores(size_t(rows * stride), 0.f);
  std::vector<int32_t> slot(static_cast<size_t>(rows)), span(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    slot[size_t(r)] = int32_t(r * 17 % stride);
    for (int64_t j = 0; j <= slot[size_t(r)]; ++j)
      scores[size_t(r * stride + j)] = r % 3 == 0 ? float(int(rng() % 5)) - 1.f : std::ldexp(float(rng() % 1000), -7);
  }
  const auto ds = to_device(scores), dslot = to_device(slot), dspan = to_device(span);
  cuda::RowCaches rc;
  rc.slot = static_cast<const int32_t*>(dslot.get());
  rc.span = static_cast<const int32_t*>(dspan.get());
  for (int64_t k : {1, 7, 64, 300, 700}) {
    cuda::DeviceBuffer dtopk(size_t(rows * k) * 4), dcount(size_t(rows) * 4);
    cuda::topk_rows(ds.f32(), rows, stride, rc, k, static_cast<int32_t*>(dtopk.get()),
                    static_cast<int32_t*>(dcount.get()));
    const auto topk = to_host<int32_t>(dtopk, size_t(rows * k));
    const auto count = to_host<int32_t>(dcount, size_t(rows));
    std::vector<float> scratch(static_cast<size_t>(stride));
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> want(static_cast<size_t>(k));
      const int64_t n = ops::topk_ascending(scores.data() + r * stride, slot[size_t(r)] + 1, k, want.data(),
                                            scratch.data());
      ASSERT_EQ(count[size_t(r)], n) << "row " << r << " k " << k;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(topk[size_t(r * k + i)], want[size_t(i)]) << "row " << r << " k " << k;
    }
  }
}

// Greedy ids on the device: the host's choice (the lowest index of the largest value) for rows with many
// exact ties, signed zeros, the maximum in the first or last place, and -1 for rows holding a NaN or an inf;
// widths below, at and past the block's threads, and a vocabulary as large as HY V4's.
// moe_dispatch against a grouping done on the host: experts ascending, tokens in order within one; with a count
// of real tokens (a padded forward), the padding's choices join no expert and every index they leave is 0.
TEST(CudaNn, MoeDispatchGroupsByExpertAndLeavesPaddingOut) {
  NEXTN_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  const int64_t E = 37, k = 3;
  for (int64_t S : {1, 4, 8, 70}) {
    for (int64_t real : {S, S / 2, int64_t(0)}) {
      std::vector<int32_t> ids(size_t(S * k));
      for (auto& id : ids) id = int32_t(rng() % E);
      const auto d_ids = to_device(ids);
      const auto d_real = to_device(std::vector<int32_t>{int32_t(real)});
      std::vector<int32_t> stale(size_t(S * k), 12345);  // (what a previous forward left)
      auto d_token = to_device(stale), d_row = to_device(stale);
      cuda::DeviceBuffer d_first(size_t(E + 1) * 4);
      cuda::moe_dispatch(static_cast<const int32_t*>(d_ids.get()), S, k, E, static_cast<int32_t*>(d_first.get()),
                         static_cast<int32_t*>(d_token.get()), static_cast<int32_t*>(d_row.get()),
                         real == S ? nullptr : static_cast<const int32_t*>(d_real.get()));
      const auto first = to_host<int32_t>(d_first, size_t(E + 1));
      const auto token_of = to_host<int32_t>(d_token, size_t(S * k));
      const auto row_of = to_host<int32_t>(d_row, size_t(S * k));
      std::vector<int32_t> want_first(size_t(E + 1), 0), want_token(size_t(S * k), 0), want_row(size_t(S * k), 0);
      int32_t at = 0;
      for (int64_t e = 0; e < E; ++e) {
        want_first[size_t(e)] = at;
        for (int64_t i = 0; i < real * k; ++i)
          if (ids[size_t(i)] == e) want_token[size_t(at)] = int32_t(i / k), want_row[size_t(i)] = at++;
      }
      want_first[size_t(E)] = at;
      EXPECT_EQ(first, want_first) << "S " << S << " real " << real;
      EXPECT_EQ(token_of, want_token) << "S " << S << " real " << real;
      EXPECT_EQ(row_of, want_row) << "S " << S << " real " << real;
    }
  }
}

TEST(CudaNn, RowArgmaxIsTheHostsFirstMaximumAndFlagsNonFiniteRows) {
  NEXTN_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  for (int64_t n : {1, 7, 256, 1000, 129280}) {
    const int64_t rows = 12;
    std::vector<float> x(size_t(rows * n));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * n;
      for (int64_t i = 0; i < n; ++i) row[i] = r % 2 ? float(int(rng() % 4)) : std::ldexp(float(rng() % 100000), -9);
      if (r == 2) std::fill(row, row + n, -0.0f), row[n - 1] = 0.0f;  // signed zeros are equal: index 0
      if (r == 3) row[n - 1] = 1e30f;
      if (r == 4) row[0] = 1e30f;
      if (r == 5) row[n / 2] = NAN;
      if (r == 6) row[n - 1] = INFINITY;
      if (r == 7) row[0] = -INFINITY;
      if (r == 8) std::fill(row, row + n, -3.0e38f);
    }
    const auto dx = to_device(x);
    cuda::DeviceBuffer dout(size_t(rows) * 4);
    cuda::row_argmax(dx.f32(), rows, n, static_cast<int32_t*>(dout.get()));
    const auto got = to_host<int32_t>(dout, size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t want = finite_argmax(x.data() + r * n, n);
      EXPECT_EQ(got[size_t(r)], want) << "n " << n << " row " << r;
      if (r >= 5 && r <= 7) {
        EXPECT_EQ(want, -1) << "n " << n << " row " << r;
      }
    }
  }
}

TEST(CudaNn, NormsAndGatesMatchTheCpu) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 5, d = 300;
  const auto x = normal(size_t(rows * d), 1), w = normal(size_t(d), 2), b = normal(size_t(d), 3), g = normal(size_t(rows * d), 4);
  const auto dx = to_device(x), dw = to_device(w), db = to_device(b), dg = to_device(g);
  cuda::DeviceBuffer dy(size_t(rows * d) * 4);
  auto check = [&](const std::vector<float>& want, const char* what, double tol) {
    const auto got = to_host<float>(dy, want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
  };
  std::vector<float> want(size_t(rows * d));
  ops::rms_norm(x.data(), rows, d, w.data(), 1e-6f, want.data());
  cuda::rms_norm_rows(dx.f32(), rows, d, d, dw.f32(), 1e-6f, dy.f32(), d);
  check(want, "rms_norm_rows", 1e-5);
  ops::layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-6f, want.data());
  cuda::layer_norm_rows(dx.f32(), rows, d, dw.f32(), db.f32(), 1e-6f, dy.f32());
  check(want, "layer_norm_rows", 1e-5);
  ops::swiglu(x.data(), g.data(), rows * d, 1.5f, want.data());
  cuda::swiglu(dx.f32(), dg.f32(), rows * d, 1.5f, dy.f32());
  check(want, "swiglu", 1e-6);
  ops::mul_sigmoid(x.data(), g.data(), rows * d, want.data());
  cuda::mul_sigmoid(dx.f32(), dg.f32(), rows * d, dy.f32());
  check(want, "mul_sigmoid", 1e-6);
}

// Rows wide enough that RMSNorm splits its output over several blocks (one per 1024 elements, unevenly here):
// each element as the CPU computes it, and an in-place norm (one block a row) with the same bits as the split one.
TEST(CudaNn, WideRowsSplitOverBlocksKeepTheirValues) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 3, d = 4100;
  const auto x = normal(size_t(rows * d), 21), w = normal(size_t(d), 22);
  const auto dx = to_device(x), dw = to_device(w);
  cuda::DeviceBuffer dy(size_t(rows * d) * 4);
  cuda::rms_norm_rows(dx.f32(), rows, d, d, dw.f32(), 1e-6f, dy.f32(), d);
  const auto split = to_host<float>(dy, size_t(rows * d));
  std::vector<float> want(size_t(rows * d));
  ops::rms_norm(x.data(), rows, d, w.data(), 1e-6f, want.data());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(split[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "rms_norm_rows element " << i;
  const auto dz = to_device(x);  // in place: one block a row
  cuda::rms_norm_rows(dz.f32(), rows, d, d, dw.f32(), 1e-6f, dz.f32(), d);
  EXPECT_EQ(0, std::memcmp(to_host<float>(dz, split.size()).data(), split.data(), split.size() * 4));
}

// The per-head absorption y[m, h, c] = Σ_r w[row0 + h · stride + r, c] · x[m, h, r] with FP8 weights whose
// heads start and end inside 128-row scale blocks (each warp's rows step over them 16 at a time), for every weight
// kind: every value within the CPU's rounding of the dequantized sum, and each row of x alone gives the bits it
// gets among five.
TEST(CudaNn, TransposedHeadsCrossScaleBlocksAsTheCpuDequantizes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t heads = 3, stride = 150, rows_per_head = 140, row0 = 5, M = 5;
  const int64_t out = row0 + (heads - 1) * stride + rows_per_head;
  uint32_t seed = 31;
  // (200 columns: rows not 16-byte aligned, one element at a time; 512: 16-byte pieces, several column tiles
  // for bf16 and f32)
  for (const DType dt : {DType::F8_E4M3, DType::BF16, DType::F32})
    for (const int64_t in : {200, 512}) {
      const std::string what = std::string(dtype_name(dt)) + " in=" + std::to_string(in);
      const cuda_test::HostWeight hw = cuda_test::make_weight(dt, DType::F32, out, in, in, false, seed++);
      const cuda::DeviceLinear dw = cuda::upload(hw.w);
      const auto x = normal(size_t(M * heads * rows_per_head), seed++);
      const auto dx = to_device(x);
      cuda::DeviceBuffer dy(size_t(M * heads * in) * 4);
      cuda::matmul_transposed_heads(dx.f32(), M, heads * rows_per_head, rows_per_head, dw.w, row0, stride,
                                    rows_per_head, heads, dy.f32(), heads * in, in);
      const auto got = to_host<float>(dy, size_t(M * heads * in));
      for (int64_t m = 0; m < M; ++m) {  // each row of x alone: its bits (a block takes 1 or 4 rows of x)
        cuda::DeviceBuffer alone(size_t(heads * in) * 4);
        cuda::matmul_transposed_heads(dx.f32() + m * heads * rows_per_head, 1, heads * rows_per_head, rows_per_head,
                                      dw.w, row0, stride, rows_per_head, heads, alone.f32(), heads * in, in);
        EXPECT_TRUE(same_bits(to_host<float>(alone, size_t(heads * in)).data(), got.data() + m * heads * in,
                              size_t(heads * in)))
            << what << " row " << m;
      }
      std::vector<float> deq(size_t(out * in));
      for (int64_t n = 0; n < out; ++n) ops::dequant_row(hw.w, n, deq.data() + n * in);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < in; ++c) {
            double acc = 0, mag = 0;
            for (int64_t r = 0; r < rows_per_head; ++r) {
              const double t = double(deq[size_t((row0 + h * stride + r) * in + c)]) *
                               x[size_t((m * heads + h) * rows_per_head + r)];
              acc += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(got[size_t((m * heads + h) * in + c)], acc, 1e-5 * (1 + mag))
                << what << " m " << m << " h " << h << " c " << c;
          }
    }
}

// y[m, h, n] = Σ_c x[m, h, c] · w[row0 + h · stride + n, c] (MLA's W_vb per head), a warp a row: rows a head
// not a multiple of the block's 8 warps, rows 16-byte aligned or not, every weight kind, against the CPU's
// dequantized rows; and each row of x alone gives the bits it gets among five.
TEST(CudaNn, MatmulHeadsMatchesTheCpusDequantizedRows) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t heads = 3, stride = 40, rows_per_head = 13, row0 = 7, M = 5;
  const int64_t out = row0 + (heads - 1) * stride + rows_per_head;
  uint32_t seed = 61;
  for (const DType dt : {DType::F8_E4M3, DType::BF16, DType::F32})
    for (const int64_t in : {200, 512, 1000}) {
      const std::string what = std::string(dtype_name(dt)) + " in=" + std::to_string(in);
      const cuda_test::HostWeight hw = cuda_test::make_weight(dt, DType::F32, out, in, in, false, seed++);
      const cuda::DeviceLinear dw = cuda::upload(hw.w);
      const auto x = normal(size_t(M * heads * in), seed++);
      const auto dx = to_device(x);
      cuda::DeviceBuffer dy(size_t(M * heads * rows_per_head) * 4);
      cuda::matmul_heads(dx.f32(), M, heads * in, in, dw.w, row0, stride, rows_per_head, heads, dy.f32(),
                         heads * rows_per_head, rows_per_head);
      const auto got = to_host<float>(dy, size_t(M * heads * rows_per_head));
      for (int64_t m = 0; m < M; ++m) {  // each row of x alone: its bits (a block takes 1 or 4 rows of x)
        cuda::DeviceBuffer alone(size_t(heads * rows_per_head) * 4);
        cuda::matmul_heads(dx.f32() + m * heads * in, 1, heads * in, in, dw.w, row0, stride, rows_per_head, heads,
                           alone.f32(), heads * rows_per_head, rows_per_head);
        EXPECT_TRUE(same_bits(to_host<float>(alone, size_t(heads * rows_per_head)).data(),
                              got.data() + m * heads * rows_per_head, size_t(heads * rows_per_head)))
            << what << " row " << m;
      }
      std::vector<float> row(static_cast<size_t>(in));
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t n = 0; n < rows_per_head; ++n) {
          ops::dequant_row(hw.w, row0 + h * stride + n, row.data());
          for (int64_t m = 0; m < M; ++m) {
            double acc = 0, mag = 0;
            for (int64_t c = 0; c < in; ++c) {
              const double t = double(row[size_t(c)]) * x[size_t((m * heads + h) * in + c)];
              acc += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(got[size_t((m * heads + h) * rows_per_head + n)], acc, 1e-5 * (1 + mag))
                << what << " m " << m << " h " << h << " n " << n;
          }
        }
    }
}

// More rows of x than a grid dimension has blocks for (65535 blocks of 4 rows): both per-head matmuls launch the
// rows in chunks, and the last rows get the bits they get alone.
TEST(CudaNn, PerHeadMatmulsTakeMoreRowsThanAGridDimension) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t M = 65535 * 4 + 1000, in = 16, rows_per_head = 4;
  const cuda_test::HostWeight hw = cuda_test::make_weight(DType::BF16, DType::F32, rows_per_head, in, in, false, 5);
  const cuda::DeviceLinear dw = cuda::upload(hw.w);
  const auto x = normal(size_t(M * in), 6);  // [M, in] for matmul_heads; [M, 4] rows of it for the transposed one
  const auto dx = to_device(x);
  cuda::DeviceBuffer dy(size_t(M * in) * 4), alone(size_t(in) * 4);
  cuda::matmul_heads(dx.f32(), M, in, in, dw.w, 0, 0, rows_per_head, 1, dy.f32(), rows_per_head, rows_per_head);
  auto got = to_host<float>(dy, size_t(M * rows_per_head));
  for (const int64_t m : {int64_t(0), int64_t(65535 * 4), M - 1}) {
    cuda::matmul_heads(dx.f32() + m * in, 1, in, in, dw.w, 0, 0, rows_per_head, 1, alone.f32(), rows_per_head,
                       rows_per_head);
    EXPECT_TRUE(same_bits(to_host<float>(alone, size_t(rows_per_head)).data(), got.data() + m * rows_per_head,
                          size_t(rows_per_head)))
        << "matmul_heads row " << m;
  }
  cuda::matmul_transposed_heads(dx.f32(), M, rows_per_head, rows_per_head, dw.w, 0, 0, rows_per_head, 1, dy.f32(), in,
                                in);
  got = to_host<float>(dy, size_t(M * in));
  for (const int64_t m : {int64_t(0), int64_t(65535 * 4), M - 1}) {
    cuda::matmul_transposed_heads(dx.f32() + m * rows_per_head, 1, rows_per_head, rows_per_head, dw.w, 0, 0,
                                  rows_per_head, 1, alone.f32(), in, in);
    EXPECT_TRUE(same_bits(to_host<float>(alone, size_t(in)).data(), got.data() + m * in, size_t(in)))
        << "matmul_transposed_heads row " << m;
  }
}

// A paged cache on the device for the tests below: one span, pages of 4 slots in the order 3, 0, 2, 1, and
// two planes of 16 slots x `width` floats, zeroed; rows r at slots slot[r], positions pos[r].
struct PagedCache {
  static constexpr int64_t kRows = 5, kSlots = 16;
  const std::vector<int32_t> span = std::vector<int32_t>(size_t(kRows), 0), slot = {0, 5, 6, 11, 15},
                             pos = {100, 7, 4096, 0, 33};
  cuda::DeviceBuffer dspan = to_device(span), dslot = to_device(slot), dpos = to_device(pos),
                     dtables = to_device(std::vector<int32_t>{3, 0, 2, 1}),
                     dpt = to_device(std::vector<int32_t>{4}), doff = to_device(std::vector<int64_t>{0});
  std::vector<float> zeros;
  cuda::DeviceBuffer plane0, plane1, dplanes, dby_span;
  cuda::RowCaches rc;
  explicit PagedCache(int64_t width) : zeros(size_t(kSlots * width), 0.f) {
    plane0 = to_device(zeros);
    plane1 = to_device(zeros);
    dplanes = to_device(std::vector<float*>{plane0.f32(), plane1.f32()});
    dby_span = to_device(std::vector<float* const*>{static_cast<float* const*>(dplanes.get())});
    rc.span = static_cast<const int32_t*>(dspan.get());
    rc.slot = static_cast<const int32_t*>(dslot.get());
    rc.position = static_cast<const int32_t*>(dpos.get());
    rc.table_offset = static_cast<const int64_t*>(doff.get());
    rc.page_tokens = static_cast<const int32_t*>(dpt.get());
    rc.tables = static_cast<const int32_t*>(dtables.get());
    rc.planes = static_cast<float* const* const*>(dby_span.get());
  }
};

// write_key_rows against the ops it fuses (a norm, the copy of the unnormalized tail, RoPE, the cache
// write), bit for bit: an MLA key (RMSNorm over the latent, the rope part raw then rotated) and an indexer
// key (LayerNorm over the whole row, its last dims rotated), rows at scattered slots of a paged cache.
TEST(CudaNn, WriteKeyRowsGivesTheBitsOfTheOpsItFuses) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = PagedCache::kRows;
  struct Case {
    int64_t width, normed, rope_offset, rope_dim;
    bool layer_norm;
  };
  for (const Case& k : {Case{576, 512, 512, 64, false}, Case{128, 128, 64, 64, true}}) {
    const int64_t w = k.width;
    PagedCache cache(w);
    const cuda::RowCaches& rc = cache.rc;
    const auto src = to_device(normal(size_t(rows * w), 41, 2.f));
    const auto weight = to_device(normal(size_t(k.normed), 42)), bias = to_device(normal(size_t(k.normed), 43));
    std::vector<float> inv_freq(size_t(k.rope_dim / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.f, -2.f * float(i) / float(k.rope_dim));
    const auto dfreq = to_device(inv_freq);
    const float eps = 1e-6f, af = 1.3f;
    cuda::DeviceBuffer key(size_t(rows * w) * 4);
    if (k.layer_norm) {
      cuda::layer_norm_rows(src.f32(), rows, w, weight.f32(), bias.f32(), eps, key.f32());
    } else {
      cuda::rms_norm_rows(src.f32(), rows, k.normed, w, weight.f32(), eps, key.f32(), w);
      cuda::copy_cols(src.f32() + k.normed, rows, w - k.normed, w, key.f32() + k.normed, w);
    }
    cuda::rope_rows(key.f32(), rows, 1, w, 0, k.rope_offset, k.rope_dim, rc.position, dfreq.f32(), af);
    cuda::write_cache_rows(key.f32(), rows, w, w, rc, 1);
    cuda::write_key_rows(src.f32(), rows, w, w, {weight.f32(), k.layer_norm ? bias.f32() : nullptr, eps, k.normed},
                         k.rope_offset, k.rope_dim, dfreq.f32(), af, rc, 0);
    const auto got = to_host<float>(cache.plane0, cache.zeros.size());
    const auto want = to_host<float>(cache.plane1, cache.zeros.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "width " << w;
    EXPECT_NE(std::memcmp(got.data(), cache.zeros.data(), got.size() * 4), 0) << "width " << w;  // (it wrote)
  }
}

// The indexer's head weights scaled as the scores' kernel reads them give the bits of scale() then the
// scores; keys of 64 (in registers) and 300 (past them) elements.
TEST(CudaNn, IndexerScoresScaleTheHeadWeightsAsScaleDoes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = PagedCache::kRows, heads = 7;
  for (int64_t dim : {64, 300}) {
    PagedCache cache(dim);
    const auto keys = normal(size_t(PagedCache::kSlots * dim), 51);
    cache.plane0.upload(keys.data(), keys.size() * 4);
    const auto q = to_device(normal(size_t(rows * heads * dim), 52));
    const auto w = normal(size_t(rows * heads), 53);
    const auto dw = to_device(w), dw_scaled = to_device(w);
    const float a = 1.0f / std::sqrt(float(heads)), b = 1.0f / std::sqrt(float(dim));
    cuda::scale(dw_scaled.f32(), rows * heads, a, b);
    const int64_t max_keys = PagedCache::kSlots;
    cuda::DeviceBuffer fused(size_t(rows * max_keys) * 4), ref(size_t(rows * max_keys) * 4);
    const std::vector<float> zeros(size_t(rows * max_keys), 0.f);
    fused.upload(zeros.data(), zeros.size() * 4);
    ref.upload(zeros.data(), zeros.size() * 4);
    cuda::indexer_scores(q.f32(), dw.f32(), rows, heads, dim, cache.rc, 0, max_keys, fused.f32(), max_keys, a, b);
    cuda::indexer_scores(q.f32(), dw_scaled.f32(), rows, heads, dim, cache.rc, 0, max_keys, ref.f32(), max_keys);
    const auto got = to_host<float>(fused, zeros.size()), want = to_host<float>(ref, zeros.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "dim " << dim;
    EXPECT_NE(std::memcmp(got.data(), zeros.data(), got.size() * 4), 0) << "dim " << dim;
  }
}

// A tail passed through beside the transposed product: the product keeps its bits, the tail is x's.
TEST(CudaNn, TransposedHeadsPassTheTailThrough) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t heads = 3, rows_per_head = 140, tail = 24, in = 200, M = 2, xh = rows_per_head + tail;
  const cuda_test::HostWeight hw = cuda_test::make_weight(DType::F8_E4M3, DType::F32, heads * 150, in, in, false, 61);
  const cuda::DeviceLinear dw = cuda::upload(hw.w);
  const auto x = normal(size_t(M * heads * xh), 62);
  const auto dx = to_device(x);
  const int64_t yh = in + tail;
  cuda::DeviceBuffer with(size_t(M * heads * yh) * 4), without(size_t(M * heads * yh) * 4);
  const std::vector<float> zeros(size_t(M * heads * yh), 0.f);
  without.upload(zeros.data(), zeros.size() * 4);
  cuda::matmul_transposed_heads(dx.f32(), M, heads * xh, xh, dw.w, 0, 150, rows_per_head, heads, with.f32(),
                                heads * yh, yh, tail);
  cuda::matmul_transposed_heads(dx.f32(), M, heads * xh, xh, dw.w, 0, 150, rows_per_head, heads, without.f32(),
                                heads * yh, yh);
  const auto got = to_host<float>(with, zeros.size()), plain = to_host<float>(without, zeros.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t y0 = size_t((m * heads + h) * yh);
      EXPECT_EQ(std::memcmp(got.data() + y0, plain.data() + y0, size_t(in) * 4), 0) << "m " << m << " h " << h;
      EXPECT_EQ(std::memcmp(got.data() + y0 + in, x.data() + (m * heads + h) * xh + rows_per_head, size_t(tail) * 4), 0)
          << "m " << m << " h " << h;
    }
}

// The residual updates fused into a block's last kernel (cuda::OutputSink) give the bits of the ops they
// replace: a matmul then add (the MTP residual) or then hc_post (the hyper-connection post), on each matmul
// path (FP8 tensor cores, FP8 and bf16 on the CUDA cores with a bias, an f32 matrix of <= 64 columns) and row
// counts that split into row chunks; and the MoE combine likewise.
TEST(CudaNn, OutputSinksGiveTheBitsOfTheOpsTheyFuse) {
  NEXTN_SKIP_WITHOUT_CUDA();
  using cuda_test::HostWeight;
  using cuda_test::make_weight;
  const int64_t C = 3;
  std::vector<HostWeight> weights;
  weights.push_back(make_weight(DType::F8_E4M3, DType::F32, 256, 1024, 1024, false, 51));  // tensor cores
  weights.push_back(make_weight(DType::F8_E4M3, DType::BF16, 200, 1040, 1040, true, 52));  // CUDA cores
  weights.push_back(make_weight(DType::BF16, DType::F32, 160, 512, 512, true, 53));
  weights.push_back(make_weight(DType::F32, DType::F32, 40, 700, 700, false, 54));
  auto same = [](const cuda::DeviceBuffer& a, const cuda::DeviceBuffer& b, size_t n) {
    return std::memcmp(to_host<float>(a, n).data(), to_host<float>(b, n).data(), n * 4) == 0;
  };
  for (const HostWeight& h : weights) {
    const cuda::DeviceLinear d = cuda::upload(h.w);
    const int64_t H = d.w.out;
    for (int64_t M : {1, 4, 9, 70}) {
      const auto dx = to_device(normal(size_t(M * d.w.in), uint32_t(60 + M)));
      const auto residual = normal(size_t(M * H), uint32_t(70 + M)), streams = normal(size_t(M * C * H), 80);
      const auto post = normal(size_t(M * C), 81);
      const auto dpost = to_device(post);
      // the separate ops
      cuda::DeviceBuffer y(size_t(M * H) * 4);
      auto sum = to_device(residual), mixed = to_device(streams);
      cuda::matmul(dx.f32(), M, d.w, y.f32());
      cuda::add(sum.f32(), y.f32(), M * H);
      cuda::hc_post(mixed.f32(), dpost.f32(), y.f32(), M, C, H);
      // fused
      auto sum2 = to_device(residual), mixed2 = to_device(streams);
      cuda::DeviceBuffer y2(size_t(M * H) * 4);
      cuda::OutputSink acc;
      acc.accumulate = true;
      cuda::matmul(dx.f32(), M, d.w, sum2.f32(), -1, -1, acc);
      const cuda::OutputSink hc{false, mixed2.f32(), dpost.f32(), C, H};
      cuda::matmul(dx.f32(), M, d.w, y2.f32(), -1, -1, hc);
      const std::string at = std::string(dtype_name(h.w.dtype)) + " " + std::to_string(H) + "x" +
                             std::to_string(d.w.in) + " M=" + std::to_string(M);
      EXPECT_TRUE(same(sum, sum2, size_t(M * H))) << "add, " << at;
      EXPECT_TRUE(same(y, y2, size_t(M * H))) << "y, " << at;
      EXPECT_TRUE(same(mixed, mixed2, size_t(M * C * H))) << "hc_post, " << at;
    }
  }
  // MoE combine: 5 tokens, 2 choices each over 7 expert rows (one choice unused), a shared expert
  const int64_t T = 5, k = 2, H = 300;
  const auto eo = to_device(normal(size_t(7 * H), 90)), shared = to_device(normal(size_t(T * H), 91));
  const auto rows = to_device(std::vector<int32_t>{0, 3, 1, -1, 2, 4, 5, 6, 6, 0});
  const auto wts = to_device(normal(size_t(T * k), 92));
  const auto streams = normal(size_t(T * C * H), 93);
  const auto dpost = to_device(normal(size_t(T * C), 94));
  cuda::DeviceBuffer y(size_t(T * H) * 4), y2(size_t(T * H) * 4);
  auto mixed = to_device(streams), mixed2 = to_device(streams);
  cuda::moe_combine(eo.f32(), static_cast<const int32_t*>(rows.get()), wts.f32(), T, k, H, shared.f32(), y.f32());
  cuda::hc_post(mixed.f32(), dpost.f32(), y.f32(), T, C, H);
  cuda::moe_combine(eo.f32(), static_cast<const int32_t*>(rows.get()), wts.f32(), T, k, H, shared.f32(), y2.f32(),
                    cuda::OutputSink{false, mixed2.f32(), dpost.f32(), C, H});
  EXPECT_TRUE(same(y, y2, size_t(T * H)));
  EXPECT_TRUE(same(mixed, mixed2, size_t(T * C * H)));
}

// The iHC pre-mix as its definition (cuda_nn.h) reads, in double: x [rows, H] and post [rows, C] (post only
// with a 2C-column mixer).
struct HcPreWant {
  std::vector<double> x, post;
};
HcPreWant hc_pre_want(const std::vector<float>& streams, const HostWeight& fn, const std::vector<float>& base,
                      int64_t rows, int64_t C, int64_t H, float scale0, float scale1, float eps, float hc_eps,
                      float mag) {
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  const auto* w = reinterpret_cast<const float*>(fn.data.data());
  HcPreWant want{std::vector<double>(size_t(rows * H)), std::vector<double>(size_t(rows * C))};
  for (int64_t r = 0; r < rows; ++r) {
    const float* X = streams.data() + r * C * H;
    double ss = 0;
    for (int64_t k = 0; k < C * H; ++k) ss += double(X[k]) * X[k];
    const double inv = 1.0 / std::sqrt(ss / double(C * H) + eps);
    std::vector<double> mix(static_cast<size_t>(fn.w.out), 0.0), pre(static_cast<size_t>(C));
    for (int64_t j = 0; j < fn.w.out; ++j)
      for (int64_t k = 0; k < C * H; ++k) mix[size_t(j)] += double(w[j * C * H + k]) * X[k];
    for (int64_t j = 0; j < C; ++j) {
      pre[size_t(j)] = sigmoid(mix[size_t(j)] * inv * scale0 + base[size_t(j)]) + hc_eps;
      if (fn.w.out == 2 * C)
        want.post[size_t(r * C + j)] = mag * sigmoid(mix[size_t(C + j)] * inv * scale1 + base[size_t(C + j)]) + hc_eps;
    }
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < C; ++j) want.x[size_t(r * H + i)] += pre[size_t(j)] * X[j * H + i];
  }
  return want;
}

// hc_pre (the mixer's products and the row statistics in slices, the mix by a cluster of blocks a row) against
// its definition, at widths of one block a row to eight with several elements a thread, 4 and 6 streams, with
// post gates and without (hc_head's C-column mixer), x itself and x normed; and each row's bits the same when
// it is computed alone as among three.
TEST(CudaNn, HcPreMatchesItsDefinitionAndARowIsItsOwn) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 3;
  const float scale0 = 0.7f, scale1 = 1.3f, eps = 1e-6f, hc_eps = 1e-3f, mag = 2.f;
  struct Case {
    int64_t C, H;
    bool post;
  };
  uint32_t seed = 101;
  for (const Case cs : {Case{4, 256, true}, Case{4, 2100, true}, Case{4, 7168, true}, Case{4, 13000, false},
                        Case{6, 1000, true}}) {
    const int64_t C = cs.C, H = cs.H, n_mix = cs.post ? 2 * C : C;
    const std::string what = "C=" + std::to_string(C) + " H=" + std::to_string(H);
    const auto streams = normal(size_t(rows * C * H), seed++), base = normal(size_t(n_mix), seed++);
    const auto weight = normal(size_t(H), seed++);
    const HostWeight fn = make_weight(DType::F32, DType::F32, n_mix, C * H, C * H, false, seed++);
    const HcPreWant want = hc_pre_want(streams, fn, base, rows, C, H, scale0, scale1, eps, hc_eps, mag);
    const cuda::DeviceLinear dfn = cuda::upload(fn.w);
    const auto ds = to_device(streams), db = to_device(base), dw = to_device(weight);
    cuda::DeviceBuffer scratch(size_t(cuda::hc_pre_scratch_floats(rows, C, H, n_mix)) * 4);
    cuda::DeviceBuffer x(size_t(rows * H) * 4), xn(size_t(rows * H) * 4), post(size_t(rows * C) * 4);
    float* post_out = cs.post ? post.f32() : nullptr;
    cuda::hc_pre(ds.f32(), rows, C, H, dfn.w, scratch.f32(), db.f32(), scale0, scale1, eps, hc_eps, mag, x.f32(),
                 post_out);
    const cuda::HcNorm norm{dw.f32(), eps, xn.f32()};
    cuda::hc_pre(ds.f32(), rows, C, H, dfn.w, scratch.f32(), db.f32(), scale0, scale1, eps, hc_eps, mag, nullptr,
                 post_out, &norm);
    const auto got_x = to_host<float>(x, size_t(rows * H)), got_xn = to_host<float>(xn, size_t(rows * H));
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += want.x[size_t(r * H + i)] * want.x[size_t(r * H + i)];
      const double inv = 1.0 / std::sqrt(ss / double(H) + eps);
      for (int64_t i = 0; i < H; ++i) {
        const size_t e = size_t(r * H + i);
        const double wx = want.x[e], wn = wx * inv * weight[size_t(i)];
        ASSERT_NEAR(got_x[e], wx, 1e-5 * (1 + std::fabs(wx))) << what << " x row " << r << " element " << i;
        ASSERT_NEAR(got_xn[e], wn, 1e-5 * (1 + std::fabs(wn))) << what << " normed row " << r << " element " << i;
      }
    }
    if (cs.post) {
      const auto got_post = to_host<float>(post, size_t(rows * C));
      for (size_t e = 0; e < got_post.size(); ++e)
        ASSERT_NEAR(got_post[e], want.post[e], 1e-5 * (1 + std::fabs(want.post[e]))) << what << " post " << e;
    }
    for (int64_t r = 0; r < rows; ++r) {  // row r alone
      cuda::DeviceBuffer xn1(size_t(H) * 4), post1(size_t(C) * 4);
      const cuda::HcNorm norm1{dw.f32(), eps, xn1.f32()};
      cuda::hc_pre(ds.f32() + r * C * H, 1, C, H, dfn.w, scratch.f32(), db.f32(), scale0, scale1, eps, hc_eps, mag,
                   nullptr, cs.post ? post1.f32() : nullptr, &norm1);
      EXPECT_TRUE(same_bits(to_host<float>(xn1, size_t(H)).data(), got_xn.data() + r * H, size_t(H)))
          << what << " row " << r;
    }
  }
}

// A mixer whose weights are not f32 (bf16), and bad mixer shapes are refused by name.
TEST(CudaNn, HcPreTakesBf16MixersAndRefusesWrongShapes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 2, C = 4, H = 1500;
  const float scale0 = 0.7f, scale1 = 1.3f, eps = 1e-6f, hc_eps = 1e-3f, mag = 2.f;
  const auto streams = normal(size_t(rows * C * H), 201), base = normal(size_t(2 * C), 202);
  const Bf16Weight fn(2 * C, C * H, 203);
  HostWeight f32;  // the same weights widened
  f32.w = fn.w;
  f32.w.dtype = DType::F32;
  f32.data.resize(fn.bytes.size() * 4);
  for (size_t i = 0; i < fn.bytes.size(); ++i) {
    const float v = bf16_to_f32(fn.bytes[i]);
    std::memcpy(&f32.data[i * 4], &v, 4);
  }
  const HcPreWant want = hc_pre_want(streams, f32, base, rows, C, H, scale0, scale1, eps, hc_eps, mag);
  const cuda::DeviceLinear dfn = cuda::upload(fn.w);
  const auto ds = to_device(streams), db = to_device(base);
  cuda::DeviceBuffer scratch(size_t(cuda::hc_pre_scratch_floats(rows, C, H, 2 * C)) * 4);
  cuda::DeviceBuffer x(size_t(rows * H) * 4), post(size_t(rows * C) * 4);
  cuda::hc_pre(ds.f32(), rows, C, H, dfn.w, scratch.f32(), db.f32(), scale0, scale1, eps, hc_eps, mag, x.f32(),
               post.f32());
  const auto got = to_host<float>(x, size_t(rows * H));
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_NEAR(got[e], want.x[e], 1e-5 * (1 + std::fabs(want.x[e]))) << "element " << e;
  try {
    cuda::hc_pre(ds.f32(), rows, C, H + 1, dfn.w, scratch.f32(), db.f32(), scale0, scale1, eps, hc_eps, mag, x.f32(),
                 post.f32());
    FAIL() << "a mixer of the wrong width was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mixer is 8 x 6000, not 8 x 6004"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nextn
