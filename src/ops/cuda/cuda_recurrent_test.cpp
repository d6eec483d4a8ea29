// The recurrent layers' CUDA ops (cuda_recurrent.h: causal_conv_rows, gated_delta_rule) against host references
// written as models/qwen4_exp/cpu_blocks.cpp computes gdn and ple: each span's rows in order from the state in the
// slot of its first position, the state after each of its last `slots` rows written to the slot of that length
// and every other float of every slot left as it was. Spans of 1 row (decode), 4 (a verify), 23 (a prefill
// longer than the slots), mixed in one forward, with 1, 4 and 9 slots; each span run alone gives its rows and
// slots the bits the mixed forward gave them. Without a usable device every test reports itself skipped.
//
// Tolerances: conv outputs within 1e-5 · (1 + |want|); the conv windows written to the slots are copies, so
// bit for bit; the delta rule's outputs and states within 1e-5 · (1 + |want|) for spans of up to 4 rows and
// 1e-4 · (1 + |want|) for longer ones (the state carries each step's rounding into the next).
#include "ops/cuda/cuda_recurrent.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

struct SpanSpec {
  int64_t rows, pos0;
};

// A forward's spans on the device: each span's slots its own allocation (a sequence's), filled with random
// floats before the call; the rows contiguous, in span order. Every float of every slot is random, so a read
// of the wrong slot changes the outputs, and a write anywhere the op should not write is seen.
struct Spans {
  std::vector<SpanSpec> spec;
  int64_t slots, slot_floats, total_rows = 0;
  std::vector<int32_t> first_row;
  std::vector<std::vector<float>> before;  // each span's [slots, slot_floats] before the call
  std::vector<cuda::DeviceBuffer> state;
  cuda::DeviceBuffer dptrs, dfirst, drows, dpos0;
  cuda::RecurrentSpans rs;

  Spans(std::vector<SpanSpec> spans, int64_t n_slots, int64_t floats, std::vector<std::vector<float>> initial)
      : spec(std::move(spans)), slots(n_slots), slot_floats(floats), before(std::move(initial)) {
    std::vector<float*> ptrs;
    std::vector<int32_t> rows, pos0;
    for (size_t s = 0; s < spec.size(); ++s) {
      first_row.push_back(int32_t(total_rows));
      rows.push_back(int32_t(spec[s].rows));
      pos0.push_back(int32_t(spec[s].pos0));
      total_rows += spec[s].rows;
      state.push_back(to_device(before[s]));
      ptrs.push_back(state.back().f32());
    }
    dptrs = to_device(ptrs);
    dfirst = to_device(first_row);
    drows = to_device(rows);
    dpos0 = to_device(pos0);
    rs.state = static_cast<float* const*>(dptrs.get());
    rs.first_row = static_cast<const int32_t*>(dfirst.get());
    rs.rows = static_cast<const int32_t*>(drows.get());
    rs.pos0 = static_cast<const int32_t*>(dpos0.get());
    rs.count = int64_t(spec.size());
    rs.slots = slots;
    rs.slot_floats = slot_floats;
  }
  std::vector<float> after(size_t s) const { return to_host<float>(state[s], before[s].size()); }
};

// Whether a span writes the slot of length len: one of its last `slots` lengths.
bool writes(const SpanSpec& sp, int64_t len, int64_t slots) { return len > sp.pos0 + sp.rows - slots; }

std::vector<std::vector<float>> random_slots(size_t spans, int64_t slots, int64_t slot_floats, uint32_t seed,
                                             float sd) {
  std::vector<std::vector<float>> v;
  for (size_t s = 0; s < spans; ++s) v.push_back(normal(size_t(slots * slot_floats), seed + uint32_t(s) * 101, sd));
  return v;
}

// The forwards every test runs, each with 1, 4 and 9 slots: a decode row, a verify of 4 rows, a prefill of 23
// (past 9 slots: the start slot is overwritten by the span's own rows before its last row), and others of 2, 9
// and 5 rows, all in one forward; positions that are not multiples of the slot counts.
const std::vector<SpanSpec> kMixed = {{1, 17}, {4, 6}, {23, 0}, {2, 3}, {9, 100}, {5, 41}};
const int64_t kSlotCounts[] = {1, 4, 9};

