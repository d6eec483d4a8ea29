// CUDA kernels behind cuda_recurrent.h. Compiled with --fmad=false like the other kernel files: every
// multiply-add is written out, so a row's value never depends on a contraction the compiler chose.
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_recurrent.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace nextn::cuda {
namespace {

__device__ __forceinline__ float siluf(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // torch's threshold

__device__ __forceinline__ float* slot_of(const RecurrentSpans& sp, int s, int64_t length, int64_t off) {
  return sp.state[s] + (length % sp.slots) * sp.slot_floats + off;
}

// Thread (span s = blockIdx.y, channel ch): the span's rows in order, its old window held first (a slot it
// writes may be the one it read: with fewer slots than rows, the slot of pos0 comes round again).
__global__ void causal_conv_kernel(const float* x, int64_t xs, int64_t width, const float* w, int64_t K, int64_t dil,
                                   RecurrentSpans sp, int64_t off, float* out, int64_t os, bool accumulate) {
  begin_after_predecessor();
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int s = int(blockIdx.y);
  if (ch >= width) return;
  const int64_t R = (K - 1) * dil, first = sp.first_row[s], rows = sp.rows[s], pos0 = sp.pos0[s];
  if (rows <= 0) return;  // (an unused span entry: the grid covers the most spans a forward can have)
  float old[kMaxConvWindow];
  const float* st = slot_of(sp, s, pos0, off);
  for (int64_t t = 0; t < R; ++t) old[t] = st[t * width + ch];
  auto window = [&](int64_t t) { return t < R ? old[t] : x[(first + t - R) * xs + ch]; };
  const float* wc = w + ch * K;
  for (int64_t i = 0; i < rows; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) acc += wc[j] * window(i + j * dil);
    const float v = siluf(acc);
    float* o = out + (first + i) * os + ch;
    *o = accumulate ? *o + v : v;
    const int64_t len = pos0 + i + 1;
    if (len > pos0 + rows - sp.slots) {
      float* dst = slot_of(sp, s, len, off);
      for (int64_t t = 0; t < R; ++t) dst[t * width + ch] = window(i + 1 + t);
    }
  }
}

// Block (span s, value head h), kThreads threads: thread e < dv owns column e of the head's [dk, dv] state, held
// in shared memory with the row's normalized q and k.
__global__ void __launch_bounds__(kThreads)
gated_delta_rule_kernel(const float* qkv, const float* b, const float* a, const float* z, const float* neg_A,
                        const float* dt_bias, const float* norm, DeltaRuleShape sh, RecurrentSpans sp, int64_t off,
                        float* out) {
  extern __shared__ float smem[];
  const int s = int(blockIdx.x);
  const int64_t h = blockIdx.y, dk = sh.dk, dv = sh.dv, nv = sh.nv, Kd = sh.nk * dk, CD = 2 * Kd + nv * dv;
  const int64_t kh = h / (nv / sh.nk), e = threadIdx.x;
  float* S = smem;          // [dk, dv]
  float* qs = S + dk * dv;  // [dk]
  float* ks = qs + dk;      // [dk]
  const float A = neg_A[h], dtb = dt_bias[h], wn = e < dv ? norm[e] : 0.0f;
  begin_after_predecessor();
  const int64_t first = sp.first_row[s], rows = sp.rows[s], pos0 = sp.pos0[s], head_off = off + h * dk * dv;
  if (rows <= 0) return;  // (an unused span entry: the grid covers the most spans a forward can have)
  const float* st = slot_of(sp, s, pos0, head_off);
  for (int64_t i = e; i < dk * dv; i += kThreads) S[i] = st[i];
  const float q_scale = 1.0f / sqrtf(float(dk));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = first + i;
    __syncthreads();  // (the previous row's readers of qs / ks are done; the state is loaded)
    float sq = 0.0f, sk = 0.0f;
    for (int64_t d = e; d < dk; d += kThreads) {
      qs[d] = qkv[r * CD + kh * dk + d];
      ks[d] = qkv[r * CD + Kd + kh * dk + d];
      sq += qs[d] * qs[d];
      sk += ks[d] * ks[d];
    }
    const float rq = 1.0f / sqrtf(block_all(sq, SumOp()) + 1e-6f);
    const float rk = 1.0f / sqrtf(block_all(sk, SumOp()) + 1e-6f);
    for (int64_t d = e; d < dk; d += kThreads) {
      qs[d] = qs[d] * rq * q_scale;
      ks[d] = ks[d] * rk;
    }
    __syncthreads();
    const float beta = sigmoidf(b[r * nv + h]);
    const float decay = expf(A * softplusf(a[r * nv + h] + dtb));
    float o = 0.0f;
    if (e < dv) {
      float kv = 0.0f;
      for (int64_t j = 0; j < dk; ++j) {
        const float v = S[j * dv + e] * decay;
        S[j * dv + e] = v;
        kv += v * ks[j];
      }
      const float delta = (qkv[r * CD + 2 * Kd + h * dv + e] - kv) * beta;
      for (int64_t j = 0; j < dk; ++j) {
        const float v = S[j * dv + e] + ks[j] * delta;
        S[j * dv + e] = v;
        o += v * qs[j];
      }
      const int64_t len = pos0 + i + 1;
      if (len > pos0 + rows - sp.slots) {
        float* dst = slot_of(sp, s, len, head_off);
        for (int64_t j = 0; j < dk; ++j) dst[j * dv + e] = S[j * dv + e];
      }
    }
    const float inv = 1.0f / sqrtf(block_all(o * o, SumOp()) / float(dv) + sh.eps);
    if (e < dv) {
      const float zz = z[r * nv * dv + h * dv + e];
      const float gate = sh.sigmoid_gate ? sigmoidf(zz) : siluf(zz);
      out[r * nv * dv + h * dv + e] = wn * (o * inv) * gate;
    }
  }
}

}  // namespace

