// The CUDA ops a model's blocks are built from, besides the matmul (cuda_ops.h): norms, RoPE, gates,
// hyper-connection mixers, embedding gathers, the DSA indexer with its top-k, sparse MLA over a paged
// latent cache, and the MoE combine. All pointers are device pointers unless named `host`; every call is
// queued on the default stream in call order (copy_to_host waits for what came before it).
//
// Batch invariance: every kernel computes a row (and, in attention, a (row, head) pair) with the same
// operations in the same order whatever the number of rows, so the rows of a verify or of a batch of
// sequences get the bits of a one-row call, as the CPU ops do (ops.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace nextn::cuda {

// ---- memory
void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* src, size_t bytes);  // waits for the kernels queued before it
void fill_zero(void* dst, size_t bytes);
// dst[r, 0..cols) = src[r, 0..cols) for r < rows (rows src_stride / dst_stride floats apart).
void copy_cols(const float* src, int64_t rows, int64_t cols, int64_t src_stride, float* dst, int64_t dst_stride);
// dst[i] = src[idx[i]] rows of `width` floats, i < n.
void gather_rows(const float* src, int64_t width, const int32_t* idx, int64_t n, float* dst);

// ---- elementwise
void add(float* a, const float* b, int64_t n);  // a += b
void swiglu(const float* gate, const float* up, int64_t n, float limit, float* out);  // as ops::swiglu
void mul_sigmoid(const float* x, const float* g, int64_t n, float* out);             // as ops::mul_sigmoid
void scale(float* x, int64_t n, float a, float b);                                   // x = x · a · b
// x = silu(x / d) (kSiluOf) or 2 · sigmoid(x / d) (kTwoSigmoidOf): the gated residual's mix and injection gates.
enum class Map { kSiluOf, kTwoSigmoidOf };
void map(float* x, int64_t n, Map f, float d);
// x[r, :] = x[r, :] · sigmoid(g[r]) for rows of width d (a gated shared expert).
void scale_rows_sigmoid(float* x, const float* g, int64_t rows, int64_t d);

// ---- norms (rows of width d, x and out rows x_stride / out_stride floats apart; out may be x)
void rms_norm_rows(const float* x, int64_t rows, int64_t d, int64_t x_stride, const float* weight, float eps,
                   float* out, int64_t out_stride);
// rms_norm_rows of each of `groups` groups of d elements a row: group j of row r at x + r·row_stride +
// j·group_stride (out likewise; out may be x), normalized with weight + j·weight_stride (0: one weight for all).
void rms_norm_groups(const float* x, int64_t rows, int64_t groups, int64_t d, int64_t row_stride, int64_t group_stride,
                     const float* weight, int64_t weight_stride, float eps, float* out);
void layer_norm_rows(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, float eps,
                     float* out);

// ---- RoPE ("rotate half") on x[r, h, offset .. offset + dim) for r < rows, h < heads (rows row_stride and
// heads head_stride floats apart), at position positions[r]: cos/sin of inv_freq[i] · position (fp32 product)
// times attention_factor, as ops::rope_tables.
void rope_rows(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride, int64_t offset,
               int64_t dim, const int32_t* positions, const float* inv_freq, float attention_factor);

// ---- embeddings: out[r, c·width ..] = row ids[r] of w, dequantized, for each of `copies` copies; a row
// whose id is negative gets zeros. Rows of out are out_stride floats apart.
void embed_rows(const Linear& w, const int32_t* ids, int64_t rows, int copies, float* out, int64_t out_stride);

// ---- y[m, h, c] = Σ_r x[m, h, r] · w[row0 + h·head_rows_stride + r, c] for r < rows_per_head, c < w.in:
// the transposed product per head (MLA weight absorption). x rows x_stride apart, heads x_head floats apart;
// y likewise. r ascends in one fused multiply-add chain per output. With a tail, also y[m, h, w.in + i] =
// x[m, h, rows_per_head + i] for i < tail (the MLA query's rope part, passed through beside the product).
void matmul_transposed_heads(const float* x, int64_t M, int64_t x_stride, int64_t x_head, const Linear& w,
                             int64_t row0, int64_t head_rows_stride, int64_t rows_per_head, int64_t heads, float* y,
                             int64_t y_stride, int64_t y_head, int64_t tail = 0);