// ---- causal_conv_rows

struct ConvShape {
  int64_t width, K, dilation, x_stride, out_stride, state_off;
  bool accumulate;
  const char* name;
  int64_t R() const { return (K - 1) * dilation; }
  int64_t slot_floats() const { return state_off + R() * width + 11; }  // (floats after the window: untouched)
};

// cpu_blocks.cpp's convolution over one span: the window is the start slot's R rows, read before anything is
// written, then the span's rows of x. Writes the rows of out and the slots of `slot_data` the span writes.
void conv_reference(const float* x, const float* w, const ConvShape& c, const Spans& sp, size_t s,
                    std::vector<float>& slot_data, float* out) {
  const SpanSpec& span = sp.spec[s];
  const int64_t R = c.R(), W = c.width, first = sp.first_row[s];
  std::vector<float> win(size_t((R + span.rows) * W));
  const float* st = slot_data.data() + (span.pos0 % sp.slots) * sp.slot_floats + c.state_off;
  std::copy(st, st + R * W, win.begin());
  for (int64_t i = 0; i < span.rows; ++i)
    std::copy(x + (first + i) * c.x_stride, x + (first + i) * c.x_stride + W, win.begin() + (R + i) * W);
  for (int64_t i = 0; i < span.rows; ++i) {
    float* o = out + (first + i) * c.out_stride;
    for (int64_t ch = 0; ch < W; ++ch) {
      float acc = 0;
      for (int64_t j = 0; j < c.K; ++j) acc += w[ch * c.K + j] * win[size_t((i + j * c.dilation) * W + ch)];
      o[ch] = c.accumulate ? o[ch] + silu(acc) : silu(acc);
    }
    const int64_t len = span.pos0 + i + 1;
    if (writes(span, len, sp.slots))
      std::copy(win.begin() + (i + 1) * W, win.begin() + (i + 1 + R) * W,
                slot_data.begin() + (len % sp.slots) * sp.slot_floats + c.state_off);
  }
}

// Runs causal_conv_rows over `spans` (x rows from x_dev, out starting as out0) and checks the outputs against
// conv_reference (padding columns of out keep their bits) and every slot of every span bit for bit. Returns the
// outputs.
std::vector<float> check_conv(const ConvShape& c, const std::vector<float>& w, const cuda::DeviceBuffer& dw,
                              const float* x_host, const float* x_dev, const Spans& sp, const std::vector<float>& out0,
                              const std::string& at) {
  auto dout = to_device(out0);
  cuda::causal_conv_rows(x_dev, c.x_stride, c.width, dw.f32(), c.K, c.dilation, sp.rs, c.state_off, dout.f32(),
                         c.out_stride, c.accumulate);
  const auto got = to_host<float>(dout, out0.size());
  std::vector<float> want = out0;
  for (size_t s = 0; s < sp.spec.size(); ++s) {
    std::vector<float> slots = sp.before[s];
    conv_reference(x_host, w.data(), c, sp, s, slots, want.data());
    const auto got_slots = sp.after(s);
    for (int64_t i = 0; i < sp.slots; ++i) {
      const int64_t off = i * sp.slot_floats;
      EXPECT_TRUE(same_bits(got_slots.data() + off, slots.data() + off, size_t(sp.slot_floats)))
          << at << " span " << s << " (rows " << sp.spec[s].rows << ", pos0 " << sp.spec[s].pos0 << ") slot " << i
          << (same_bits(slots.data() + off, sp.before[s].data() + off, size_t(sp.slot_floats)) ? " (not to be written)"
                                                                                                : " (to be written)");
    }
    for (int64_t i = 0; i < sp.spec[s].rows; ++i) {
      const int64_t o = (sp.first_row[s] + i) * c.out_stride;
      EXPECT_TRUE(near_all(got.data() + o, want.data() + o, size_t(c.width), 1e-5))
          << at << " span " << s << " row " << i;
      EXPECT_TRUE(same_bits(got.data() + o + c.width, out0.data() + o + c.width, size_t(c.out_stride - c.width)))
          << at << " span " << s << " row " << i << ": the padding after the row was written";
    }
  }
  return got;
}

