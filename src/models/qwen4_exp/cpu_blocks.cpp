// The CPU backend of Qwen4-Exp's blocks (cpu_blocks.h).
#include "models/qwen4_exp/cpu_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/finite.h"
#include "core/profile.h"
#include "core/threadpool.h"
#include "models/common/expert_jobs.h"
#include "models/common/mlp_bytes.h"
#include "models/common/row_spans.h"
#include "models/qwen4_exp/model.h"
#include "models/qwen4_exp/ngram.h"

namespace nextn {

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

// Per-group RMSNorm: rows of `groups` × d, each group normalized on its own with its slice of `scale`.
void grouped_norm(const float* x, int64_t rows, int64_t groups, int64_t d, const float* scale, float eps, float* out) {
  for (int64_t g = 0; g < groups; ++g)
    ops::rms_norm(x + g * d, rows, d, scale + g * d, eps, out + g * d, groups * d, groups * d);
}

void l2_normalize(float* x, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  const float r = 1.0f / std::sqrt(s + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

// (a softmax without a sink: the sink's term is exp(-inf) = 0)
void softmax_scaled(float* x, int64_t n, float scale) {
  ops::softmax_with_sink(x, n, scale, -std::numeric_limits<float>::infinity());
}

// In place: x[i] <- silu(x[i]) (vectorized: a step's convolutions take thousands).
void silu_inplace(float* x, int64_t n) { ops::mul_sigmoid(x, x, n, x); }

// Where the forward's time goes (NEXTN_PROFILE=1), in report order.
namespace sections {
const profile::Section kMixers = profile::section("mixers");  // gated residual mixes and injections
const profile::Section kPle = profile::section("ple");        // n-gram embeddings, gates and conv
const profile::Section kGdnProjections = profile::section("gdn projections");  // in_proj, conv, q/k norms
const profile::Section kGdnRecurrence = profile::section("gdn recurrence");    // the delta rule per head
const profile::Section kGdnOutput = profile::section("gdn output");            // gated norm, out_proj
const profile::Section kQsaProjections = profile::section("qsa projections");  // q/k/v/index, norms, RoPE, cache
const profile::Section kQsaAttention = profile::section("qsa attention");      // block scores, top-k, attention
const profile::Section kQsaOutput = profile::section("qsa output");            // o_proj
const profile::Section kMoe = profile::section("moe");                         // router, experts, shared expert
const profile::Section kMtpInput = profile::section("mtp input");
const profile::Section kLmHead = profile::section("lm_head");                  // final mixer and lm_head
}  // namespace sections

template <class V>
void grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

void Qwen4CpuBlocks::reserve(int64_t rows, int64_t positions, int64_t /*page_tokens*/) {
  ensure_rows(std::max<int64_t>(rows, 1));
  ensure_thread_scratch(std::max<int64_t>(positions, 1));
  spans_.reserve(static_cast<size_t>(rows));
  row_span_.reserve(static_cast<size_t>(rows));
}

void Qwen4CpuBlocks::begin(const Qwen4RowSpan* spans, size_t count) {
  spans_.assign(spans, spans + count);
  S_ = map_rows_to_spans(spans_, row_span_);
  int64_t max_pos = 1;
  for (const Qwen4RowSpan& sp : spans_) max_pos = std::max(max_pos, sp.seq ? sp.seq->capacity() : sp.cache->capacity());
  if (S_ == 0) return;
  ensure_rows(S_);
  ensure_thread_scratch(max_pos);
}

// (tensor parallel: each row from the rank that owns its token)
void Qwen4CpuBlocks::embed_streams(const Linear& embed) {
  const int64_t H = cfg_.hidden_size, CH = cfg_.hc_width();
  float* X = b_.X.data();
  for (const Qwen4RowSpan& sp : spans_) std::copy(sp.tokens, sp.tokens + sp.rows, tokens_.begin() + sp.first_row);
  tp_.embed(embed, tokens_.data(), S_, H, b_.x.data());  // [S, H]
  for (int64_t s = 0; s < S_; ++s)
    for (int64_t j = 0; j < cfg_.hc_count; ++j)
      std::copy(b_.x.data() + s * H, b_.x.data() + (s + 1) * H, X + s * CH + j * H);
}

// A rank without heads of this kind adds nothing to the ranks' sum.
void Qwen4CpuBlocks::gdn(const GdnWeights& g, int layer) {
  if (cfg_.linear_num_key_heads > 0)
    gdn(g, layer, b_.x.data(), S_, b_.y.data());
  else
    std::fill(b_.y.data(), b_.y.data() + S_ * cfg_.hidden_size, 0.0f);
  tp_.sum(b_.y.data(), S_ * cfg_.hidden_size);
}

void Qwen4CpuBlocks::qsa(const QsaWeights& a, size_t cache_layer) {
  if (cfg_.num_attention_heads > 0)
    qsa(a, cache_layer, b_.x.data(), S_, b_.y.data());
  else
    std::fill(b_.y.data(), b_.y.data() + S_ * cfg_.hidden_size, 0.0f);
  tp_.sum(b_.y.data(), S_ * cfg_.hidden_size);
}

void Qwen4CpuBlocks::ple_add(const PleWeights& p, int layer) {
  const profile::Sections prof(sections::kPle);
  float* X = b_.X.data();
  float* add = b_.rows_out.data();
  ple(p, layer, X, S_, add);
  for (int64_t i = 0; i < S_ * cfg_.hc_width(); ++i) X[i] += add[i];
}

void Qwen4CpuBlocks::gated_residual(const GatedResidualWeights& g, bool inject) {
  const profile::Sections prof(sections::kMixers);
  gated_residual(g, b_.X.data(), S_, b_.x.data(), inject ? b_.inj.data() : nullptr);
}

size_t Qwen4CpuBlocks::moe(const MoeWeights& m) {
  const profile::Sections prof(sections::kMoe);
  const size_t before = routed_bytes_;
  moe(m, b_.x.data(), S_, b_.y.data());
  tp_.sum(b_.y.data(), S_ * cfg_.hidden_size);
  return routed_bytes_ - before;
}

void Qwen4CpuBlocks::mtp_input(const Qwen4MtpWeights& m, const Linear& embed, DraftRequest* const* requests,
                               size_t count) {
  const profile::Sections prof(sections::kMtpInput);
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width(), S = S_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* X = b_.X.data();
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    for (int64_t s = 0; s < r.rows; ++s) ops::dequant_row(embed, r.tokens[s], b_.y.data() + (row + s) * H);
    // (the hidden rows normed here; fc_hidden below maps each of their C streams)
    ops::rms_norm(r.h_prev, r.rows, CH, m.pre_fc_norm_hidden.data(), eps, b_.Xn.data() + row * CH);
    row += r.rows;
  }
  // e = fc_embedding(pre_fc_norm_embedding(embed(token)))  [S, H]
  float* e = b_.eh.data();
  ops::rms_norm(b_.y.data(), S, H, m.pre_fc_norm_embedding.data(), eps, b_.y.data());
  ops::matmul(pool_, b_.y.data(), S, m.fc_embedding, e);
  // streams = fc_hidden(pre_fc_norm_hidden(h_prev)) per stream, + e on every stream  [S, C·H]
  ops::matmul(pool_, b_.Xn.data(), S * C, m.fc_hidden, X);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t j = 0; j < C; ++j)
      for (int64_t h = 0; h < H; ++h) X[(s * C + j) * H + h] += e[s * H + h];
}

void Qwen4CpuBlocks::read_streams(int64_t first, int64_t rows, float* out) {
  const int64_t CH = cfg_.hc_width();
  std::copy(b_.X.data() + first * CH, b_.X.data() + (first + rows) * CH, out);
}

void Qwen4CpuBlocks::logits(const GatedResidualWeights& mixer, const Linear& lm_head, float* out) {
  const profile::Sections prof(sections::kLmHead);
  const int64_t CH = cfg_.hc_width();
  float* X = b_.X.data();
  // The rows that need logits (a prefill only its last), gathered in place at the front of X (a row never moves
  // back past where it is read), through the final mixer and one lm_head.
  int64_t n = 0;
  for (const Qwen4RowSpan& sp : spans_) {
    const bool all = sp.all_logits;
    const int64_t first = all ? sp.first_row : sp.first_row + sp.rows - 1, rows = all ? sp.rows : 1;
    if (first != n) std::memmove(X + n * CH, X + first * CH, size_t(rows * CH) * sizeof(float));
    n += rows;
  }
  gated_residual(mixer, X, n, b_.x.data(), nullptr);
  const int64_t V = cfg_.vocab_size;
  bool argmax_only = true;
  for (const Qwen4RowSpan& sp : spans_) argmax_only = argmax_only && sp.argmax;
  if (tp_.active() && argmax_only) {
    // Tensor parallel greedy rows: ids from each rank's best, no logits gathered (out stays unwritten, as the
    // spans allow).
    tp_.argmax(pool_, lm_head, b_.x.data(), n, tp_ids_.data());
    int64_t row = 0;
    for (const Qwen4RowSpan& sp : spans_) {
      const int64_t rows = sp.all_logits ? sp.rows : 1;
      std::copy(tp_ids_.begin() + row, tp_ids_.begin() + row + rows, sp.argmax);
      row += rows;
    }
    return;
  }
  tp_.logits(pool_, lm_head, b_.x.data(), n, V, out);
  int64_t row = 0;  // the spans that want only their rows' argmax
  for (const Qwen4RowSpan& sp : spans_) {
    const int64_t rows = sp.all_logits ? sp.rows : 1;
    if (sp.argmax) finite_argmax_rows(out + row * V, rows, V, sp.argmax);
    row += rows;
  }
}

void Qwen4CpuBlocks::logits_of(const GatedResidualWeights& mixer, const Linear& lm_head, const float* streams,
                               int64_t rows, float* out, int32_t* argmax, int64_t argmax_rows) {
  const profile::Sections prof(sections::kLmHead);
  ensure_rows(rows);
  float* X = b_.X.data();
  std::copy(streams, streams + rows * cfg_.hc_width(), X);
  gated_residual(mixer, X, rows, b_.x.data(), nullptr);
  ops::matmul(pool_, b_.x.data(), rows, lm_head, out);
  if (argmax_rows > 0) finite_argmax_rows(out, argmax_rows, cfg_.vocab_size, argmax);
}

// The pool when `work` (multiply-adds) is worth a hand-off now, else null (run on the calling thread): tiny
// models lose more to waking the workers than they gain.
ThreadPool* Qwen4CpuBlocks::pool_for(int64_t work) { return pool_for_work(pool_, work); }

// ---------------------------------------------------------------------------------------------------
// Buffers

void Qwen4CpuBlocks::ensure_rows(int64_t S) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, CH = c.hc_width(), C = c.hc_count;
  const int64_t qdim = int64_t(c.num_attention_heads) * 2 * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t idim = int64_t(c.indexer_n_heads + 1) * c.indexer_head_dim;
  const int64_t wide = std::max({CH, qdim, c.conv_dim(), 2 * c.moe_intermediate_size,
                                 2 * c.shared_expert_intermediate_size, H});
  grow(b_.X, S * CH);
  grow(b_.Xn, S * CH);
  grow(b_.x, S * H);
  grow(b_.y, S * H);
  grow(b_.inj, S * C);
  grow(b_.mid, S * std::max(c.hc_lowrank, int64_t(c.num_experts)));
  grow(b_.wide, S * wide);
  grow(b_.wide2, S * wide);
  grow(b_.rows_out, S * CH);
  grow(b_.qkv, S * c.conv_dim());
  grow(b_.z, S * c.linear_value_dim());
  grow(b_.ab, S * 2 * c.linear_num_value_heads);
  grow(b_.conv, S * c.conv_dim());
  grow(b_.core, S * std::max(c.linear_value_dim(), int64_t(c.num_attention_heads) * c.head_dim));
  grow(b_.q, S * qdim);
  grow(b_.k, S * kvd);
  grow(b_.v, S * kvd);
  grow(b_.iq, S * idim);
  grow(b_.router, S * c.num_experts);
  grow(b_.eh, S * H);
  grow(b_.eo, S * H);
  grow(b_.shared, S * H);
  grow(b_.sgate, S);
  grow(b_.emb, S * c.ple_embed_dim);
  grow(b_.rope, S * c.rope.dim);
  grow(b_.rope1, c.rope.dim);
  grow(b_.expert_ids, S * c.num_experts_per_tok);
  grow(b_.expert_w, S * c.num_experts_per_tok);
  grow(b_.expert_rows, S * c.num_experts_per_tok);
  grow(b_.gathered, S * c.num_experts_per_tok * H);
  grow(b_.expert_out, S * c.num_experts_per_tok * H);
  grow(b_.jobs, c.num_experts + 1);
  // per thread: the largest job's gate and up activations (an expert's rows, or the shared expert's S)
  b_.expert_act_floats = std::max(b_.expert_act_floats,
                                  S * 2 * std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size));
  grow(b_.expert_act, (pool_ ? pool_->size() : 1) * b_.expert_act_floats);
  const int64_t window_rows = std::max<int64_t>(c.linear_conv_kernel_dim - 1, c.ple_conv_state_rows()) + S;
  grow(b_.window, window_rows * std::max(c.conv_dim(), CH));
  grow(tokens_, S);
  grow(ngram_ids_, c.ngram_heads());
  tp_.reserve(S, H);  // (grows only)
  if (int64_t(tp_ids_.size()) < S) tp_ids_.resize(size_t(S));
}

