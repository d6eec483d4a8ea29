// Every CUDA op against the CPU implementation (ops.h) over many shapes, by an error bound (llama.cpp's
// test-backend-ops is the pattern), and the batch invariance the exactness of speculation rests on: row m of
// an M-row call is bit-identical to the one-row call on that row. Without a usable device every test
// reports itself skipped, saying why.
#include "ops/cuda/cuda_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/ops.h"

namespace nextn {
namespace {

using cuda_test::HostWeight;
using cuda_test::make_weight;

std::vector<float> random_rows(int64_t M, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(size_t(M * width));
  for (float& v : x) v = g(rng);
  return x;
}

struct Shape {
  DType dtype, scale_dtype;
  int64_t out, in, pad;  // row_stride = in + pad
  bool bias;
};

std::string name(const Shape& s) {
  return std::string(dtype_name(s.dtype)) + (s.dtype == DType::F8_E4M3 ? std::string("/") + dtype_name(s.scale_dtype) : "") +
         " " + std::to_string(s.out) + "x" + std::to_string(s.in) + (s.pad ? " stride+" + std::to_string(s.pad) : "") +
         (s.bias ? " bias" : "");
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (DType t : {DType::F32, DType::BF16}) {
    for (auto [o, i] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {64, 256}, {300, 1000}, {256, 2048}, {1024, 512}})
      v.push_back({t, DType::F32, o, i, 0, false});
    v.push_back({t, DType::F32, 96, 200, 8, true});   // a row slice of a wider tensor, aligned
    v.push_back({t, DType::F32, 50, 130, 3, false});  // unaligned rows: the scalar path
  }
  for (DType s : {DType::F32, DType::BF16, DType::F8_E8M0}) {
    for (auto [o, i] : {std::pair<int64_t, int64_t>{128, 128}, {300, 1000}, {512, 2048}, {129, 136}})
      v.push_back({DType::F8_E4M3, s, o, i, 0, false});
    v.push_back({DType::F8_E4M3, s, 200, 384, 128, true});
  }
  // Tensor-core FP8 where x's split leaves shared memory past 4 rows: 1 weight tile a block (256 x 4096) and
  // 2 (4352 x 2560: enough tiles to fill the SMs twice); and a wide one whose 8 rows' split fits there
  // (4352 x 1024: x staged up to 4 rows, split in shared memory for 5-8 and each pass of 8 after).
  v.push_back({DType::F8_E4M3, DType::F32, 256, 4096, 0, false});
  v.push_back({DType::F8_E4M3, DType::F32, 4352, 2560, 0, false});
  v.push_back({DType::F8_E4M3, DType::F32, 4352, 1024, 0, false});
  v.push_back({DType::F8_E4M3, DType::F32, 272, 8192, 0, false});  // narrow, 128-k chunks (2 a warp)
  return v;
}

// |gpu - cpu| <= 1e-5 · Σ_k |w x| (+ a tiny floor): both sum the same fp32 products in different orders.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& bound,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f * bound[i] + 1e-6f)) {
      ADD_FAILURE() << what << ": element " << i << " cuda " << got[i] << " cpu " << want[i];
      ++bad;
    }
}

TEST(CudaOps, MatmulMatchesTheCpuOverManyShapes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 1;
  for (const Shape& s : shapes()) {
    const HostWeight h = make_weight(s.dtype, s.scale_dtype, s.out, s.in, s.in + s.pad, s.bias, seed++);
    const cuda::DeviceLinear d = cuda::upload(h.w);
    // Σ|w||x| per output, from the dequantized rows, for the bound.
    std::vector<float> row(size_t(s.in));
    for (int64_t M : {1, 2, 3, 4, 8, 9, 16, 40}) {
      const std::vector<float> x = random_rows(M, s.in, seed++);
      std::vector<float> want(size_t(M * s.out)), got(want.size()), bound(want.size(), 0.f);
      ops::matmul(nullptr, x.data(), M, h.w, want.data());
      for (int64_t n = 0; n < s.out; ++n) {
        ops::dequant_row(h.w, n, row.data());
        for (int64_t m = 0; m < M; ++m) {
          double b = 0;
          for (int64_t k = 0; k < s.in; ++k) b += std::fabs(double(row[size_t(k)]) * x[size_t(m * s.in + k)]);
          bound[size_t(m * s.out + n)] = float(b);
        }
      }
      cuda::DeviceBuffer dx(x.size() * 4), dy(got.size() * 4);
      dx.upload(x.data(), x.size() * 4);
      cuda::matmul(dx.f32(), M, d.w, dy.f32());
      cuda::synchronize();
      dy.download(got.data(), got.size() * 4);
      expect_close(got, want, bound, name(s) + " M=" + std::to_string(M));
    }
  }
}