// GDN's convolution (K = 4 over conv_dim channels), PLE's (dilated by the n-gram size, added to the output,
// rows strided) and the widest window the header allows (R = kMaxConvWindow), over the mixed forward with 1, 4
// and 9 slots; then each span alone, its rows and slots bit for bit those of the mixed forward.
TEST(CudaRecurrent, CausalConvRowsContinuesEachSpansWindowAndWritesItsLastSlots) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const ConvShape shapes[] = {{1024, 4, 1, 1024, 1024, 0, false, "gdn"},
                              {300, 4, 3, 310, 305, 37, true, "ple"},
                              {40, 5, 16, 40, 48, 5, false, "widest window"}};
  for (const ConvShape& c : shapes) {
    ASSERT_LE(c.R(), cuda::kMaxConvWindow);
    const auto w = normal(size_t(c.width * c.K), 3, 0.5f);
    const auto dw = to_device(w);
    for (int64_t slots : kSlotCounts) {
      const std::string at = std::string(c.name) + ", " + std::to_string(slots) + " slots";
      Spans mixed(kMixed, slots, c.slot_floats(), random_slots(kMixed.size(), slots, c.slot_floats(), 5, 1.f));
      const auto x = normal(size_t(mixed.total_rows * c.x_stride), 6);
      const auto out0 = normal(size_t(mixed.total_rows * c.out_stride), 7);
      const auto dx = to_device(x);
      const auto got = check_conv(c, w, dw, x.data(), dx.f32(), mixed, out0, at + ", mixed");
      for (size_t s = 0; s < kMixed.size(); ++s) {
        Spans alone({kMixed[s]}, slots, c.slot_floats(), {mixed.before[s]});
        const int64_t first = mixed.first_row[s], rows = kMixed[s].rows;
        const std::vector<float> out0_alone(out0.begin() + first * c.out_stride,
                                            out0.begin() + (first + rows) * c.out_stride);
        const std::string at_alone = at + ", span " + std::to_string(s) + " alone";
        const auto one = check_conv(c, w, dw, x.data() + first * c.x_stride, dx.f32() + first * c.x_stride, alone,
                                    out0_alone, at_alone);
        EXPECT_TRUE(same_bits(one.data(), got.data() + first * c.out_stride, one.size())) << at_alone;
        EXPECT_TRUE(same_bits(alone.after(0).data(), mixed.after(s).data(), mixed.before[s].size())) << at_alone;
      }
    }
  }
}

// ---- gated_delta_rule

struct DeltaCase {
  cuda::DeltaRuleShape shape;
  const char* name;
  int64_t conv_dim() const { return 2 * shape.nk * shape.dk + shape.nv * shape.dv; }
};
constexpr int64_t kDeltaOff = 29;  // state_off: where the heads' states start in a slot (after a conv window)
int64_t delta_slot_floats(const cuda::DeltaRuleShape& s) { return kDeltaOff + s.nv * s.dk * s.dv + 9; }

