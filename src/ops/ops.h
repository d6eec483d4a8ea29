// The math the models call. Model code never touches weight bytes itself: it hands `Linear` handles and
// activation buffers to these ops, so kernels (and later a CUDA backend) change without touching models.
//
// Batch invariance (needed for exact speculative decoding): every op computes a row of its output with
// the same instructions and the same reduction order whatever the number of rows M in the call, and
// whatever the thread count. Threads split *output columns*, never a reduction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace nextn {

class ThreadPool;

// A [out, in] weight matrix as stored in the checkpoint (row-major, rows = output features).
// FP8 weights carry block scales: scale_inv[out / block_out, in / block_in] (fp32 or E8M0),
// dequantized inside the kernel (weight-only FP8; activations stay fp32).
struct Linear {
  DType dtype = DType::F32;
  int64_t out = 0, in = 0;
  const void* data = nullptr;
  int64_t row_stride = 0;  // elements between rows (= in for a plain matrix)
  // FP8 block scales (dtype == F8_E4M3 only)
  const void* scale = nullptr;
  DType scale_dtype = DType::F32;  // F32, BF16 or F8_E8M0
  int64_t block_out = 128, block_in = 128;
  int64_t scale_cols = 0;  // ceil(in / block_in)
  int64_t scale_row0 = 0;  // row 0's offset inside its scale block (row slices of a larger tensor)
  const float* bias = nullptr;  // optional [out]

  // Rows [r0, r0 + n) as a Linear of its own (expert slices, fused projections).
  Linear rows(int64_t r0, int64_t n) const;
  // Input columns [c0, c0 + n) as a Linear of its own (row-parallel shards: each rank multiplies its part of
  // x). FP8: c0 must start a scale block (else nextn::Error); the bias is dropped (the caller adds it once).
  Linear columns(int64_t c0, int64_t n) const;
  size_t weight_bytes() const;
};

namespace ops {

// y[M, w.out] = x[M, w.in] · wᵀ (+ bias). x rows are contiguous with stride x_stride (default w.in), y rows
// y_stride apart (default w.out): x holds (M - 1) · x_stride + w.in floats, y (M - 1) · y_stride + w.out,
// and only those are read or written. The weight's bytes are those of `out` rows of row_stride elements, the
// last row `in` long; FP8 scales hold ceil((scale_row0 + out) / block_out) rows of scale_cols entries.
void matmul(ThreadPool* pool, const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride = -1,
            int64_t y_stride = -1);

// One output of matmul_many: y[M, w->out] with row stride y_stride (default w->out).
struct MatmulOut {
  const Linear* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = -1;
};
// Several products of the same x (all w->in equal) in one pass over the pool: the weights' rows are split
// across the threads as one concatenated matrix (one hand-off instead of one per weight). Each output is
// bit-identical to ops::matmul's.
void matmul_many(ThreadPool* pool, const float* x, int64_t M, const MatmulOut* outs, int64_t n_outs,
                 int64_t x_stride = -1);

// y[w.in] += Σ_r x[r] · w[r, :] for r < w.out: the transposed product (MLA weight absorption).
void matmul_transposed(const float* x, const Linear& w, float* y);
// The same for M rows: y[m, :] += Σ_r x[m, r] · w[r, :] (x rows x_stride apart, y rows y_stride apart),
// w decoded once for up to 6 rows; each row's values are those of the one-row call.
void matmul_transposed(const float* x, int64_t M, int64_t x_stride, const Linear& w, float* y, int64_t y_stride);

// Dequantizes row r of w into out[w.in] (exactly w.in floats written).
void dequant_row(const Linear& w, int64_t r, float* out);

}  // namespace ops
}  // namespace nextn

namespace nextn::ops {

// out[r] = x[r] * rsqrt(mean(x[r]²) + eps) * weight   (rows of width d; weight may be null = ones)
void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, float eps, float* out,
              int64_t x_stride = -1, int64_t out_stride = -1);
