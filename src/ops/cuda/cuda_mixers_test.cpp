// Qwen4-Exp's small CUDA ops of cuda_nn.h (fill_zero, map, scale_rows_sigmoid, rms_norm_groups, stream_mean,
// stream_gates, moe_route_softmax) against host references written as models/qwen4_exp/cpu_blocks.cpp computes
// them (gated_residual, ple, moe): values within 1e-5 relative (1e-6 for the elementwise maps), routing ids
// exact, ties included, and a row's bits the same in a one-row call and in a batch. Without a usable device
// every test reports itself skipped, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/ops.h"

namespace nextn {
namespace {

using namespace cuda_test;

// |got - want| <= tol · (1 + |want|) for every element: relative for large values, absolute near zero (where a
// relative bound would ask for more than fp32 sums in another order can give). NaN fails.
float silu(float x) { return x / (1.0f + std::exp(-x)); }

// fill_zero clears exactly its bytes: what lies before and after them keeps its bytes (a byte count that is
// not a whole number of floats too: the declaration takes bytes).
TEST(CudaMixers, FillZeroClearsExactlyItsBytes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  struct Case {
    size_t offset, bytes;
  };
  for (const Case& c : {Case{0, 4096}, Case{8, 1000}, Case{12, 1002}, Case{4, 4}}) {
    const size_t total = 4096 + 64;
    const std::vector<unsigned char> init(total, 0xab);
    const auto d = to_device(init);
    cuda::fill_zero(static_cast<unsigned char*>(d.get()) + c.offset, c.bytes);
    const auto got = to_host<unsigned char>(d, total);
    for (size_t i = 0; i < total; ++i) {
      const unsigned char want = i >= c.offset && i < c.offset + c.bytes ? 0 : 0xab;
      ASSERT_EQ(got[i], want) << "offset " << c.offset << " bytes " << c.bytes << " byte " << i;
    }
  }
}

// The gated residual's gates: silu(x / C) on the low-rank mix, 2 · sigmoid(x / C) on the injection, as
// cpu_blocks.cpp's gated_residual writes them; lengths past one block and not a multiple of it.
TEST(CudaMixers, MapGivesTheGatedResidualsGates) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 257, 5000}) {
    for (float d : {3.f, 4.f}) {
      const auto x = normal(size_t(n), uint32_t(7 + n), 4.f);
      for (cuda::Map f : {cuda::Map::kSiluOf, cuda::Map::kTwoSigmoidOf}) {
        const auto dx = to_device(x);
        cuda::map(dx.f32(), n, f, d);
        const auto got = to_host<float>(dx, size_t(n));
        std::vector<float> want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          want[size_t(i)] = f == cuda::Map::kSiluOf ? silu(x[size_t(i)] / d) : 2.0f * ops::sigmoid(x[size_t(i)] / d);
        EXPECT_TRUE(near_all(got.data(), want.data(), size_t(n), 1e-6))
            << (f == cuda::Map::kSiluOf ? "silu" : "2 sigmoid") << " n " << n << " d " << d;
      }
    }
  }
}

// A gated shared expert: each row times the sigmoid of its own gate.
TEST(CudaMixers, ScaleRowsSigmoidGatesEachRowByItsOwnGate) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (int64_t rows : {1, 5, 33}) {
    for (int64_t d : {64, 300, 2048}) {
      const auto x = normal(size_t(rows * d), uint32_t(rows + d)), g = normal(size_t(rows), uint32_t(rows), 3.f);
      const auto dx = to_device(x), dg = to_device(g);
      cuda::scale_rows_sigmoid(dx.f32(), dg.f32(), rows, d);
      const auto got = to_host<float>(dx, x.size());
      std::vector<float> want(x.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < d; ++i) want[size_t(r * d + i)] = ops::sigmoid(g[size_t(r)]) * x[size_t(r * d + i)];
      EXPECT_TRUE(near_all(got.data(), want.data(), want.size(), 1e-6)) << "rows " << rows << " d " << d;
    }
  }
}