// The inputs of gated_delta_rule for `rows` rows; norm is [dv], one weight per value element (cpu_blocks.cpp's
// g.norm[e], shared by the heads).
struct DeltaInputs {
  std::vector<float> qkv, b, a, z, neg_A, dt_bias, norm;
  cuda::DeviceBuffer dqkv, db, da, dz, dneg_A, ddt_bias, dnorm;
  DeltaInputs(const DeltaCase& c, int64_t rows, uint32_t seed) {
    const cuda::DeltaRuleShape& s = c.shape;
    qkv = normal(size_t(rows * c.conv_dim()), seed);
    b = normal(size_t(rows * s.nv), seed + 1);
    a = normal(size_t(rows * s.nv), seed + 2, 2.f);
    z = normal(size_t(rows * s.nv * s.dv), seed + 3);
    dt_bias = normal(size_t(s.nv), seed + 4, 0.5f);
    norm = normal(size_t(s.dv), seed + 5, 0.3f);
    for (float& v : norm) v += 1.f;
    std::mt19937 rng(seed + 6);
    std::uniform_real_distribution<float> u(-1.5f, 1.0f);
    for (int64_t h = 0; h < s.nv; ++h) neg_A.push_back(-std::exp(u(rng)));  // -exp(A_log): decays in (0, 1)
    // A row with an a far past softplus's threshold of 20 and one far below (decay ~ exp(neg_A · a), ~ 1).
    if (rows > 2) a[size_t(s.nv)] = 25.f, a[size_t(2 * s.nv)] = -30.f;
    dqkv = to_device(qkv), db = to_device(b), da = to_device(a), dz = to_device(z);
    dneg_A = to_device(neg_A), ddt_bias = to_device(dt_bias), dnorm = to_device(norm);
  }
};

void l2_normalize(float* x, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  const float r = 1.0f / std::sqrt(s + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

// cpu_blocks.cpp's gdn after its convolution, over span s of a call: per value head, the state from the start
// slot (read before anything is written), the rows in order, the gated RMSNorm of each output; the state after
// each of the span's last `slots` rows to the slot of that length. The call's row r is in's row in_row0 + r and
// out's row r.
void delta_reference(const DeltaCase& c, const DeltaInputs& in, int64_t in_row0, const Spans& sp, size_t s,
                     std::vector<float>& slot_data, float* out) {
  const cuda::DeltaRuleShape& sh = c.shape;
  const int64_t nk = sh.nk, nv = sh.nv, dk = sh.dk, dv = sh.dv, CD = c.conv_dim(), Kd = nk * dk;
  const int64_t group = nv / nk;
  const SpanSpec& span = sp.spec[s];
  const int64_t first = sp.first_row[s];
  std::vector<float> Sm(size_t(dk * dv)), kv_mem(static_cast<size_t>(dv)), q(static_cast<size_t>(dk)),
      k(static_cast<size_t>(dk)), o(static_cast<size_t>(dv));
  for (int64_t h = 0; h < nv; ++h) {
    const int64_t kh = h / group, head_off = kDeltaOff + h * dk * dv;
    const float* st = slot_data.data() + (span.pos0 % sp.slots) * sp.slot_floats + head_off;
    std::copy(st, st + dk * dv, Sm.begin());
    for (int64_t i = 0; i < span.rows; ++i) {
      const int64_t row = in_row0 + first + i;
      const float* qkv = in.qkv.data() + row * CD;
      std::copy(qkv + kh * dk, qkv + (kh + 1) * dk, q.begin());
      std::copy(qkv + Kd + kh * dk, qkv + Kd + (kh + 1) * dk, k.begin());
      const float* v = qkv + 2 * Kd + h * dv;
      l2_normalize(q.data(), dk);
      l2_normalize(k.data(), dk);
      const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
      for (int64_t d = 0; d < dk; ++d) q[size_t(d)] *= scale;
      const float beta = ops::sigmoid(in.b[size_t(row * nv + h)]);
      const float decay = std::exp(in.neg_A[size_t(h)] * softplus(in.a[size_t(row * nv + h)] + in.dt_bias[size_t(h)]));
      for (float& e : Sm) e *= decay;
      std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e) kv_mem[size_t(e)] += Sm[size_t(x * dv + e)] * k[size_t(x)];
      for (int64_t e = 0; e < dv; ++e) kv_mem[size_t(e)] = (v[e] - kv_mem[size_t(e)]) * beta;
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e) Sm[size_t(x * dv + e)] += k[size_t(x)] * kv_mem[size_t(e)];
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e) o[size_t(e)] += Sm[size_t(x * dv + e)] * q[size_t(x)];
      const float r = ops::inv_rms(o.data(), dv, sh.eps);
      const float* zz = in.z.data() + row * nv * dv + h * dv;
      float* dst = out + (first + i) * nv * dv + h * dv;
      for (int64_t e = 0; e < dv; ++e) {
        const float gate = sh.sigmoid_gate ? ops::sigmoid(zz[e]) : silu(zz[e]);
        dst[e] = in.norm[size_t(e)] * (o[size_t(e)] * r) * gate;
      }
      const int64_t len = span.pos0 + i + 1;
      if (writes(span, len, sp.slots))
        std::copy(Sm.begin(), Sm.end(), slot_data.begin() + (len % sp.slots) * sp.slot_floats + head_off);
    }
  }
}