// Per-thread scratch of the GDN head tasks and the QSA row tasks, for caches of up to `positions`.
void Qwen4CpuBlocks::ensure_thread_scratch(int64_t positions) {
  const Qwen4ExpConfig& c = cfg_;
  if (positions <= max_positions_ && !b_.thread.empty()) return;
  max_positions_ = std::max(max_positions_, positions);
  const int threads = pool_ ? pool_->size() : 1;
  const int64_t gdn = int64_t(c.linear_key_head_dim) * c.linear_value_head_dim + 2 * c.linear_value_head_dim;
  int64_t qsa = 0, ints = 1;
  if (c.has_qsa()) {
    const int64_t nb = max_positions_ / c.indexer_compress_ratio + 1;
    const int64_t sel = qsa_selection_cap(c);
    qsa = int64_t(c.num_attention_heads) * sel + int64_t(c.indexer_n_heads) * nb + 2 * nb;
    ints = nb + c.block_topk() + 2 * sel;
  }
  b_.thread_floats = std::max(gdn, qsa);
  b_.thread_ints = ints;
  grow(b_.thread, threads * b_.thread_floats);
  grow(b_.thread_idx, threads * b_.thread_ints);
}

// ---------------------------------------------------------------------------------------------------
// Blocks

// GatedResidual: per-stream norm, low-rank sigmoid mix of the streams into x [S, H], injection gates [S, C].
void Qwen4CpuBlocks::gated_residual(const GatedResidualWeights& g, const float* X, int64_t S, float* x_out,
                                   float* inj_out) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_count, CH = C * H, r = cfg_.hc_lowrank;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  float* Xn = b_.Xn.data();
  grouped_norm(X, S, C, H, g.hc_norm.data(), eps, Xn);
  float* mid = b_.mid.data();
  // mid [S, rank] and the injection gates' logits [S, C] from the same normed streams, in one pass
  const ops::MatmulOut down[] = {{&g.mix_down, mid, -1}, {&g.inject, inj_out, -1}};
  ops::matmul_many(pool_, Xn, S, down, inj_out ? 2 : 1);
  for (int64_t i = 0; i < S * r; ++i) mid[i] /= static_cast<float>(C);
  silu_inplace(mid, S * r);
  float* wgt = b_.rows_out.data();
  ops::matmul(pool_, mid, S, g.mix_up, wgt);  // [S, C·H]
  // Each stream gated by the sigmoid of its weights (vectorized: S·C·H exponentials were a tenth of a step
  // of the bundled model), then the mean over the streams, in stream order.
  ops::mul_sigmoid(Xn, wgt, S * CH, wgt);
  for (int64_t s = 0; s < S; ++s) {
    const float* w = wgt + s * CH;
    float* x = x_out + s * H;
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += w[c * H + h];
      x[h] = acc / static_cast<float>(C);
    }
  }
  if (!inj_out) return;
  for (int64_t i = 0; i < S * C; ++i) inj_out[i] = 2.0f * ops::sigmoid(inj_out[i] / static_cast<float>(C));
}