// ---- iHC: streams [rows, C, H]; the mixer fn [n_mix, C · H] (n_mix = 2C with post gates, C without).
// mixes[r] = fn · streams[r] (+ fn's bias), then x[r] = Σ_j pre_j · streams[r, j] with pre_j = sigmoid(mixes[r, j] ·
// inv_rms(streams[r]) · scale0 + base[j]) + hc_eps; when post is not null also post[r, j] = mag ·
// sigmoid(mixes[r, C + j] · inv_rms · scale1 + base[C + j]) + hc_eps. base is a device array. With `norm`,
// norm->out[r] = rms_norm(x[r]) · norm->weight instead of x (x is then left unwritten).
// Two launches: the mixer's products and the row's sum of squares in slices of the C · H row, many blocks a
// row (partials: hc_pre_scratch_floats), then the mix and its norm by a cluster of blocks a row, each
// summing the partials in slice order and its blocks' sums of squares in block order: a row's bits do not
// depend on how many rows share the call.
struct HcNorm {
  const float* weight;
  float eps;
  float* out;
};
int64_t hc_pre_scratch_floats(int64_t rows, int64_t C, int64_t H, int64_t n_mix);
void hc_pre(const float* streams, int64_t rows, int64_t C, int64_t H, const Linear& fn, float* partials,
            const float* base, float scale0, float scale1, float eps, float hc_eps, float mag, float* x, float* post,
            const HcNorm* norm = nullptr);
// streams[r, j] = post[r, j] · y[r] + streams[r, j]
void hc_post(float* streams, const float* post, const float* y, int64_t rows, int64_t C, int64_t H);

// ---- multi-stream mixes (Qwen4-Exp): streams [rows, C, H]
// x[r] = Σ_c w[r, c] / C (streams in order).
void stream_mean(const float* w, int64_t rows, int64_t C, int64_t H, float* x);
// PLE's gate per stream: g = (key[r, c] · query[r, c]) / √H, gate = sigmoid(sign(g) · √max(|g|, 1e-6)),
// out[r, c] = gate · value[r] (key, query, out [rows, C, H]; value [rows, H]).
void stream_gates(const float* key, const float* query, const float* value, int64_t rows, int64_t C, int64_t H,
                  float* out);

// ---- a forward's rows and the paged caches they read and write (all arrays on the device).
// Row r belongs to span span[r], sits at cache slot slot[r] and sees slots [0, slot[r]]; span s's cache has
// pages of page_tokens[s] positions, page table tables[table_offset[s] ..], and its pool's planes planes[s][p].
// Slot i of span s is physical row tables[table_offset[s] + i / pt] · pt + i % pt of every plane.
struct RowCaches {
  const int32_t* span = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* position = nullptr;
  const int64_t* table_offset = nullptr;
  const int32_t* page_tokens = nullptr;
  const int32_t* tables = nullptr;
  float* const* const* planes = nullptr;
};
// Writes src[r, 0..width) (rows src_stride apart) to plane `plane` at row r's slot (the plane's rows
// plane_width floats, default width; the row's first width of them written).
void write_cache_rows(const float* src, int64_t rows, int64_t width, int64_t src_stride, const RowCaches& rc,
                      int plane, int64_t plane_width = -1);
// The cache key of each row made and written in one kernel: src[r, 0..width) (rows src_stride apart) with its
// first norm.width elements normalized (RMSNorm times weight, or with a bias LayerNorm times weight plus bias,
// as rms_norm_rows / layer_norm_rows compute them; the rest as they are), then RoPE on [rope_offset,
// rope_offset + rope_dim) at rc.position as rope_rows, written to plane `plane` at row r's slot: each element
// gets the bits of those ops and write_cache_rows run one after another, without their four launches.
struct KeyNorm {
  const float* weight = nullptr;
  const float* bias = nullptr;  // LayerNorm when set
  float eps = 0.f;
  int64_t width = 0;
};
void write_key_rows(const float* src, int64_t rows, int64_t width, int64_t src_stride, const KeyNorm& norm,
                    int64_t rope_offset, int64_t rope_dim, const float* inv_freq, float attention_factor,
                    const RowCaches& rc, int plane);
// DSA indexer scores: out[r, j] = Σ_h w'[r, h] · relu(q[r, h] · key_j) over the index plane's keys j <= slot[r],
// w'[r, h] = w[r, h] · w_a · w_b (as scale() would leave it); q [rows, heads, dim], w [rows, heads], out rows
// out_stride floats apart.
// max_keys bounds every row's slot + 1 (the launch covers that many keys a row).
void indexer_scores(const float* q, const float* w, int64_t rows, int64_t heads, int64_t dim, const RowCaches& rc,
                    int plane, int64_t max_keys, float* out, int64_t out_stride, float w_a = 1.f, float w_b = 1.f);