// The launch shape follows M (columns per warp, rows per pass; on the FP8 tensor-core path, where x's f16
// split is made: in shared memory for a few rows, per warp for more, and how many 8-row fragments a pass
// takes: 1 up to 8 rows, 2-4 beyond): every shape must give each row the bits of the one-row call.
TEST(CudaOps, MatmulRowsDoNotDependOnTheBatch) {
  NEXTN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 100;
  for (const Shape& s : shapes()) {
    const HostWeight h = make_weight(s.dtype, s.scale_dtype, s.out, s.in, s.in + s.pad, s.bias, seed++);
    const cuda::DeviceLinear d = cuda::upload(h.w);
    const int64_t max_m = 77;  // (full and partial passes of 8 rows, over several row chunks of the grid)
    const std::vector<float> x = random_rows(max_m, s.in, seed++);
    cuda::DeviceBuffer dx(x.size() * 4), dy(size_t(max_m * s.out) * 4), d1(size_t(s.out) * 4);
    dx.upload(x.data(), x.size() * 4);
    std::vector<std::vector<float>> single(size_t(max_m), std::vector<float>(size_t(s.out)));
    for (int64_t m = 0; m < max_m; ++m) {
      cuda::matmul(dx.f32() + m * s.in, 1, d.w, d1.f32());
      cuda::synchronize();
      d1.download(single[size_t(m)].data(), size_t(s.out) * 4);
    }
    std::vector<float> all(size_t(max_m * s.out));
    for (int64_t M : {2, 3, 4, 5, 8, 9, 13, 16, 17, 32, 33, 40, 64, 77}) {
      cuda::matmul(dx.f32(), M, d.w, dy.f32());
      cuda::synchronize();
      dy.download(all.data(), size_t(M * s.out) * 4);
      for (int64_t m = 0; m < M; ++m)
        ASSERT_EQ(std::memcmp(single[size_t(m)].data(), all.data() + m * s.out, size_t(s.out) * 4), 0)
            << name(s) << " M=" << M << " row " << m;
    }
  }
}

// Projections of the same rows in one launch: each output must get the bits of its own matmul() call, for
// FP8 weights (one launch, 1 and 2 tiles a block, more weights than one launch takes) and others mixed in.
TEST(CudaOps, MatmulManyGivesEachOutputItsOwnBits) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t in = 1024;
  std::vector<HostWeight> hosts;
  uint32_t seed = 300;
  for (int64_t out : {48, 512, 1536, 64, 4096, 16, 208})
    hosts.push_back(make_weight(DType::F8_E4M3, DType::F32, out, in, in, false, seed++));
  hosts.push_back(make_weight(DType::BF16, DType::F32, 96, in, in, false, seed++));
  std::vector<cuda::DeviceLinear> dev;
  for (const HostWeight& h : hosts) dev.push_back(cuda::upload(h.w));
  for (int64_t M : {1, 3, 9, 40}) {
    const std::vector<float> x = random_rows(M, in, seed++);
    cuda::DeviceBuffer dx(x.size() * 4);
    dx.upload(x.data(), x.size() * 4);
    std::vector<cuda::DeviceBuffer> alone, shared;
    for (const cuda::DeviceLinear& d : dev) {
      alone.emplace_back(size_t(M * d.w.out) * 4);
      shared.emplace_back(size_t(M * d.w.out) * 4);
      cuda::matmul(dx.f32(), M, d.w, alone.back().f32());
    }
    // the two small ones alone (1 tile a block), then all eight (2 tiles a block, over two launches)
    const ops::MatmulOut two[] = {{&dev[0].w, shared[0].f32()}, {&dev[5].w, shared[5].f32()}};
    cuda::matmul_many(dx.f32(), M, two, 2);
    std::vector<float> a, b;
    auto same = [&](size_t i) {
      const size_t n = size_t(M * dev[i].w.out);
      a.resize(n);
      b.resize(n);
      alone[i].download(a.data(), n * 4);
      shared[i].download(b.data(), n * 4);
      return std::memcmp(a.data(), b.data(), n * 4) == 0;
    };
    cuda::synchronize();
    EXPECT_TRUE(same(0)) << "M=" << M;
    EXPECT_TRUE(same(5)) << "M=" << M;
    const ops::MatmulOut all[] = {{&dev[0].w, shared[0].f32()}, {&dev[1].w, shared[1].f32()},
                                  {&dev[2].w, shared[2].f32()}, {&dev[7].w, shared[7].f32()},
                                  {&dev[3].w, shared[3].f32()}, {&dev[4].w, shared[4].f32()},
                                  {&dev[5].w, shared[5].f32()}, {&dev[6].w, shared[6].f32()}};
    cuda::matmul_many(dx.f32(), M, all, 8);
    cuda::synchronize();
    for (size_t i = 0; i < dev.size(); ++i) EXPECT_TRUE(same(i)) << "weight " << i << " M=" << M;
  }
}