void Qwen4CpuBlocks::inject(const float* y, const float* inj, int64_t S, float* X) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_count;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) {
      float* dst = X + (s * C + c) * H;
      const float w = inj[s * C + c];
      for (int64_t h = 0; h < H; ++h) dst[h] += y[s * H + h] * w;
    }
}

// Gated DeltaNet over each span's rows in order: causal conv over the conv window, then per value head the
// delta rule S = S·exp(g); S += k ⊗ β(v − Sᵀk); o = Sᵀq on the head's [dk, dv] state. The states after the
// span's last `slots` rows are written to their slots.
void Qwen4CpuBlocks::gdn(const GdnWeights& g, int layer, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t K = c.linear_conv_kernel_dim, CD = c.conv_dim(), Kd = c.linear_key_dim();
  const int64_t nv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t group = nv / c.linear_num_key_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  profile::Sections prof(sections::kGdnProjections);
  float* qkv = b_.qkv.data();
  float* z = b_.z.data();
  float* ab = b_.ab.data();  // [S, nv] b, then [S, nv] a
  const ops::MatmulOut outs[] = {{&g.in_q, qkv, CD},       {&g.in_k, qkv + Kd, CD}, {&g.in_v, qkv + 2 * Kd, CD},
                                 {&g.in_z, z, -1},         {&g.in_b, ab, -1},       {&g.in_a, ab + S * nv, -1}};
  ops::matmul_many(pool_, x, S, outs, 6);
  float* conv = b_.conv.data();
  const int64_t conv_state = (K - 1) * CD;
  for (const Qwen4RowSpan& sp : spans_) {
    // Window: the K-1 inputs before the span (the state), then its rows.
    float* win = b_.window.data();
    const float* st = sp.seq->state(sp.pos0) + layout_.state_off[layer];
    std::copy(st, st + conv_state, win);
    std::copy(qkv + sp.first_row * CD, qkv + (sp.first_row + sp.rows) * CD, win + conv_state);
    for (int64_t i = 0; i < sp.rows; ++i) {
      float* out = conv + (sp.first_row + i) * CD;
      for (int64_t ch = 0; ch < CD; ++ch) {
        const float* wk = g.conv.data() + ch * K;
        float acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += wk[j] * win[(i + j) * CD + ch];
        out[ch] = acc;
      }
      silu_inplace(out, CD);
      const int64_t len = sp.pos0 + i + 1;
      if (len > sp.pos0 + sp.rows - layout_.slots) {
        float* dst = sp.seq->state(len) + layout_.state_off[layer];
        std::copy(win + (i + 1) * CD, win + (i + K) * CD, dst);
      }
    }
    // q and k: l2-normalized per key head, q scaled by dk^-1/2.
    for (int64_t i = 0; i < sp.rows; ++i) {
      float* row = conv + (sp.first_row + i) * CD;
      for (int64_t h = 0; h < c.linear_num_key_heads; ++h) {
        l2_normalize(row + h * dk, dk);
        l2_normalize(row + Kd + h * dk, dk);
        const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
        for (int64_t d = 0; d < dk; ++d) row[h * dk + d] *= scale;
      }
    }
  }
  prof.next(sections::kGdnRecurrence);
  float* core = b_.core.data();
  const int64_t tasks = static_cast<int64_t>(spans_.size()) * nv;
  const int64_t rec_off = conv_state;
  auto head_task = [&](int64_t begin, int64_t end, int thread) {
    float* Sm = b_.thread.data() + int64_t(thread) * b_.thread_floats;  // [dk, dv]
    for (int64_t t = begin; t < end; ++t) {
      const Qwen4RowSpan& sp = spans_[t / nv];
      const int64_t h = t % nv, kh = h / group;
      const float* st = sp.seq->state(sp.pos0) + layout_.state_off[layer] + rec_off + h * dk * dv;
      std::copy(st, st + dk * dv, Sm);
      for (int64_t i = 0; i < sp.rows; ++i) {
        const int64_t row = sp.first_row + i;
        const float* q = conv + row * CD + kh * dk;
        const float* k = conv + row * CD + Kd + kh * dk;
        const float* v = conv + row * CD + 2 * Kd + h * dv;
        const float beta = ops::sigmoid(ab[row * nv + h]);
        const float decay = std::exp(g.neg_A[h] * softplus(ab[S * nv + row * nv + h] + g.dt_bias[h]));
        float* o = core + row * c.linear_value_dim() + h * dv;
        ops::gated_delta_step(Sm, dk, dv, q, k, v, decay, beta, o);
        const int64_t len = sp.pos0 + i + 1;
        if (len > sp.pos0 + sp.rows - layout_.slots) {
          float* dst = sp.seq->state(len) + layout_.state_off[layer] + rec_off + h * dk * dv;
          std::copy(Sm, Sm + dk * dv, dst);
        }
      }
    }
  };
  const int64_t rows_per_span = std::max<int64_t>(S / std::max<int64_t>(int64_t(spans_.size()), 1), 1);
  if (ThreadPool* p = pool_for(tasks * rows_per_span * dk * dv * 4); p && tasks > 1)
    p->parallel_for(tasks, 1, head_task);
  else
    head_task(0, tasks, 0);
  // Gated RMSNorm per head: norm(o) · w · act(z), then the output projection.
  prof.next(sections::kGdnOutput);
  const bool sigmoid_gate = (c.output_gate_type.empty() ? c.hidden_act : c.output_gate_type) == "sigmoid";
  for (int64_t s = 0; s < S; ++s) {
    float* os = core + s * c.linear_value_dim();
    float* zs = z + s * c.linear_value_dim();
    for (int64_t h = 0; h < nv; ++h) {
      float* o = os + h * dv;
      const float r = ops::inv_rms(o, dv, eps);
      for (int64_t e = 0; e < dv; ++e) o[e] = g.norm[e] * (o[e] * r);
    }
    // · sigmoid(z), or · silu(z) = · z · sigmoid(z)
    if (!sigmoid_gate)
      for (int64_t e = 0; e < c.linear_value_dim(); ++e) os[e] *= zs[e];
    ops::mul_sigmoid(os, zs, c.linear_value_dim(), os);
  }
  ops::matmul(pool_, core, S, g.out_proj, y);
}