// Per-stream RMSNorm (grouped_norm of cpu_blocks.cpp): each group with its slice of the weights (or, with a
// weight stride of 0, all with the same), groups with gaps between them and rows with padding after them (the
// gaps and padding keep their bits), groups narrower and wider than a block's 1024 elements; in place the same
// bits as out of place.
TEST(CudaMixers, RmsNormGroupsNormsEachGroupWithItsOwnWeights) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const float eps = 1e-6f;
  for (int64_t rows : {1, 4, 7}) {
    for (int64_t groups : {1, 4}) {
      for (int64_t d : {64, 2048, 4100}) {
        for (int64_t ws : {d, int64_t(0)}) {
          const int64_t gs = d + 3, rs = groups * gs + 5;  // (gaps of 3 floats after a group, 5 after a row)
          const auto x = normal(size_t(rows * rs), uint32_t(rows * 31 + d), 2.f);
          const auto w = normal(size_t((groups - 1) * ws + d), uint32_t(groups + d));
          const auto out0 = normal(size_t(rows * rs), 99);  // (what the output held: its gaps must keep it)
          const auto dx = to_device(x), dw = to_device(w);
          auto dout = to_device(out0);
          cuda::rms_norm_groups(dx.f32(), rows, groups, d, rs, gs, dw.f32(), ws, eps, dout.f32());
          const auto got = to_host<float>(dout, out0.size());
          std::vector<float> want = out0;
          for (int64_t g = 0; g < groups; ++g)
            ops::rms_norm(x.data() + g * gs, rows, d, w.data() + g * ws, eps, want.data() + g * gs, rs, rs);
          const std::string at = "rows " + std::to_string(rows) + " groups " + std::to_string(groups) + " d " +
                                 std::to_string(d) + " weight stride " + std::to_string(ws);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t g = 0; g < groups; ++g) {
              const int64_t o = r * rs + g * gs;
              const int64_t gap = g + 1 < groups ? gs - d : rs - g * gs - d;  // (to the next group or row)
              EXPECT_TRUE(near_all(got.data() + o, want.data() + o, size_t(d), 1e-5))
                  << at << " row " << r << " group " << g;
              EXPECT_TRUE(same_bits(got.data() + o + d, out0.data() + o + d, size_t(gap)))
                  << at << " row " << r << " group " << g << ": the gap after the group was written";
            }
          // in place (out = x)
          auto dy = to_device(x);
          cuda::rms_norm_groups(dy.f32(), rows, groups, d, rs, gs, dw.f32(), ws, eps, dy.f32());
          const auto in_place = to_host<float>(dy, x.size());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t g = 0; g < groups; ++g) {
              const int64_t o = r * rs + g * gs;
              EXPECT_TRUE(same_bits(in_place.data() + o, got.data() + o, size_t(d)))
                  << at << " row " << r << " group " << g << ": in place differs from out of place";
            }
        }
      }
    }
  }
}

// The header reads "rms_norm_rows of each of `groups` groups": each group gets the bits rms_norm_rows gives it
// when called on that group alone (so a model may switch between the two without a row changing).
TEST(CudaMixers, RmsNormGroupsGivesEachGroupTheBitsOfRmsNormRows) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const float eps = 1e-6f;
  const int64_t rows = 3, groups = 4;
  for (int64_t d : {64, 2048, 4100}) {
    const int64_t rs = groups * d;
    const auto dx = to_device(normal(size_t(rows * rs), uint32_t(d), 2.f));
    const auto dw = to_device(normal(size_t(groups * d), uint32_t(d + 1)));
    cuda::DeviceBuffer a(size_t(rows * rs) * 4), b(size_t(rows * rs) * 4);
    cuda::rms_norm_groups(dx.f32(), rows, groups, d, rs, d, dw.f32(), d, eps, a.f32());
    for (int64_t g = 0; g < groups; ++g)
      cuda::rms_norm_rows(dx.f32() + g * d, rows, d, rs, dw.f32() + g * d, eps, b.f32() + g * d, rs);
    const auto ga = to_host<float>(a, size_t(rows * rs)), gb = to_host<float>(b, size_t(rows * rs));
    EXPECT_TRUE(same_bits(ga.data(), gb.data(), ga.size())) << "d " << d;
  }
}

// The mean over the streams of cpu_blocks.cpp's gated_residual: Σ_c in stream order, then / C.
TEST(CudaMixers, StreamMeanAveragesTheStreamsInOrder) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (int64_t rows : {1, 4, 9}) {
    for (int64_t C : {1, 3, 4}) {
      for (int64_t H : {64, 300, 2048}) {
        const auto w = normal(size_t(rows * C * H), uint32_t(rows * 7 + C * 3 + H));
        const auto dw = to_device(w);
        cuda::DeviceBuffer dx(size_t(rows * H) * 4);
        cuda::stream_mean(dw.f32(), rows, C, H, dx.f32());
        const auto got = to_host<float>(dx, size_t(rows * H));
        std::vector<float> want(size_t(rows * H));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t h = 0; h < H; ++h) {
            float acc = 0;
            for (int64_t c = 0; c < C; ++c) acc += w[size_t((r * C + c) * H + h)];
            want[size_t(r * H + h)] = acc / static_cast<float>(C);
          }
        EXPECT_TRUE(near_all(got.data(), want.data(), want.size(), 1e-6))
            << "rows " << rows << " C " << C << " H " << H;
      }
    }
  }
}