void causal_conv_rows(const float* x, int64_t x_stride, int64_t width, const float* weight, int64_t K,
                      int64_t dilation, const RecurrentSpans& spans, int64_t state_off, float* out,
                      int64_t out_stride, bool accumulate) {
  if (spans.count <= 0 || width <= 0) return;
  if ((K - 1) * dilation > kMaxConvWindow)
    throw Error("cuda: a causal convolution keeping " + std::to_string((K - 1) * dilation) + " rows of state (the " +
                "kernels keep at most " + std::to_string(kMaxConvWindow) + ")");
  constexpr int kConvThreads = 128;
  launch_kernel(causal_conv_kernel, dim3(blocks_for(width, kConvThreads), unsigned(spans.count)), kConvThreads, 0,
                "causal_conv_kernel", x, x_stride, width, weight, K, dilation, spans, state_off, out, out_stride,
                accumulate);
}

void gated_delta_rule(const float* qkv, const float* b, const float* a, const float* z, const float* neg_A,
                      const float* dt_bias, const float* norm, const DeltaRuleShape& shape,
                      const RecurrentSpans& spans, int64_t state_off, float* out) {
  if (spans.count <= 0 || shape.nv <= 0) return;
  if (shape.dv > kThreads || shape.nk <= 0 || shape.nv % shape.nk != 0)
    throw Error("cuda: Gated DeltaNet with value heads of " + std::to_string(shape.dv) + " (at most " +
                std::to_string(kThreads) + ") or " + std::to_string(shape.nv) + " value heads over " +
                std::to_string(shape.nk) + " key heads");
  const size_t smem = size_t(shape.dk * shape.dv + 2 * shape.dk) * sizeof(float);
  if (smem > 227 * 1024) throw Error("cuda: a Gated DeltaNet state of " + std::to_string(smem) + " bytes a head");
  allow_smem(gated_delta_rule_kernel, smem, "gated delta rule: shared memory");
  launch_kernel(gated_delta_rule_kernel, dim3(unsigned(spans.count), unsigned(shape.nv)), kThreads, smem,
                "gated_delta_rule_kernel", qkv, b, a, z, neg_A, dt_bias, norm, shape, spans, state_off, out);
}

}  // namespace nextn::cuda