// QSA attention. Every row's key, value and raw indexer key are written first, then each block of
// compress_ratio slots completed by these rows gets its pooled key (mean of the raw keys, k_layernorm, RoPE at
// the block's first position). A query at slot s sees slots 0..s: its complete blocks are scored by
// Σ_heads relu(q·k)/√d, the block_topk best are kept with the tail of the incomplete block, and attention runs
// over those slots (all of them while there are no more blocks than block_topk).
void Qwen4CpuBlocks::qsa(const QsaWeights& a, size_t cache_layer, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads, kvd = nkv * hd;
  const int64_t ih = c.indexer_n_heads, ihd = c.indexer_head_dim, ratio = c.indexer_compress_ratio;
  const int64_t half = c.rope.dim / 2, group = nh / nkv;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float af = static_cast<float>(c.rope.attention_factor);
  profile::Sections prof(sections::kQsaProjections);
  float* q = b_.q.data();
  float* k = b_.k.data();
  float* v = b_.v.data();
  float* iq = b_.iq.data();
  const ops::MatmulOut outs[] = {{&a.q_proj, q, -1}, {&a.k_proj, k, -1}, {&a.v_proj, v, -1}, {&a.index_qk, iq, -1}};
  ops::matmul_many(pool_, x, S, outs, 4);
  // (attention_bias: the biases are the Linears' own, added by the matmuls)
  float* rope = b_.rope.data();  // [S, dim]: cos, then sin
  for (const Qwen4RowSpan& sp : spans_) {
    for (int64_t i = 0; i < sp.rows; ++i) {
      const int64_t row = sp.first_row + i;
      float* cs = rope + row * 2 * half;
      ops::rope_tables(c.rope.inv_freq.data(), half, sp.pos0 + i, af, cs, cs + half);
      float* qr = q + row * nh * 2 * hd;
      for (int64_t h = 0; h < nh; ++h) {
        float* qh = qr + h * 2 * hd;  // query, then its gate
        ops::rms_norm(qh, 1, hd, a.q_norm.data(), eps, qh);
        ops::rope_rotate_half(qh, 2 * half, cs, cs + half);
      }
      for (int64_t h = 0; h < nkv; ++h) {
        float* kh = k + row * kvd + h * hd;
        ops::rms_norm(kh, 1, hd, a.k_norm.data(), eps, kh);
        ops::rope_rotate_half(kh, 2 * half, cs, cs + half);
      }
      float* iqr = iq + row * (ih + 1) * ihd;
      for (int64_t h = 0; h < ih; ++h) {
        ops::rms_norm(iqr + h * ihd, 1, ihd, a.index_q_norm.data(), eps, iqr + h * ihd);
        ops::rope_rotate_half(iqr + h * ihd, 2 * half, cs, cs + half);
      }
      // Cache rows: [k | v] and [raw index key | pooled block key].
      const int64_t slot = sp.slot0 + i;
      float* kvrow = sp.cache->key_row(cache_layer, slot);
      std::copy(k + row * kvd, k + (row + 1) * kvd, kvrow);
      std::copy(v + row * kvd, v + (row + 1) * kvd, kvrow + kvd);
      float* irow = sp.cache->index_row(cache_layer, slot);
      std::copy(iqr + ih * ihd, iqr + (ih + 1) * ihd, irow);
    }
    // Pooled keys of the blocks these rows complete.
    for (int64_t s = sp.slot0; s < sp.slot0 + sp.rows; ++s) {
      if ((s + 1) % ratio != 0) continue;
      const int64_t first = s + 1 - ratio;
      float* pooled = sp.cache->index_row(cache_layer, first) + ihd;
      std::fill(pooled, pooled + ihd, 0.0f);
      for (int64_t t = first; t <= s; ++t) {
        const float* raw = sp.cache->index_row(cache_layer, t);
        for (int64_t d = 0; d < ihd; ++d) pooled[d] += raw[d];
      }
      for (int64_t d = 0; d < ihd; ++d) pooled[d] /= static_cast<float>(ratio);
      ops::rms_norm(pooled, 1, ihd, a.index_k_norm.data(), eps, pooled);
      float* tab = b_.rope1.data();
      ops::rope_tables(c.rope.inv_freq.data(), half, sp.cache->base_position() + first, af, tab, tab + half);
      ops::rope_rotate_half(pooled, 2 * half, tab, tab + half);
    }
  }
  // Per query row: selection, then attention over the selected slots.
  prof.next(sections::kQsaAttention);
  const int64_t sel_cap = qsa_selection_cap(c);
  const int64_t nb_cap = max_positions_ / ratio + 1;
  const float scale = static_cast<float>(c.attn_scale);
  const float idx_scale = 1.0f / std::sqrt(static_cast<float>(ihd));
  float* out = b_.core.data();
  auto row_task = [&](int64_t begin, int64_t end, int thread) {
    float* fs = b_.thread.data() + int64_t(thread) * b_.thread_floats;
    int32_t* is = b_.thread_idx.data() + int64_t(thread) * b_.thread_ints;
    float* att = fs;                             // [nh, sel_cap]
    float* dots = att + nh * sel_cap;            // [ih, nb_cap]
    float* bscore = dots + ih * nb_cap;          // [nb_cap]
    float* tmp = bscore + nb_cap;                // [nb_cap]
    int32_t* brow = is;                          // [nb_cap] physical rows of the pooled keys
    int32_t* top = brow + nb_cap;                // [block_topk]
    int32_t* sel = top + c.block_topk();         // [sel_cap] slots
    int32_t* phys = sel + sel_cap;               // [sel_cap] physical rows
    for (int64_t row = begin; row < end; ++row) {
      const Qwen4RowSpan& sp = spans_[row_span_[row]];
      const int64_t i = row - sp.first_row, s = sp.slot0 + i;
      KVCache& cache = *sp.cache;
      int64_t n = 0;
      const TopkOverride* forced = sp.forced && i >= sp.forced->first_row ? sp.forced : nullptr;
      if (forced) {
        // Step 0's selection, then (Qwen4-Exp keeps a query's tail) every slot after step 0's query.
        const int64_t ext = forced->extend_from_slot >= 0 ? forced->extend_from_slot : s + 1;
        for (int64_t j = 0; j < forced->count && n < sel_cap; ++j)
          if (forced->slots[j] <= s && forced->slots[j] < ext) sel[n++] = forced->slots[j];
        for (int64_t t = ext; t <= s && n < sel_cap; ++t) sel[n++] = static_cast<int32_t>(t);
      } else {
        const int64_t nb = (s + 1) / ratio;
        if (nb > c.block_topk()) {
          for (int64_t b = 0; b < nb; ++b) brow[b] = cache.physical(b * ratio);
          const float* iqr = iq + row * (ih + 1) * ihd;
          ops::gathered_dots(iqr, ih, ihd, cache.index_keys(cache_layer) + ihd, 2 * ihd, brow, nb, ihd, dots, nb_cap);
          for (int64_t b = 0; b < nb; ++b) {
            float acc = 0;
            for (int64_t h = 0; h < ih; ++h) acc += std::max(dots[h * nb_cap + b], 0.0f);
            bscore[b] = acc * idx_scale;
          }
          const int64_t kept = ops::topk_ascending(bscore, nb, c.block_topk(), top, tmp);
          for (int64_t t = 0; t < kept; ++t)
            for (int64_t r = 0; r < ratio; ++r) sel[n++] = static_cast<int32_t>(top[t] * ratio + r);
          for (int64_t t = nb * ratio; t <= s; ++t) sel[n++] = static_cast<int32_t>(t);
        } else {
          for (int64_t t = 0; t <= s; ++t) sel[n++] = static_cast<int32_t>(t);
        }
      }
      if (sp.last_topk && i == sp.rows - 1) {
        sp.last_topk->clear();
        for (int64_t j = 0; j < n; ++j) sp.last_topk->push_back(static_cast<int32_t>(cache.base_position() + sel[j]));
      }
      for (int64_t j = 0; j < n; ++j) phys[j] = cache.physical(sel[j]);
      const float* keys = cache.keys(cache_layer);
      const int64_t stride = 2 * kvd;
      for (int64_t g = 0; g < nkv; ++g) {
        const float* qg = q + row * nh * 2 * hd + g * group * 2 * hd;
        ops::gathered_dots(qg, group, 2 * hd, keys + g * hd, stride, phys, n, hd, att + g * group * sel_cap, sel_cap);
      }
      for (int64_t h = 0; h < nh; ++h) {
        float* p = att + h * sel_cap;
        softmax_scaled(p, n, scale);
        float* o = out + row * nh * hd + h * hd;
        ops::weighted_row_sum(p, keys + kvd + (h / group) * hd, n, hd, stride, o, phys);
        const float* gate = q + row * nh * 2 * hd + h * 2 * hd + hd;
        ops::mul_sigmoid(o, gate, hd, o);
      }
    }
  };
  for (const Qwen4RowSpan& sp : spans_)
    if (sp.last_topk) sp.last_topk->reserve(static_cast<size_t>(sel_cap));
  // Work of a row: its attention over up to sel_cap keys, and scoring every block of its sequence.
  int64_t work = 0;
  for (const Qwen4RowSpan& sp : spans_)
    work += sp.rows * (2 * nh * hd * std::min<int64_t>(sel_cap, sp.slot0 + sp.rows) +
                       ih * ihd * ((sp.slot0 + sp.rows) / ratio));
  if (ThreadPool* p = pool_for(work); p && S > 1)
    p->parallel_for(S, 1, row_task);
  else
    row_task(0, S, 0);
  prof.next(sections::kQsaOutput);
  ops::matmul(pool_, out, S, a.o_proj, y);
}

