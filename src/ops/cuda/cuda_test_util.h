// What the CUDA tests share: a test without a usable device reports itself skipped, saying why; random
// weights laid out as a checkpoint stores them.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

#define NEXTN_SKIP_WITHOUT_CUDA()                                          \
  do {                                                                     \
    std::string why_no_cuda;                                               \
    if (!::nextn::cuda::available(&why_no_cuda)) GTEST_SKIP() << "CUDA: " << why_no_cuda; \
  } while (0)

namespace nextn::cuda_test {

// n normal(0, sd) floats from a fixed seed.
inline std::vector<float> normal(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), b.bytes());
  return b;
}

template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer& b, size_t n) {
  cuda::synchronize();
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T));
  return v;
}

inline bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// Puts cuda::branches_on() back as it was when the test ends (tests that switch it).
struct BranchesRestored {
  const bool was = cuda::branches_on();
  ~BranchesRestored() { cuda::set_branches(was); }
};

// Kernel branches change when kernels run, never a value: `forwards()` (a fresh model's forwards, returning
// their outputs) gives the same bits with branches off and on.
template <class Forwards>
void expect_branches_change_no_bit(Forwards forwards) {
  const BranchesRestored restore;
  std::vector<std::vector<float>> out[2];
  for (int on = 0; on < 2; ++on) {
    cuda::set_branches(on == 1);
    out[on] = forwards();
  }
  ASSERT_EQ(out[0].size(), out[1].size());
  for (size_t i = 0; i < out[0].size(); ++i) EXPECT_TRUE(same_bits(out[0][i], out[1][i])) << "output " << i;
}

// |got - want| <= tol · (1 + |want|) for every element (relative for large values, absolute near zero). NaN fails.
inline ::testing::AssertionResult near_all(const float* got, const float* want, size_t n, double tol) {
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (!(std::fabs(g - w) <= tol * (1 + std::fabs(w))))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

// A random weight as a checkpoint stores it, with the bytes it points into.
struct HostWeight {
  Linear w;
  std::vector<unsigned char> data, scale;
  std::vector<float> bias;
};

inline uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    const uint8_t v = uint8_t(rng());
    if ((v & 0x7f) != 0x7f) return v;  // (not NaN)
  }
}

inline HostWeight make_weight(DType dtype, DType scale_dtype, int64_t out, int64_t in, int64_t row_stride, bool bias,
                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  HostWeight h;
  Linear& w = h.w;
  w.dtype = dtype;
  w.out = out;
  w.in = in;
  w.row_stride = row_stride;
  const int64_t n = (out - 1) * row_stride + in;
  h.data.resize(size_t(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::F32) {
      const float v = g(rng) * 0.05f;
      std::memcpy(&h.data[size_t(i) * 4], &v, 4);
    } else if (dtype == DType::BF16) {
      const uint16_t v = f32_to_bf16(g(rng) * 0.05f);
      std::memcpy(&h.data[size_t(i) * 2], &v, 2);
    } else {
      h.data[size_t(i)] = random_e4m3(rng);
    }
  }
  w.data = h.data.data();
  if (dtype == DType::F8_E4M3) {
    w.scale_dtype = scale_dtype;
    w.block_out = w.block_in = 128;
    w.scale_cols = (in + 127) / 128;
    const int64_t rows = (out + 127) / 128, count = rows * w.scale_cols;
    h.scale.resize(size_t(count) * dtype_size(scale_dtype));
    std::uniform_real_distribution<float> u(0.5f, 2.f);
    for (int64_t i = 0; i < count; ++i) {
      const float s = u(rng) * (1.f / 256.f);
      if (scale_dtype == DType::F32) {
        std::memcpy(&h.scale[size_t(i) * 4], &s, 4);
      } else if (scale_dtype == DType::BF16) {
        const uint16_t b = f32_to_bf16(s);
        std::memcpy(&h.scale[size_t(i) * 2], &b, 2);
      } else {
        h.scale[size_t(i)] = uint8_t(127 - 8 - int(rng() % 3));  // 2^-8 .. 2^-10
      }
    }
    w.scale = h.scale.data();
  }
  if (bias) {
    h.bias.resize(size_t(out));
    for (float& b : h.bias) b = g(rng);
    w.bias = h.bias.data();
  }
  return h;
}

}  // namespace nextn::cuda_test
