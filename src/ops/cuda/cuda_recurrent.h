// CUDA kernels of the recurrent layers (Qwen4-Exp's Gated DeltaNet and its PLE convolution): causal depthwise
// convolutions over a window that continues each sequence's state, and the gated delta rule. Device pointers
// throughout; queued on the calling thread's default stream like cuda_nn.h's.
//
// The state of a sequence lives in `slots` copies on the device (models/qwen4_exp/model.h): the state after n
// positions in slot n mod slots, so that a verify of k + 1 rows leaves the state after each of its rows and a
// rollback is a change of length. A forward reads the slot of each span's first position and writes the slots
// of the lengths after its last `slots` rows.
//
// Batch invariance: a span's rows are computed by the same threads in the same order whatever else is in the
// forward (a channel's rows, or a head's, in one thread or block), so a row's bits do not depend on the batch.
#pragma once
#include <cstdint>

namespace nextn::cuda {

// A forward's rows by sequence: span s has rows [first_row[s], first_row[s] + rows[s]) at positions pos0[s]..,
// and its state slots at state[s] (slot i at state[s] + i · slot_floats). Arrays on the device.
// count: the entries of the arrays (a recorded forward passes the most spans its rows can have, so that its
// graph serves any number of them; entries with rows[s] = 0 are skipped and their state is not read).
struct RecurrentSpans {
  float* const* state = nullptr;
  const int32_t* first_row = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* pos0 = nullptr;
  int64_t count = 0;
  int64_t slots = 1, slot_floats = 0;
};

// The most state rows a causal convolution keeps ((K - 1) · dilation).
constexpr int64_t kMaxConvWindow = 64;

// For each span and channel ch < width, a causal depthwise convolution with K taps `dilation` apart over the
// window: the R = (K - 1) · dilation rows kept in the state at `state_off` ([R, width] of the span's slot for
// pos0), then the span's rows of x (rows x_stride apart). Row i gets
//   v = silu(Σ_j weight[ch · K + j] · window[i + j · dilation, ch])   (j ascending)
// stored to out[i, ch] (rows out_stride apart), or added to it with `accumulate`; the window's last R rows after
// row i are written to the slot of length pos0 + i + 1 when that is one of the span's last `slots` lengths.
void causal_conv_rows(const float* x, int64_t x_stride, int64_t width, const float* weight, int64_t K,
                      int64_t dilation, const RecurrentSpans& spans, int64_t state_off, float* out,
                      int64_t out_stride, bool accumulate);

// The gated delta rule of Gated DeltaNet, per span and value head h (key head h / (nv / nk)), over the span's
// rows in order, from the [dk, dv] state at `state_off + h·dk·dv` of the span's first slot:
//   q, k = l2-normalized (q also · dk^-1/2) from qkv [S, 2·nk·dk + nv·dv] (q heads, k heads, v heads)
//   beta = sigmoid(b[r, h]), decay = exp(neg_A[h] · softplus(a[r, h] + dt_bias[h]))   (b, a: [S, nv])
//   S = S · decay;  S += k ⊗ beta · (v − Sᵀk);  o = Sᵀq
//   out[r, h] = norm · rms_normalized(o) · gate(z[r, h])   (gate: sigmoid or silu; z, out [S, nv·dv])
// writing the state after each of the span's last `slots` rows to its slot.
struct DeltaRuleShape {
  int64_t nk = 0, nv = 0, dk = 0, dv = 0;
  float eps = 1e-6f;
  bool sigmoid_gate = false;
};
void gated_delta_rule(const float* qkv, const float* b, const float* a, const float* z, const float* neg_A,
                      const float* dt_bias, const float* norm, const DeltaRuleShape& shape,
                      const RecurrentSpans& spans, int64_t state_off, float* out);

}  // namespace nextn::cuda