// PLE's stream gates as cpu_blocks.cpp's ple computes them. The gate's √|g| is steep near g = 0, so each value's
// bound follows from its g: g may be off by 1e-6 of Σ|key·query| / √H (another summation order), which moves
// √max(|g|, 1e-6) by at most the difference of the roots at the ends of that interval, and the sigmoid by a
// quarter of that (or, where g's sign may flip, by the whole jump between sigmoid(±√(|g| + err))). Rows with a
// zero key (gate exactly 1/2) and with |g| under the 1e-6 floor are among them. A row's bits are those it gets
// in a one-row call.
TEST(CudaMixers, StreamGatesMatchThePleGates) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (int64_t rows : {1, 4, 9}) {
    for (int64_t C : {1, 4}) {
      for (int64_t H : {64, 300, 2048}) {
        auto key = normal(size_t(rows * C * H), uint32_t(rows + C + H)), query = normal(key.size(), uint32_t(H));
        const auto value = normal(size_t(rows * H), uint32_t(rows * H));
        if (rows > 1) std::fill(key.begin() + C * H, key.begin() + 2 * C * H, 0.0f);  // row 1: g = 0
        if (rows > 2) {  // row 2, stream 0: one product of 1e-7 · √H, g = 1e-7 (under the floor)
          std::fill(key.begin() + 2 * C * H, key.begin() + 2 * C * H + H, 0.0f);
          std::fill(query.begin() + 2 * C * H, query.begin() + 2 * C * H + H, 0.0f);
          key[size_t(2 * C * H)] = 1e-7f * std::sqrt(float(H));
          query[size_t(2 * C * H)] = 1.0f;
        }
        const auto dk = to_device(key), dq = to_device(query), dv = to_device(value);
        cuda::DeviceBuffer dout(size_t(rows * C * H) * 4);
        cuda::stream_gates(dk.f32(), dq.f32(), dv.f32(), rows, C, H, dout.f32());
        const auto got = to_host<float>(dout, size_t(rows * C * H));
        const std::string at = "rows " + std::to_string(rows) + " C " + std::to_string(C) + " H " + std::to_string(H);
        const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const float* kk = key.data() + (r * C + c) * H;
            const float* qq = query.data() + (r * C + c) * H;
            float gdot = 0;
            double abs_sum = 0;
            for (int64_t h = 0; h < H; ++h) gdot += kk[h] * qq[h], abs_sum += std::fabs(double(kk[h]) * qq[h]);
            gdot *= inv_sqrt_h;
            const float mag = std::sqrt(std::max(std::fabs(gdot), 1e-6f));
            const float gate = ops::sigmoid(gdot > 0 ? mag : gdot < 0 ? -mag : 0.0f);
            const double err_g = 1e-6 * abs_sum * inv_sqrt_h + 1e-12;
            const double hi = std::sqrt(std::max(std::fabs(double(gdot)) + err_g, 1e-6));
            const double lo_g = std::fabs(double(gdot)) - err_g;
            const double gate_err = lo_g <= 0 ? 0.5 * hi : 0.25 * (hi - std::sqrt(std::max(lo_g, 1e-6)));
            for (int64_t h = 0; h < H; ++h) {
              const float want = gate * value[size_t(r * H + h)];
              const float g = got[size_t((r * C + c) * H + h)];
              const double tol = std::fabs(value[size_t(r * H + h)]) * gate_err + 1e-6 * (1 + std::fabs(want));
              ASSERT_NEAR(g, want, tol) << at << " row " << r << " stream " << c << " h " << h << " g " << gdot;
            }
          }
        if (rows > 1) {  // row 1: gate exactly sigmoid(0) = 1/2
          for (int64_t i = 0; i < C * H; ++i)
            ASSERT_EQ(got[size_t(C * H + i)], 0.5f * value[size_t(H + i % H)]) << at << " zero key, element " << i;
        }
        // each row alone
        for (int64_t r = 0; r < rows; ++r) {
          cuda::DeviceBuffer one(size_t(C * H) * 4);
          cuda::stream_gates(dk.f32() + r * C * H, dq.f32() + r * C * H, dv.f32() + r * H, 1, C, H, one.f32());
          EXPECT_TRUE(same_bits(to_host<float>(one, size_t(C * H)).data(), got.data() + r * C * H, size_t(C * H)))
              << at << " row " << r << " alone";
        }
      }
    }
  }
}