// Runs gated_delta_rule over `sp` (its rows from `first` of in's rows) and checks every output row and every
// slot: the slots the span writes within the tolerance, the others (and every float outside the heads' states)
// bit for bit. Returns the outputs.
std::vector<float> check_delta(const DeltaCase& c, const DeltaInputs& in, int64_t first, const Spans& sp,
                               const std::string& at) {
  const cuda::DeltaRuleShape& sh = c.shape;
  const int64_t vd = sh.nv * sh.dv, CD = c.conv_dim();
  const auto out0 = normal(size_t(sp.total_rows * vd), 77);  // (what the output held)
  auto dout = to_device(out0);
  cuda::gated_delta_rule(in.dqkv.f32() + first * CD, in.db.f32() + first * sh.nv, in.da.f32() + first * sh.nv,
                         in.dz.f32() + first * vd, in.dneg_A.f32(), in.ddt_bias.f32(), in.dnorm.f32(), sh, sp.rs,
                         kDeltaOff, dout.f32());
  const auto got = to_host<float>(dout, out0.size());
  std::vector<float> want(out0.size());
  for (size_t s = 0; s < sp.spec.size(); ++s) {
    std::vector<float> slots = sp.before[s];
    delta_reference(c, in, first, sp, s, slots, want.data());
    const double tol = sp.spec[s].rows <= 4 ? 1e-5 : 1e-4;
    const auto got_slots = sp.after(s);
    for (int64_t i = 0; i < sp.slots; ++i) {
      const int64_t off = i * sp.slot_floats;
      const bool written = !same_bits(slots.data() + off, sp.before[s].data() + off, size_t(sp.slot_floats));
      const std::string which = at + " span " + std::to_string(s) + " (rows " + std::to_string(sp.spec[s].rows) +
                                ", pos0 " + std::to_string(sp.spec[s].pos0) + ") slot " + std::to_string(i);
      if (!written) {
        EXPECT_TRUE(same_bits(got_slots.data() + off, slots.data() + off, size_t(sp.slot_floats)))
            << which << " (not to be written)";
        continue;
      }
      const int64_t heads = kDeltaOff + sh.nv * sh.dk * sh.dv;
      EXPECT_TRUE(same_bits(got_slots.data() + off, slots.data() + off, size_t(kDeltaOff))) << which << " before";
      EXPECT_TRUE(same_bits(got_slots.data() + off + heads, slots.data() + off + heads, size_t(sp.slot_floats - heads)))
          << which << " after the heads";
      EXPECT_TRUE(near_all(got_slots.data() + off + kDeltaOff, slots.data() + off + kDeltaOff,
                           size_t(heads - kDeltaOff), tol))
          << which << " (to be written)";
    }
    for (int64_t i = 0; i < sp.spec[s].rows; ++i) {
      const int64_t r = sp.first_row[s] + i;
      EXPECT_TRUE(near_all(got.data() + r * vd, want.data() + r * vd, size_t(vd), tol))
          << at << " span " << s << " row " << i;
    }
  }
  return got;
}

const DeltaCase kDeltaCases[] = {
    {{2, 4, 128, 128, 1e-6f, true}, "nk 2 nv 4 dk dv 128, sigmoid gate"},
    {{2, 2, 16, 16, 1e-6f, true}, "nk 2 nv 2 dk dv 16 (the tiny fixture), sigmoid gate"},
    {{1, 3, 32, 64, 1e-5f, false}, "nk 1 nv 3 dk 32 dv 64, silu gate"},
};