// 1 / sqrt(mean(x²) + eps) of one row.
float inv_rms(const float* x, int64_t d, float eps);
// LayerNorm with affine weight and bias over rows of width d.
void layer_norm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, float eps,
                float* out);
// Non-interleaved ("rotate half") RoPE on x[0..dim) of one vector, in place:
// cos/sin hold dim/2 entries already multiplied by the attention factor.
void rope_rotate_half(float* x, int64_t dim, const float* cos, const float* sin);
// cos/sin tables (dim/2 entries) of one position.
void rope_tables(const float* inv_freq, int64_t half, int64_t position, float attention_factor, float* cos,
                 float* sin);
// out[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit); no clamp when limit <= 0.
void swiglu(const float* gate, const float* up, int64_t n, float limit, float* out);
// out[i] = x[i] * sigmoid(g[i]).
void mul_sigmoid(const float* x, const float* g, int64_t n, float* out);
// DSA indexer scores: out[j] = Σ_h w[h] · relu(q[h] · keys[j]) for q [heads, dim], w [heads], keys [n, dim],
// out [n] (the kernel's own scratch is per thread).
void indexer_scores(const float* q, const float* w, int64_t heads, int64_t dim, const float* keys, int64_t n,
                    float* out);
// In place: x[j] <- exp(scale·x[j] - m) / (exp(sink - m) + Σ_i exp(scale·x[i] - m)), m the largest of sink
// and scale·x (an attention sink: a logit in the normalization with no value).
void softmax_with_sink(float* x, int64_t n, float scale, float sink);
// out[j] = exp(scale·x[j] - shift) for j < n (Highway's exp, as softmax_with_sink's); returns Σ_j out[j], added
// in double. The sampler's softmax over a vocabulary.
double exp_scaled_sum(const float* x, int64_t n, float scale, float shift, float* out);
float max_value(const float* x, int64_t n);  // the largest of x[0..n) (-inf for n = 0); x holds no NaN
double sum_as_double(const float* x, int64_t n);  // Σ x[0..n), added in double (the order is the kernel's)
// out[i] = Σ_j p[j] · row(j)[i] for i < dim, j ascending; row(j) = rows + (idx ? idx[j] : j) * stride.
// Reads p[n], idx[n] and the first dim floats of each row(j); writes out[dim].
void weighted_row_sum(const float* p, const float* rows, int64_t n, int64_t dim, int64_t stride, float* out,
                      const int32_t* idx = nullptr);
// out[h * out_stride + j] = q[h * q_stride, +dim) · row(j)[0, dim) for h < heads, j < n, with row(j) = rows +
// (idx ? idx[j] : j) * row_stride: attention scores over selected cache rows without gathering them. The
// values are those of ops::matmul(q, heads, rows gathered as an f32 weight). Reads the first dim floats of
// each q row and row(j); writes out[h * out_stride + j] only.
void gathered_dots(const float* q, int64_t heads, int64_t q_stride, const float* rows, int64_t row_stride,
                   const int32_t* idx, int64_t n, int64_t dim, float* out, int64_t out_stride);
// One token of the gated delta rule on a head's state [dk, dv]: state <- state · decay; u = beta · (v - stateᵀk);
// state <- state + k ⊗ u; out[dv] = stateᵀq. A value column's result does not depend on dv or the target's width.
void gated_delta_step(float* state, int64_t dk, int64_t dv, const float* q, const float* k, const float* v,
                      float decay, float beta, float* out);
inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
float dot(const float* a, const float* b, int64_t n);
// Indices of the k largest values of x[0..n) (ties: lower index first), written ascending.
// Returns the count min(k, n) (0 for k <= 0): out must hold that many indices, and nothing past them is
// written. scratch must hold n floats.
int64_t topk_ascending(const float* x, int64_t n, int64_t k, int32_t* out, float* scratch);

// Reserves the calling thread's kernel scratch (256 KB per kind) now rather than at a kernel's first use on
// that thread; run it on every thread of a pool when a workspace is sized, so decode never allocates.
void reserve_thread_scratch();

}  // namespace nextn::ops