// MoE: softmax router over all experts, the top k (renormalized when norm_topk_prob), each expert run over the
// rows that chose it, summed per row in ascending expert order; plus the shared expert scaled by
// sigmoid(shared_expert_gate(x)). The experts (and the shared one) run as whole jobs spread over the threads
// (models/common/expert_jobs.h): a verify's extra rows route to extra experts, which then run side by side.
void Qwen4CpuBlocks::moe(const MoeWeights& m, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, E = c.num_experts, topk = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  float* logits = b_.router.data();
  ops::matmul(pool_, x, S, m.router, logits);  // [S, E]
  int32_t* ids = b_.expert_ids.data();
  float* wts = b_.expert_w.data();
  float* tmp = b_.wide2.data();
  for (int64_t s = 0; s < S; ++s) {
    float* p = logits + s * E;
    softmax_scaled(p, E, 1.0f);
    ops::topk_ascending(p, E, topk, ids + s * topk, tmp);
    float sum = 0;
    for (int64_t j = 0; j < topk; ++j) sum += p[ids[s * topk + j]];
    for (int64_t j = 0; j < topk; ++j) wts[s * topk + j] = c.norm_topk_prob ? p[ids[s * topk + j]] / sum : p[ids[s * topk + j]];
  }
  // Each used expert's rows gathered (experts ascending, rows grouped by expert): one job per expert, and one
  // for the shared expert over all rows (none on a tensor-parallel rank without its features).
  float* gathered = b_.gathered.data();    // [n, H]
  float* expert_out = b_.expert_out.data();  // [n, H]
  int32_t* rows = b_.expert_rows.data();     // [n] the (row, choice) slot of each gathered row
  ExpertJob* jobs = b_.jobs.data();
  int64_t n = 0, njobs = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (m.gate[e].out == 0) continue;  // another tensor-parallel rank's expert
    const int64_t first = n;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t j = 0; j < topk; ++j)
        if (ids[s * topk + j] == e) {
          rows[n] = static_cast<int32_t>(s * topk + j);
          std::copy(x + s * H, x + (s + 1) * H, gathered + n * H);
          ++n;
        }
    if (n == first) continue;
    routed_bytes_ += swiglu_bytes(m.gate[e], m.up[e], m.down[e]);
    jobs[njobs++] = {static_cast<int32_t>(e), first, n - first, swiglu_job_cost(m.gate[e], m.up[e], m.down[e], n - first)};
  }
  const bool has_shared = m.shared_gate.out > 0;
  const int64_t n_all = njobs + (has_shared ? 1 : 0);
  if (has_shared) jobs[njobs] = {-1, 0, S, swiglu_job_cost(m.shared_gate, m.shared_up, m.shared_down, S)};
  int64_t total = 0;
  for (int64_t j = 0; j < n_all; ++j) total += jobs[j].cost;
  const int64_t act_floats = b_.expert_act_floats;
  // A job on thread `thread`, its matmuls split over `inner` (null: on that thread alone).
  auto run_job = [&](const ExpertJob& job, int thread, ThreadPool* inner) {
    float* act = b_.expert_act.data() + int64_t(thread) * act_floats;  // [rows, I] gate, then [rows, I] up
    if (job.expert < 0) {
      swiglu_mlp(inner, m.shared_gate, m.shared_up, m.shared_down, 0.0f, x, S, act, act + S * Is, b_.shared.data());
      ops::matmul(inner, x, S, m.shared_expert_gate, b_.sgate.data());  // [S, 1]
      return;
    }
    const int64_t e = job.expert;
    swiglu_mlp(inner, m.gate[e], m.up[e], m.down[e], 0.0f, gathered + job.first * H, job.rows, act,
               act + job.rows * I, expert_out + job.first * H);
  };
  ThreadPool* pool = pool_for(total);
  if (pool && n_all >= pool->size() && n_all <= kMaxExpertJobs)
    run_expert_jobs(*pool, jobs, n_all, [&](const ExpertJob& job, int thread) { run_job(job, thread, nullptr); });
  else  // fewer jobs than threads (or tiny ones): one after the other, each one's matmuls split if worth it
    for (int64_t j = 0; j < n_all; ++j) run_job(jobs[j], 0, pool_);
  std::fill(y, y + S * H, 0.0f);
  for (int64_t r = 0; r < n; ++r) {  // rows are in ascending expert order
    const float w = wts[rows[r]];
    float* dst = y + (rows[r] / topk) * H;
    for (int64_t h = 0; h < H; ++h) dst[h] += expert_out[r * H + h] * w;
  }
  if (!has_shared) return;
  const float* sh = b_.shared.data();
  for (int64_t s = 0; s < S; ++s) {
    const float gate = ops::sigmoid(b_.sgate[s]);
    for (int64_t h = 0; h < H; ++h) y[s * H + h] += gate * sh[s * H + h];
  }
}

