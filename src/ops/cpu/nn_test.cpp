// The per-row SIMD kernels (nn_hwy.cpp) on every target this CPU runs, against double-precision
// references, and their invariances: a key's indexer score does not depend on which keys share the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ops/cpu/target_testing.h"
#include "ops/ops.h"

namespace nextn {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// |got - want| <= tol · max(1, |want|) element-wise.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), tol * std::max(1.0, std::abs(want[i]))) << what << " at " << i;
}

std::string name(int64_t target) { return hwy::TargetName(target); }

// Head counts and dims that are and are not multiples of the vector widths; key counts with short groups.
TEST(NnKernels, IndexerScoresMatchReferenceOnEveryTarget) {
  struct Shape { int64_t heads, dim, n; };
  for (const Shape sh : {Shape{16, 32, 37}, Shape{64, 128, 9}, Shape{5, 20, 1}, Shape{17, 7, 130}}) {
    const std::vector<float> q = randn(sh.heads * sh.dim, 1), keys = randn(sh.n * sh.dim, 2), w = randn(sh.heads, 3);
    std::vector<double> want(sh.n);
    for (int64_t j = 0; j < sh.n; ++j)
      for (int64_t h = 0; h < sh.heads; ++h) {
        double dot = 0;
        for (int64_t k = 0; k < sh.dim; ++k) dot += double(q[h * sh.dim + k]) * keys[j * sh.dim + k];
        want[j] += w[h] * std::max(dot, 0.0);
      }
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      const std::string what = name(target) + " heads " + std::to_string(sh.heads) + " dim " + std::to_string(sh.dim);
      std::vector<float> all(sh.n);
      ops::indexer_scores(q.data(), w.data(), sh.heads, sh.dim, keys.data(), sh.n, all.data());
      expect_close(all, want, 1e-4, what);
      // Any split of the keys gives the same bits (the attention splits them over threads).
      for (int64_t cut : {int64_t(1), int64_t(3), sh.n / 2}) {
        if (cut <= 0 || cut >= sh.n) continue;
        std::vector<float> parts(sh.n);
        ops::indexer_scores(q.data(), w.data(), sh.heads, sh.dim, keys.data(), cut, parts.data());
        ops::indexer_scores(q.data(), w.data(), sh.heads, sh.dim, keys.data() + cut * sh.dim, sh.n - cut,
                            parts.data() + cut);
        for (int64_t j = 0; j < sh.n; ++j)
          ASSERT_EQ(parts[j], all[j]) << what << " cut " << cut << " key " << j << std::hexfloat << " " << parts[j] << " " << all[j];
      }
    }
  }
}

TEST(NnKernels, SoftmaxWithSinkMatchesReferenceOnEveryTarget) {
  for (int64_t n : {int64_t(1), int64_t(16), int64_t(37), int64_t(128)}) {
    for (float sink : {-3.0f, 0.5f, 40.0f}) {
      const std::vector<float> x = randn(n, 7 + uint32_t(n), 4.0f);
      const float scale = 0.125f;
      double m = sink;
      for (float v : x) m = std::max(m, double(v) * scale);
      double z = std::exp(sink - m);
      for (float v : x) z += std::exp(double(v) * scale - m);
      std::vector<double> want(n);
      for (int64_t j = 0; j < n; ++j) want[j] = std::exp(double(x[j]) * scale - m) / z;
      for (int64_t target : kernel_targets()) {
        ForceTarget force(target);
        std::vector<float> got = x;
        ops::softmax_with_sink(got.data(), n, scale, sink);
        expect_close(got, want, 1e-5, name(target) + " n " + std::to_string(n) + " sink " + std::to_string(sink));
      }
    }
  }
}