// Every e4m3 code but the NaNs, subnormals included, times block scales from 2^-126 to 2^40 must decode to the
// bits of code value x scale, as dequant_row gives them: rows of x are one-hot, so y[m, n] is weight (n, m)
// itself (the other products are zeros), at one row (each weight decoded as it is consumed) and at 256 rows
// (each decoded vector shared by the rows of a pass).
TEST(CudaOps, Fp8DecodesEveryCodeExactlyAtEveryScale) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t in = 256, out = 256;  // row n holds the codes n, n + 1, ... (mod 256); scale blocks of 128
  HostWeight h = make_weight(DType::F8_E4M3, DType::F32, out, in, in, false, 5);
  for (int64_t n = 0; n < out; ++n)
    for (int64_t k = 0; k < in; ++k) {
      const uint8_t code = uint8_t((n + k) & 0xff);
      h.data[size_t(n * in + k)] = (code & 0x7f) == 0x7f ? 0 : code;
    }
  const float scales[4] = {0x1p-126f, 0x1p40f, 0x1.8p7f, 0x1.fffffep7f};  // [row block][column block]
  std::memcpy(h.scale.data(), scales, sizeof scales);
  const cuda::DeviceLinear d = cuda::upload(h.w);
  std::vector<float> x(size_t(in * in), 0.f);
  for (int64_t m = 0; m < in; ++m) x[size_t(m * in + m)] = 1.f;
  cuda::DeviceBuffer dx(x.size() * 4), dy(size_t(in * out) * 4);
  dx.upload(x.data(), x.size() * 4);
  std::vector<float> got(size_t(in * out));
  for (int64_t M : {int64_t{1}, in}) {
    for (int64_t m0 = 0; m0 < in; m0 += M) cuda::matmul(dx.f32() + m0 * in, M, d.w, dy.f32() + m0 * out);
    cuda::synchronize();
    dy.download(got.data(), got.size() * 4);
    for (int64_t m = 0; m < in; ++m)
      for (int64_t n = 0; n < out; ++n) {
        const uint8_t code = h.data[size_t(n * in + m)];
        const float want = fp8_e4m3_to_f32(code) * scales[(n / 128) * 2 + m / 128];
        const float g = got[size_t(m * out + n)];  // (-0 codes sum to +0 with the zero products)
        ASSERT_TRUE(want == 0 ? g == 0 : std::memcmp(&g, &want, 4) == 0)
            << "M=" << M << " code 0x" << std::hex << int(code) << std::dec << " scale " << scales[(n / 128) * 2 + m / 128]
            << ": cuda " << got[size_t(m * out + n)] << " want " << want;
      }
  }
}

TEST(CudaOps, RmsNormMatchesTheCpu) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (int64_t d : {1, 7, 256, 1000, 7168}) {
    const int64_t rows = 5;
    const std::vector<float> x = random_rows(rows, d, uint32_t(d)), wt = random_rows(1, d, uint32_t(d + 1));
    std::vector<float> want(x.size()), got(x.size());
    ops::rms_norm(x.data(), rows, d, wt.data(), 1e-6f, want.data());
    cuda::DeviceBuffer dx(x.size() * 4), dw(wt.size() * 4), dy(x.size() * 4);
    dx.upload(x.data(), x.size() * 4);
    dw.upload(wt.data(), wt.size() * 4);
    cuda::rms_norm(dx.f32(), rows, d, dw.f32(), 1e-6f, dy.f32());
    cuda::synchronize();
    dy.download(got.data(), got.size() * 4);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * std::fabs(want[i]) + 1e-6f) << "d=" << d << " element " << i;
  }
}

TEST(CudaOps, RefusesWhatTheKernelsDoNotTake) {
  NEXTN_SKIP_WITHOUT_CUDA();
  HostWeight h = make_weight(DType::BF16, DType::F32, 4, 4, 4, false, 7);
  h.w.dtype = DType::F16;
  EXPECT_THROW(cuda::upload(h.w), Error);
  h.w.dtype = DType::BF16;
  h.w.row_stride = 2;  // shorter than a row
  EXPECT_THROW(cuda::upload(h.w), Error);
}

TEST(CudaOps, SaysWhyWhenUnavailable) {
  std::string why;
  if (cuda::available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(why.empty());
#if !NEXTN_WITH_CUDA
  EXPECT_THROW(cuda::synchronize(), Error);
#endif
}

}  // namespace
}  // namespace nextn