// PLE: the hashed n-gram embedding of each row's token history, gating one value per stream by the stream's
// normed activation, plus a dilated causal conv over the normed gated values. out [S, C·H] is added to X.
void Qwen4CpuBlocks::ple(const PleWeights& p, int layer, const float* X, int64_t S, float* out) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = C * H, E = c.ple_embed_dim, dph = c.ple_head_dim();
  const int n = c.ngram_size, heads = c.ngram_heads();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* emb = b_.emb.data();
  int64_t* ids = ngram_ids_.data();
  for (const Qwen4RowSpan& sp : spans_) {
    const std::vector<int32_t>& toks = sp.seq->tokens();
    for (int64_t i = 0; i < sp.rows; ++i) {
      ple_ngram_ids(c, p, sp.pos0 + i, [&](int64_t t) { return int64_t(toks[t]); }, ids);
      float* e = emb + (sp.first_row + i) * E;
      for (int head = 0; head < heads; ++head) {
        const int64_t id = ids[head];
        const size_t shard =
            std::upper_bound(p.shard_starts.begin(), p.shard_starts.end(), id) - p.shard_starts.begin() - 1;
        ops::dequant_row(p.table_shards[shard], id - p.shard_starts[shard], e + head * dph);
      }
    }
  }
  float* key = b_.wide.data();     // [S, C·H]
  float* value = b_.eo.data();     // [S, H]
  const ops::MatmulOut outs[] = {{&p.key_proj, key, -1}, {&p.value_proj, value, -1}};
  ops::matmul_many(pool_, emb, S, outs, 2);
  grouped_norm(key, S, C, H, p.norm_key.data(), eps, key);
  float* query = b_.Xn.data();
  grouped_norm(X, S, C, H, p.norm_query.data(), eps, query);
  float* gated = out;  // [S, C·H]
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t cc = 0; cc < C; ++cc) {
      const float* kk = key + s * CH + cc * H;
      const float* qq = query + s * CH + cc * H;
      float gdot = 0;
      for (int64_t h = 0; h < H; ++h) gdot += kk[h] * qq[h];
      gdot *= inv_sqrt_h;
      const float mag = std::sqrt(std::max(std::fabs(gdot), 1e-6f));
      const float gate = ops::sigmoid(gdot > 0 ? mag : gdot < 0 ? -mag : 0.0f);
      for (int64_t h = 0; h < H; ++h) gated[s * CH + cc * H + h] = gate * value[s * H + h];
    }
  float* normed = b_.wide2.data();
  grouped_norm(gated, S, C, H, p.norm_conv.data(), eps, normed);
  const int64_t K = c.ple_conv_kernel_size, R = c.ple_conv_state_rows();
  for (const Qwen4RowSpan& sp : spans_) {
    float* win = b_.window.data();
    const float* st = sp.seq->state(sp.pos0) + layout_.ple_off[layer];
    std::copy(st, st + R * CH, win);
    std::copy(normed + sp.first_row * CH, normed + (sp.first_row + sp.rows) * CH, win + R * CH);
    float* act = key;  // [CH] (the keys are spent: the gates are made)
    for (int64_t i = 0; i < sp.rows; ++i) {
      float* o = out + (sp.first_row + i) * CH;
      for (int64_t ch = 0; ch < CH; ++ch) {
        float acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += p.conv[ch * K + j] * win[(i + j * n) * CH + ch];
        act[ch] = acc;
      }
      silu_inplace(act, CH);
      for (int64_t ch = 0; ch < CH; ++ch) o[ch] += act[ch];
      const int64_t len = sp.pos0 + i + 1;
      if (len > sp.pos0 + sp.rows - layout_.slots) {
        float* dst = sp.seq->state(len) + layout_.ple_off[layer];
        std::copy(win + (i + 1) * CH, win + (i + 1 + R) * CH, dst);
      }
    }
  }
}

}  // namespace nextn