// The k largest of scores[r, 0..slot[r]] (ties: the lower slot), ascending, into topk[r, 0..count[r]) (all
// the slots when there are at most k); scores are never NaN.
void topk_rows(const float* scores, int64_t rows, int64_t score_stride, const RowCaches& rc, int64_t k,
               int32_t* topk, int32_t* count);
// The same over scores[r, 0..candidates[r]) (candidates on the device).
void topk_rows(const float* scores, int64_t rows, int64_t score_stride, const int32_t* candidates, int64_t k,
               int32_t* topk, int32_t* count);
// Rows whose forced_count >= 0 take forced[r, 0..forced_count[r]) as their selection.
void override_selection(int32_t* topk, int32_t* count, int64_t rows, int64_t k, const int32_t* forced,
                        const int32_t* forced_count);
// Sparse MLA, absorbed, per (row r, head h): scores over the selected slots' keys [kvl + rope] of plane
// `plane` (q_cat [rows, heads, kvl + rope]), softmax with the head's sink at `scale`, then
// o_lat[r, h] = Σ_j p_j · key_j[0, kvl), the selected keys taken in a fixed number of equal runs (partial
// sums in `scratch`, sparse_mla_scratch_floats of them, then added in run order).
int64_t sparse_mla_scratch_floats(int64_t rows, int64_t heads, int64_t kvl);
void sparse_mla(const float* q_cat, int64_t rows, int64_t heads, int64_t kvl, int64_t rope, const int32_t* topk,
                int64_t k_stride, const int32_t* count, const RowCaches& rc, int plane, float scale,
                const float* sinks, float* scratch, float* o_lat);

// ---- y[m, h, n] = Σ_c x[m, h, c] · w[row0 + h·head_rows_stride + n, c] for n < rows_per_head, c < w.in: one
// launch for every head's rows of a stacked weight (MLA's W_vb per head).
void matmul_heads(const float* x, int64_t M, int64_t x_stride, int64_t x_head, const Linear& w, int64_t row0,
                  int64_t head_rows_stride, int64_t rows_per_head, int64_t heads, float* y, int64_t y_stride,
                  int64_t y_head);

// ---- MoE routing on the device (the host's route_tokens, models/hy_v4/routing.h, in the same steps): from
// router logits [S, E], the k experts of each token, ascending, and their weights, into ids / weights [S, k].
struct MoeRouting {
  int64_t experts = 0, k = 0, groups = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};
void moe_route(const float* logits, const float* e_bias, int64_t S, const MoeRouting& r, int32_t* ids,
               float* weights);
// The tokens' choices grouped by expert: first[E + 1] row offsets, token_of[S·k] the token of each grouped row
// (experts ascending, tokens in order within one), row_of[S, k] the grouped row of each choice. With real_tokens
// (a count on the device, for a graph's padded rows), tokens from *real_tokens on choose no expert: their
// row_of and the grouped rows past first[E] are 0, so that every index stays in bounds.
void moe_dispatch(const int32_t* ids, int64_t S, int64_t k, int64_t E, int32_t* first, int32_t* token_of,
                  int32_t* row_of, const int32_t* real_tokens = nullptr);

// Softmax routing (Qwen4-Exp): p = softmax(logits[t]) over E experts, the k largest (ties: the lower index),
// ascending, with weights p (divided by their sum, in expert order, with norm_topk_prob).
void moe_route_softmax(const float* logits, int64_t S, int64_t E, int64_t k, bool norm_topk_prob, int32_t* ids,
                       float* weights);

// ---- MoE: out[t] = Σ_i w[t, i] · expert_out[rows[t, i]] in i order (i < k), then out[t] += shared[t] when
// shared is not null; stored through `sink` (cuda_ops.h).
void moe_combine(const float* expert_out, const int32_t* rows, const float* weights, int64_t tokens, int64_t k,
                 int64_t H, const float* shared, float* out, const OutputSink& sink = {});

// ---- out[r] = the lowest index of the largest value of x's row r ([rows, n]), or -1 when the row holds a NaN or
// inf (core/finite.h's finite_argmax): greedy tokens come back as ids instead of vocabulary-wide rows.
void row_argmax(const float* x, int64_t rows, int64_t n, int32_t* out);
// A tensor-parallel rank's part of that (x's rows `stride` floats apart, n of them this rank's columns, which
// are the vocabulary's id0..): out[r] = {the largest value, id0 + its lowest index}, or {0, -1} when the row holds
// a NaN or inf (the layout of core/communicator.h's RankBest: the ranks' bests are gathered and compared there).
struct RowBest {
  float value;
  int64_t id;
};
void row_best(const float* x, int64_t rows, int64_t n, int64_t stride, int64_t id0, RowBest* out);

}  // namespace nextn::cuda