// Qwen4-Exp's router (cpu_blocks.cpp's moe): softmax over the experts, the k largest probabilities (ties: the
// lower expert) ascending, weights renormalized in expert order when norm_topk_prob. Half the tokens' logits
// are multiples of 1/8 with many exact ties (equal logits give equal probabilities on both sides, and distinct
// ones differ far beyond rounding); the others normal. Ids exactly the host's, weights within 1e-5 relative, a
// token's bits those of a one-token call.
TEST(CudaMixers, MoeRouteSoftmaxPicksTheHostsExpertsTiesIncluded) {
  NEXTN_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(17);
  std::normal_distribution<float> gauss(0.f, 2.f);
  struct Case {
    int64_t E, k;
  };
  for (const Case& cs : {Case{8, 1}, Case{8, 2}, Case{64, 8}, Case{300, 10}, Case{512, 10}, Case{16, 16}}) {
    for (int64_t S : {1, 4, 37}) {
      for (bool norm : {false, true}) {
        const int64_t E = cs.E, k = cs.k;
        std::vector<float> logits(size_t(S * E));
        for (int64_t t = 0; t < S; ++t)
          for (int64_t e = 0; e < E; ++e)
            logits[size_t(t * E + e)] = t % 2 == 0 ? float(int(rng() % 24)) * 0.125f - 1.5f : gauss(rng);
        const auto dl = to_device(logits);
        cuda::DeviceBuffer dids(size_t(S * k) * 4), dw(size_t(S * k) * 4);
        cuda::moe_route_softmax(dl.f32(), S, E, k, norm, static_cast<int32_t*>(dids.get()), dw.f32());
        const auto ids = to_host<int32_t>(dids, size_t(S * k));
        const auto wts = to_host<float>(dw, size_t(S * k));
        const std::string at = "E " + std::to_string(E) + " k " + std::to_string(k) + " S " + std::to_string(S) +
                               (norm ? " norm" : "");
        std::vector<float> p(static_cast<size_t>(E)), tmp(static_cast<size_t>(E));
        std::vector<int32_t> want_ids(static_cast<size_t>(k));
        for (int64_t t = 0; t < S; ++t) {
          std::copy(logits.begin() + t * E, logits.begin() + (t + 1) * E, p.begin());
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t e = 0; e < E; ++e) m = std::max(m, p[size_t(e)]);
          float sum = 0;
          for (int64_t e = 0; e < E; ++e) p[size_t(e)] = std::exp(p[size_t(e)] - m), sum += p[size_t(e)];
          const float inv = 1.0f / sum;
          for (int64_t e = 0; e < E; ++e) p[size_t(e)] *= inv;
          ASSERT_EQ(ops::topk_ascending(p.data(), E, k, want_ids.data(), tmp.data()), k);
          float kept = 0;
          for (int64_t j = 0; j < k; ++j) kept += p[size_t(want_ids[size_t(j)])];
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(ids[size_t(t * k + j)], want_ids[size_t(j)]) << at << " token " << t << " choice " << j;
            const float pw = p[size_t(want_ids[size_t(j)])];
            const float want = norm ? pw / kept : pw;
            ASSERT_NEAR(wts[size_t(t * k + j)], want, 1e-5 * std::fabs(want))
                << at << " token " << t << " choice " << j;
          }
        }
        if (S == 1) continue;
        for (int64_t t : {int64_t(0), S / 2, S - 1}) {  // one token alone
          cuda::DeviceBuffer one_ids(size_t(k) * 4), one_w(size_t(k) * 4);
          cuda::moe_route_softmax(dl.f32() + t * E, 1, E, k, norm, static_cast<int32_t*>(one_ids.get()), one_w.f32());
          EXPECT_EQ(std::memcmp(to_host<int32_t>(one_ids, size_t(k)).data(), ids.data() + t * k, size_t(k) * 4), 0)
              << at << " token " << t << " alone";
          EXPECT_TRUE(same_bits(to_host<float>(one_w, size_t(k)).data(), wts.data() + t * k, size_t(k)))
              << at << " token " << t << " alone";
        }
      }
    }
  }
}

}  // namespace
}  // namespace nextn