// The delta rule over the mixed forward with 1, 4 and 9 slots, for head shapes of Qwen4-Exp (dk = dv = 128,
// value heads sharing key heads), of the tiny fixture (16) and with dk != dv (the state's [dk, dv] not square);
// then each span alone, its rows and slots bit for bit those of the mixed forward.
TEST(CudaRecurrent, GatedDeltaRuleMatchesTheHostAndWritesEachSpansLastSlots) {
  NEXTN_SKIP_WITHOUT_CUDA();
  for (const DeltaCase& c : kDeltaCases) {
    const int64_t floats = delta_slot_floats(c.shape), vd = c.shape.nv * c.shape.dv;
    for (int64_t slots : kSlotCounts) {
      const std::string at = std::string(c.name) + ", " + std::to_string(slots) + " slots";
      Spans mixed(kMixed, slots, floats, random_slots(kMixed.size(), slots, floats, 11, 0.3f));
      const DeltaInputs in(c, mixed.total_rows, 12);
      const auto got = check_delta(c, in, 0, mixed, at + ", mixed");
      for (size_t s = 0; s < kMixed.size(); ++s) {
        Spans alone({kMixed[s]}, slots, floats, {mixed.before[s]});
        const int64_t first = mixed.first_row[s];
        const std::string at_alone = at + ", span " + std::to_string(s) + " alone";
        const auto one = check_delta(c, in, first, alone, at_alone);
        EXPECT_TRUE(same_bits(one.data(), got.data() + first * vd, one.size())) << at_alone;
        EXPECT_TRUE(same_bits(alone.after(0).data(), mixed.after(s).data(), mixed.before[s].size())) << at_alone;
      }
    }
  }
}

// A span of more rows than slots writes the slot of its start position (length pos0 + slots, or a later one of
// the same residue) before its last rows are computed: both ops must have read that slot's old state first.
// Spans of 5 and 12 rows with 1 and 2 slots, and a prefill of 40 rows from position 0 with 9 slots; their
// outputs must be those of the old state (a kernel that reread the slot would compute the rows after the write
// from the new one).
TEST(CudaRecurrent, StartSlotIsReadBeforeTheSpanOverwritesIt) {
  NEXTN_SKIP_WITHOUT_CUDA();
  struct Case {
    std::vector<SpanSpec> spans;
    int64_t slots;
  };
  const Case cases[] = {{{{5, 3}}, 1}, {{{5, 3}}, 2}, {{{12, 7}, {5, 2}}, 2}, {{{40, 0}}, 9}};
  const ConvShape conv{1024, 4, 1, 1024, 1024, 3, false, "gdn conv"};
  const ConvShape ple{300, 4, 3, 300, 300, 0, true, "ple conv"};
  const DeltaCase& delta = kDeltaCases[0];
  for (const Case& cs : cases) {
    const std::string at = std::to_string(cs.spans.size()) + " spans, first of " +
                           std::to_string(cs.spans[0].rows) + " rows, " + std::to_string(cs.slots) + " slots";
    for (const ConvShape* c : {&conv, &ple}) {
      const int64_t floats = c->slot_floats();
      Spans sp(cs.spans, cs.slots, floats, random_slots(cs.spans.size(), cs.slots, floats, 21, 1.f));
      const auto w = normal(size_t(c->width * c->K), 22, 0.5f);
      const auto dw = to_device(w);
      const auto x = normal(size_t(sp.total_rows * c->x_stride), 23);
      const auto dx = to_device(x);
      check_conv(*c, w, dw, x.data(), dx.f32(), sp, normal(size_t(sp.total_rows * c->out_stride), 24),
                 at + ", " + c->name);
    }
    const int64_t floats = delta_slot_floats(delta.shape);
    Spans sp(cs.spans, cs.slots, floats, random_slots(cs.spans.size(), cs.slots, floats, 25, 0.3f));
    const DeltaInputs in(delta, sp.total_rows, 26);
    check_delta(delta, in, 0, sp, at + ", delta rule");
  }
}

}  // namespace
}  // namespace nextn