// The sampler's softmax pieces: exp(scale · x - shift) within 1e-6 of the exact exp of the float argument,
// masked (-inf) entries giving 0, the sum of what was written (in double), the maximum exact;
// lengths around the vector widths.
TEST(NnKernels, ExpScaledSumAndMaxValueMatchReferenceOnEveryTarget) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(16), int64_t(37), int64_t(4099)}) {
    std::vector<float> x = randn(size_t(n), 11 + uint32_t(n), 5.0f);
    if (n > 3) x[2] = -INFINITY;
    const float scale = 1.25f, mx = *std::max_element(x.begin(), x.end()), shift = mx * scale;
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      const std::string what = name(target) + " n " + std::to_string(n);
      EXPECT_EQ(ops::max_value(x.data(), n), mx) << what;
      std::vector<float> got(size_t(n), -1.0f);
      const double sum = ops::exp_scaled_sum(x.data(), n, scale, shift, got.data());
      double added = 0;
      for (int64_t j = 0; j < n; ++j) {
        volatile float scaled = x[j] * scale;  // (the argument as the kernel rounds it: no fused multiply-add)
        const float arg = scaled - shift;
        const double want = std::exp(double(arg));
        ASSERT_NEAR(got[j], want, 1e-6 * want + 1e-38) << what << " at " << j;
        added += got[j];
      }
      EXPECT_NEAR(sum, added, 1e-12 * added) << what;
      EXPECT_NEAR(ops::sum_as_double(got.data(), n), added, 1e-12 * added) << what;
      if (n > 3) {
        EXPECT_EQ(got[2], 0.0f) << what;
      }
    }
  }
  EXPECT_EQ(ops::max_value(nullptr, 0), -INFINITY);
  EXPECT_EQ(ops::sum_as_double(nullptr, 0), 0.0);
}

TEST(NnKernels, WeightedRowSumMatchesReferenceOnEveryTarget) {
  for (int64_t dim : {int64_t(64), int64_t(512), int64_t(19)}) {
    const int64_t n = 45, stride = dim + 16;
    const std::vector<float> p = randn(n, 11), rows = randn(n * stride, 12);
    std::vector<double> want(dim);
    for (int64_t i = 0; i < dim; ++i)
      for (int64_t j = 0; j < n; ++j) want[i] += double(p[j]) * rows[j * stride + i];
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      std::vector<float> got(dim);
      ops::weighted_row_sum(p.data(), rows.data(), n, dim, stride, got.data());
      expect_close(got, want, 1e-5, name(target) + " dim " + std::to_string(dim));
    }
  }
}

TEST(NnKernels, ActivationsMatchReferenceOnEveryTarget) {
  const int64_t n = 45;  // a tail on every target
  const std::vector<float> g = randn(n, 21, 6.0f), u = randn(n, 22, 6.0f);
  for (float limit : {0.0f, 4.0f}) {
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) {
      double gi = g[i], ui = u[i];
      if (limit > 0) {
        gi = std::min<double>(gi, limit);
        ui = std::clamp<double>(ui, -limit, limit);
      }
      want[i] = gi / (1 + std::exp(-gi)) * ui;
    }
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      std::vector<float> got(n);
      ops::swiglu(g.data(), u.data(), n, limit, got.data());
      expect_close(got, want, 1e-5, name(target) + " swiglu limit " + std::to_string(limit));
    }
  }
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = u[i] / (1 + std::exp(-double(g[i])));
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    std::vector<float> got(n);
    ops::mul_sigmoid(u.data(), g.data(), n, got.data());
    expect_close(got, want, 1e-5, name(target) + " mul_sigmoid");
  }
}

// The gated delta rule's step against a double-precision reference, for value widths with and without a
// vector tail; a value column's result is the same whether its neighbours are computed or not.
TEST(NnKernels, GatedDeltaStepMatchesReferenceOnEveryTarget) {
  const int64_t dk = 24;
  for (int64_t dv : {int64_t(32), int64_t(19), int64_t(128)}) {
    const std::vector<float> s0 = randn(dk * dv, 31, 0.5f), q = randn(dk, 32), k = randn(dk, 33), v = randn(dv, 34);
    const float decay = 0.93f, beta = 0.61f;
    std::vector<double> ws(s0.begin(), s0.end()), want_o(dv, 0.0), u(dv, 0.0);
    for (double& x : ws) x *= decay;
    for (int64_t e = 0; e < dv; ++e) {
      for (int64_t a = 0; a < dk; ++a) u[e] += ws[a * dv + e] * k[a];
      u[e] = beta * (v[e] - u[e]);
    }
    for (int64_t a = 0; a < dk; ++a)
      for (int64_t e = 0; e < dv; ++e) ws[a * dv + e] += double(k[a]) * u[e];
    for (int64_t a = 0; a < dk; ++a)
      for (int64_t e = 0; e < dv; ++e) want_o[e] += ws[a * dv + e] * q[a];
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      std::vector<float> st = s0, o(dv);
      ops::gated_delta_step(st.data(), dk, dv, q.data(), k.data(), v.data(), decay, beta, o.data());
      const std::string what = name(target) + " dv " + std::to_string(dv);
      expect_close(o, want_o, 1e-5, what + " output");
      expect_close(st, ws, 1e-5, what + " state");
      if (dv != 32) continue;
      // The first 19 columns alone (a narrower state with the same rows) give the same bits.
      std::vector<float> narrow(dk * 19), o19(19);
      for (int64_t a = 0; a < dk; ++a) std::copy_n(s0.data() + a * dv, 19, narrow.data() + a * 19);
      ops::gated_delta_step(narrow.data(), dk, 19, q.data(), k.data(), v.data(), decay, beta, o19.data());
      for (int64_t e = 0; e < 19; ++e) ASSERT_EQ(o19[e], o[e]) << what << " column " << e;
    }
  }
}

// Scores over selected rows read in place: bit-identical to ops::matmul over the same rows gathered (the
// attention used to gather them), and the indexed value sum to the plain one over gathered rows.
TEST(NnKernels, GatheredDotsEqualMatmulOverGatheredRows) {
  for (int64_t dim : {int64_t(80), int64_t(64), int64_t(19), int64_t(576)}) {
    const int64_t stride = dim + 7, total = 50, n = 23;
    const std::vector<float> rows = randn(total * stride, 41), q = randn(9 * dim, 42), p = randn(n, 43);
    std::vector<int32_t> idx(n);
    for (int64_t j = 0; j < n; ++j) idx[j] = static_cast<int32_t>((j * 17 + 3) % total);
    std::vector<float> gathered(n * dim);
    for (int64_t j = 0; j < n; ++j) std::copy_n(rows.data() + idx[j] * stride, dim, gathered.data() + j * dim);
    Linear w;
    w.dtype = DType::F32;
    w.out = n;
    w.in = dim;
    w.row_stride = dim;
    w.data = gathered.data();
    for (int64_t target : kernel_targets()) {
      ForceTarget force(target);
      for (int64_t heads : {int64_t(1), int64_t(4), int64_t(9)}) {
        std::vector<float> want(heads * n), got(heads * n);
        ops::matmul(nullptr, q.data(), heads, w, want.data());
        ops::gathered_dots(q.data(), heads, dim, rows.data(), stride, idx.data(), n, dim, got.data(), n);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << name(target) << " dim " << dim << " heads " << heads;
      }
      std::vector<float> want(dim), got(dim);
      ops::weighted_row_sum(p.data(), gathered.data(), n, dim, dim, want.data());
      ops::weighted_row_sum(p.data(), rows.data(), n, dim, stride, got.data(), idx.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << name(target) << " dim " << dim;
    }
  }
}

// The k largest of x (ties: lower index first), ascending, on every target: against a stable sort, with
// many ties, -inf entries (the router's group masking), -0 next to +0 (equal), all-equal rows, scores of
// both signs over a wide range, and k at and around n.
TEST(NnKernels, TopkAscendingMatchesStableSortOnEveryTarget) {
  for (int64_t target : kernel_targets()) {
    ForceTarget force(target);
    std::mt19937 rng(31);
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % (trial % 3 == 0 ? 3000 : 300));
      std::vector<float> x(n);
      const int kind = trial % 4;
      for (float& v : x) {
        const uint32_t r = rng() % 10;
        if (kind == 0)  // few distinct values
          v = r == 0 ? -INFINITY : static_cast<float>(static_cast<int>(rng() % 7) - 3);
        else if (kind == 1)  // signed zeros among a few values
          v = r < 4 ? (r % 2 ? -0.0f : 0.0f) : static_cast<float>(static_cast<int>(rng() % 5) - 2) * 0.5f;
        else if (kind == 2)  // wide range, both signs
          v = std::ldexp(static_cast<float>(rng() % 1000) - 500.0f, static_cast<int>(rng() % 40) - 20);
        else
          v = 1.25f;  // all equal
      }
      for (int64_t k : {int64_t(1), int64_t(2), n / 2, n - 1, n, n + 3, int64_t(128)}) {
        if (k < 1) continue;
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
        const int64_t want_n = std::min(k, n);
        std::vector<int32_t> want(order.begin(), order.begin() + want_n);
        std::sort(want.begin(), want.end());
        std::vector<int32_t> got(n);
        std::vector<float> scratch(n);
        ASSERT_EQ(ops::topk_ascending(x.data(), n, k, got.data(), scratch.data()), want_n) << name(target);
        got.resize(want_n);
        ASSERT_EQ(got, want) << name(target) << " kind " << kind << " n " << n << " k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace nextn
