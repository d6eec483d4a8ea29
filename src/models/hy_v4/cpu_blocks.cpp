// The CPU backend of HY V4's blocks (cpu_blocks.h); shapes are in [rows, cols] comments.
#include "models/hy_v4/cpu_blocks.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <new>
#include <type_traits>

#include "core/error.h"
#include "core/finite.h"
#include "core/profile.h"
#include "core/sizes.h"
#include "core/threadpool.h"
#include "models/common/row_spans.h"
#include "models/hy_v4/model.h"
#include "models/hy_v4/routing.h"

namespace nextn {

// Where the forward's time goes (NEXTN_PROFILE=1), in report order.
namespace sections {
const profile::Section kHyperConnections = profile::section("hyper-connections");  // iHC mixing and norms
const profile::Section kProjections = profile::section("projections");  // q, kv, gate, indexer q/k/w, RoPE
const profile::Section kIndexer = profile::section("indexer");          // DSA scores and top-k
const profile::Section kAttention = profile::section("attention");      // sparse MLA, absorbed, incl. kv_b
const profile::Section kOutput = profile::section("o_proj");
const profile::Section kRouter = profile::section("router");            // MoE router and token grouping
const profile::Section kExperts = profile::section("experts");          // routed + shared experts, combine
const profile::Section kDenseMlp = profile::section("dense mlp");
const profile::Section kLmHead = profile::section("lm_head");
}  // namespace sections

// Attention calls of at most this many rows may spread (row, head) pairs over the threads.
constexpr int64_t kHeadParallelRows = 16;

// Per-thread attention buffers for one query row (see HYV4CpuBlocks::attention).
struct AttentionScratch {
  int64_t nh, kvl, rope, vd, kmax;
  int64_t kr() const { return kvl + rope; }  // a key: latent, then rotated rope part
  int64_t floats() const { return nh * kmax; }  // scores of all heads of one query row
};

void HYV4CpuBlocks::reserve(int64_t rows, int64_t positions, int64_t /*page_tokens*/) {
  ensure_workspace(std::max<int64_t>(rows, 1), std::max<int64_t>(positions, 1));
  spans_.reserve(static_cast<size_t>(rows));
  row_span_.reserve(static_cast<size_t>(rows));
}

void HYV4CpuBlocks::begin(const HYV4RowSpan* spans, size_t count) {
  spans_.assign(spans, spans + count);
  S_ = map_rows_to_spans(spans_, row_span_);
  int64_t max_seq = 1;
  for (const HYV4RowSpan& sp : spans_) max_seq = std::max(max_seq, sp.cache->capacity());
  if (S_ > 0) ensure_workspace(S_, max_seq);
}

float* HYV4CpuBlocks::act(HYV4Act a) {
  switch (a) {
    case HYV4Act::kX: return ws_.x.data();
    case HYV4Act::kXn: return ws_.xn.data();
    case HYV4Act::kY: return ws_.y.data();
    case HYV4Act::kHidden: return ws_.hidden.data();
  }
  throw Error("internal: unknown activation");
}

void HYV4CpuBlocks::set_tensor_parallel(Communicator* comm, std::vector<UnitRange> vocab) {
  tp_.set(comm, std::move(vocab));
  ws_.rows = 0;  // (the workspace grows the gather buffers at the next reserve or forward)
}

// Embedding, copied into every HC stream (tensor parallel: each row from the rank that owns its token).
void HYV4CpuBlocks::embed_streams(const Linear& embed) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  for (const HYV4RowSpan& sp : spans_) std::copy(sp.tokens, sp.tokens + sp.rows, tp_tokens_.begin() + sp.first_row);
  tp_.embed(embed, tp_tokens_.data(), S_, H, ws_.x.data());  // [S, H]
  for (int64_t s = 0; s < S_; ++s) {
    float* X = ws_.streams.data() + s * C * H;
    for (int64_t j = 0; j < C; ++j) std::copy(ws_.x.begin() + s * H, ws_.x.begin() + (s + 1) * H, X + j * H);
  }
}

// HC head: collapse the streams with sigmoid gates, then the final norm.
void HYV4CpuBlocks::hc_head(const Linear& fn, const std::vector<float>& base, const std::vector<float>& scale,
                            const std::vector<float>& norm) {
  const int64_t S = S_, H = cfg_.hidden_size, C = cfg_.hc_mult;
  const float eps = static_cast<float>(cfg_.rms_norm_eps), hc_eps = static_cast<float>(cfg_.hc_eps);
  ops::matmul(pool_, ws_.streams.data(), S, fn, ws_.mixes.data());  // [S, C]
  for (int64_t s = 0; s < S; ++s) {
    const float* X = ws_.streams.data() + s * C * H;
    const float r = ops::inv_rms(X, C * H, eps);
    float* x = ws_.x.data() + s * H;
    std::fill(x, x + H, 0.0f);
    for (int64_t j = 0; j < C; ++j) {
      const float pre = ops::sigmoid(ws_.mixes[s * C + j] * r * scale[0] + base[j]) + hc_eps;
      for (int64_t i = 0; i < H; ++i) x[i] += pre * X[j * H + i];
    }
  }
  rms_norm(HYV4Act::kX, norm, HYV4Act::kHidden);
}

void HYV4CpuBlocks::hyper_pre(const HyperConnectionWeights& hc, const std::vector<float>& norm) {
  hyper_pre(hc);
  rms_norm(HYV4Act::kX, norm, HYV4Act::kXn);
}

void HYV4CpuBlocks::attention(const DecoderLayerWeights& L, size_t layer, HYV4Out out) {
  if (cfg_.num_attention_heads > 0)
    attention(L, layer);
  else  // a tensor-parallel rank without heads: its part of the sum is zero
    std::fill(ws_.y.begin(), ws_.y.begin() + S_ * cfg_.hidden_size, 0.0f);
  tp_.sum(ws_.y.data(), S_ * cfg_.hidden_size);
  deliver(out);
}

size_t HYV4CpuBlocks::ffn(const FfnWeights& F, HYV4Out out) {
  const size_t bytes = ffn(F);
  tp_.sum(ws_.y.data(), S_ * cfg_.hidden_size);
  deliver(out);
  return bytes;
}

void HYV4CpuBlocks::deliver(HYV4Out out) {
  if (out == HYV4Out::kAddToX) add(HYV4Act::kX, HYV4Act::kY);
  if (out == HYV4Out::kHyperPost) hyper_post();
}

void HYV4CpuBlocks::mtp_input(const MtpLayerWeights& m, const Linear& embed, DraftRequest* const* requests,
                              size_t count) {
  const int64_t H = cfg_.hidden_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    for (int64_t s = 0; s < r.rows; ++s) {
      float* in = ws_.mtp_in.data() + (row + s) * 2 * H;
      if (r.pos0 + s == 0)
        std::fill(in, in + H, 0.0f);  // the seed zeroes the token embedding at position 0
      else
        ops::dequant_row(embed, r.tokens[s], in);
      ops::rms_norm(in, 1, H, m.enorm.data(), eps, in);
      ops::rms_norm(r.h_prev + s * H, 1, H, m.hnorm.data(), eps, in + H);
    }
    row += r.rows;
  }
  ops::matmul(pool_, ws_.mtp_in.data(), S_, m.eh_proj, ws_.x.data());  // [S, H]
}

void HYV4CpuBlocks::rms_norm(HYV4Act in, const std::vector<float>& weight, HYV4Act out) {
  ops::rms_norm(act(in), S_, cfg_.hidden_size, weight.data(), static_cast<float>(cfg_.rms_norm_eps), act(out));
}

void HYV4CpuBlocks::add(HYV4Act into, HYV4Act other) {
  float* a = act(into);
  const float* b = act(other);
  for (int64_t i = 0; i < S_ * cfg_.hidden_size; ++i) a[i] += b[i];
}

void HYV4CpuBlocks::read_hidden(int64_t first, int64_t rows, float* out) {
  const int64_t H = cfg_.hidden_size;
  std::copy(ws_.hidden.begin() + first * H, ws_.hidden.begin() + (first + rows) * H, out);
}

void HYV4CpuBlocks::logits(const Linear& lm_head, float* out) {
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  int64_t logit_rows = 0;
  bool argmax_only = true;
  for (const HYV4RowSpan& sp : spans_) {
    logit_rows += sp.all_logits ? sp.rows : 1;
    argmax_only = argmax_only && sp.argmax;
  }
  if (tp_.active() && argmax_only && logit_rows == S_) {
    // Tensor parallel greedy rows: ids from each rank's best, no logits gathered (out stays unwritten, as the
    // spans allow).
    tp_.argmax(pool_, lm_head, ws_.hidden.data(), S_, tp_ids_.data());
    for (const HYV4RowSpan& sp : spans_)
      std::copy(tp_ids_.begin() + sp.first_row, tp_ids_.begin() + sp.first_row + sp.rows, sp.argmax);
    return;
  }
  if (logit_rows == S_) {
    project_logits(lm_head, ws_.hidden.data(), S_, out);
  } else {
    // Only some rows need logits (prefill segments: their last): gather them, then one lm_head over all, so
    // that its weights are read once per forward (rows are independent in the matmul).
    int64_t n = 0;
    for (const HYV4RowSpan& sp : spans_) {
      const bool all = sp.all_logits;
      const int64_t first = all ? sp.first_row : sp.first_row + sp.rows - 1, rows = all ? sp.rows : 1;
      std::copy(ws_.hidden.begin() + first * H, ws_.hidden.begin() + (first + rows) * H, ws_.x.begin() + n * H);
      n += rows;
    }
    project_logits(lm_head, ws_.x.data(), n, out);
  }
  int64_t row = 0;  // the spans that want only their rows' argmax
  for (const HYV4RowSpan& sp : spans_) {
    const int64_t rows = sp.all_logits ? sp.rows : 1;
    if (sp.argmax) finite_argmax_rows(out + row * V, rows, V, sp.argmax);
    row += rows;
  }
}

void HYV4CpuBlocks::lm_head_rows(const Linear& lm_head, const float* hidden, int64_t rows, float* out,
                                 int32_t* argmax, int64_t argmax_rows) {
  project_logits(lm_head, hidden, rows, out);
  if (argmax_rows > 0) finite_argmax_rows(out, argmax_rows, cfg_.vocab_size, argmax);
}

// out [rows, V] = lm_head(hidden [rows, H]) (tensor parallel: every rank's vocabulary part, gathered).
void HYV4CpuBlocks::project_logits(const Linear& lm_head, const float* hidden, int64_t rows, float* out) {
  const profile::Sections prof(sections::kLmHead);
  tp_.logits(pool_, lm_head, hidden, rows, cfg_.vocab_size, out);
}

int64_t HYV4CpuBlocks::min_parallel_work() const {
  return tuning_.min_parallel_work >= 0 ? tuning_.min_parallel_work : pool_ ? pool_->min_parallel_work() : 0;
}

ThreadPool* HYV4CpuBlocks::pool_for(int64_t work) { return pool_for_work(pool_, work, min_parallel_work()); }

int64_t HYV4CpuBlocks::topk_stride() const {
  return std::min<int64_t>(std::max<int64_t>(cfg_.index_topk, 1), ws_max_seq_);
}

void HYV4CpuBlocks::ensure_workspace(int64_t S, int64_t max_seq) {
  if (S <= ws_.rows && max_seq <= ws_max_seq_) return;
  const HYV4Config& c = cfg_;
  S = std::max(S, ws_.rows);
  max_seq = std::max(max_seq, ws_max_seq_);
  const int64_t H = c.hidden_size, C = c.hc_mult, nh = c.num_attention_heads;
  const int64_t I2 = std::max(2 * c.moe_intermediate_size * std::max(1, c.n_shared_experts), 2 * c.intermediate_size);
  const int threads = pool_ ? pool_->size() : 1;
  const int64_t topk = std::min<int64_t>(std::max<int64_t>(c.index_topk, 1), max_seq);  // topk_stride() once grown
  // Every buffer's size is a product of checked factors, and their sum must fit in memory, before any of them
  // is allocated (a prompt of the whole context has [S, max_seq] index scores).
  const std::string what = "the forward's workspace for " + std::to_string(S) + " rows over " +
                           std::to_string(max_seq) + " positions";
  int64_t bytes = 0;
  std::vector<std::function<void()>> allocations;
  auto plan = [&](auto& buf, std::initializer_list<int64_t> dims) {
    using T = typename std::decay_t<decltype(buf)>::value_type;
    int64_t n = 1;
    for (int64_t d : dims) n = checked_mul(n, d, what);
    bytes = checked_add(bytes, checked_mul(n, int64_t(sizeof(T)), what), what);
    allocations.push_back([&buf, n] { buf.assign(static_cast<size_t>(n), T{}); });
  };
  HYV4Workspace& w = ws_;
  plan(w.streams, {S, C, H});
  plan(w.x, {S, H});
  plan(w.xn, {S, H});
  plan(w.y, {S, H});
  plan(w.mixes, {S, 2 * C});
  plan(w.q_resid, {S, c.q_lora_rank});
  plan(w.q, {S, nh, c.qk_head_dim});
  plan(w.kv_a, {S, c.kv_lora_rank + c.qk_rope_head_dim});
  plan(w.gate, {S, nh, c.v_head_dim});
  plan(w.attn, {S, nh, c.v_head_dim});
  plan(w.iq, {S, c.index_n_heads, c.index_head_dim});
  plan(w.ik, {S, c.index_head_dim});
  plan(w.iw, {S, c.index_n_heads});
  plan(w.topk, {S, topk});
  plan(w.topk_count, {S});
  plan(w.ffn_a, {S, I2});
  plan(w.ffn_b, {S, I2});
  plan(w.router, {S, c.n_routed_experts});
  plan(w.expert_ids, {S, c.num_experts_per_tok});
  plan(w.expert_w, {S, c.num_experts_per_tok});
  plan(w.gathered, {S, c.num_experts_per_tok, H});
  plan(w.expert_out, {S, std::max(1, c.num_experts_per_tok), H});
  plan(w.expert_rows, {S, c.num_experts_per_tok});
  const int64_t I_moe = std::max<int64_t>(c.moe_intermediate_size,
                                          c.moe_intermediate_size * std::max(1, c.n_shared_experts));
  plan(w.expert_jobs, {c.n_routed_experts + 1});
  plan(w.expert_scratch, {threads, 2, S, I_moe});
  plan(w.moe_act, {S, c.num_experts_per_tok + 1, 2, I_moe});
  plan(w.shared_out, {S, H});
  plan(w.rope_cs, {std::max<int64_t>(c.qk_rope_head_dim, 2)});
  plan(w.hidden, {S, H});
  plan(w.mtp_in, {S, 2 * H});
  plan(w.post_gates, {S, C});  // post gates [S, C]
  const AttentionScratch sz{nh, c.kv_lora_rank, c.qk_rope_head_dim, c.v_head_dim, topk};
  plan(w.att_scratch, {threads, sz.floats()});  // per thread, one query row at a time
  plan(w.att_q, {S, nh, sz.kr()});
  plan(w.att_o, {S, nh, sz.kvl});
  plan(w.att_v, {S, nh, sz.vd});
  plan(w.idx_scratch, {S, max_seq});
  plan(w.idx_tmp, {S, max_seq});
  plan(w.sel_rows, {S, topk});
  plan(tp_tokens_, {S});
  plan(tp_ids_, {S});
  bytes = checked_add(bytes, tp_.bytes_for(S, H), what);  // (tensor parallel: its gathers)
  allocations.push_back([this, S, H] { tp_.reserve(S, H); });
  require_memory(bytes, what);
  try {
    for (const auto& allocate : allocations) allocate();
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate " + what + " (" + gib(bytes) + ")");
  }
  w.rows = S;
  ws_max_seq_ = max_seq;
  // Every thread's kernel scratch now, not when a worker first meets a kernel mid-decode.
  if (pool_ && pool_->size() > 1)
    pool_->parallel_for(pool_->size(), 1, [](int64_t, int64_t, int) { ops::reserve_thread_scratch(); });
  ops::reserve_thread_scratch();
  row_span_.reserve(static_cast<size_t>(S));
}

// streams [S, C, H] -> x [S, H] (weighted by the pre gates); post gates -> post_gates [S, C]
void HYV4CpuBlocks::hyper_pre(const HyperConnectionWeights& hc) {
  const int64_t S = S_;
  const profile::Sections prof(sections::kHyperConnections);
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  const float eps = static_cast<float>(cfg_.rms_norm_eps), hc_eps = static_cast<float>(cfg_.hc_eps);
  const float mag = static_cast<float>(cfg_.hc_magnitude);
  ops::matmul(pool_, ws_.streams.data(), S, hc.fn, ws_.mixes.data());  // [S, 2C]
  for (int64_t s = 0; s < S; ++s) {
    const float* X = ws_.streams.data() + s * C * H;
    const float r = ops::inv_rms(X, C * H, eps);
    float* m = ws_.mixes.data() + s * 2 * C;
    float* post = ws_.post_gates.data() + s * C;
    float* x = ws_.x.data() + s * H;
    std::fill(x, x + H, 0.0f);
    for (int64_t j = 0; j < C; ++j) {
      const float pre = ops::sigmoid(m[j] * r * hc.scale[0] + hc.base[j]) + hc_eps;
      post[j] = mag * ops::sigmoid(m[C + j] * r * hc.scale[1] + hc.base[C + j]) + hc_eps;
      for (int64_t i = 0; i < H; ++i) x[i] += pre * X[j * H + i];
    }
  }
}

// streams[s, j] += post[s, j] * y[s]
void HYV4CpuBlocks::hyper_post() {
  const int64_t S = S_;
  const profile::Sections prof(sections::kHyperConnections);
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  for (int64_t s = 0; s < S; ++s) {
    float* X = ws_.streams.data() + s * C * H;
    const float* y = ws_.y.data() + s * H;
    const float* post = ws_.post_gates.data() + s * C;
    for (int64_t j = 0; j < C; ++j)
      for (int64_t i = 0; i < H; ++i) X[j * H + i] = post[j] * y[i] + X[j * H + i];
  }
}

// xn [S, H] (normed) -> y [S, H]. The rows are those of spans_: row r of a span is rotated at position
// pos0+r, written to its cache's slot slot0+r (layer `layer`) and attends to slots [0, slot0+r] of that cache
// chosen by the indexer — or, for the rows of a span with a `forced` selection, to exactly those slots (the
// seed's draft steps >= 1 reuse step 0's top-k instead of running the indexer).
void HYV4CpuBlocks::attention(const DecoderLayerWeights& L, size_t layer) {
  const int64_t S = S_;
  const HYV4Config& c = cfg_;
  const AttentionWeights& a = L.attn;
  const int64_t nh = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t qkd = c.qk_head_dim, vd = c.v_head_dim, kvl = c.kv_lora_rank, half = rope / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float af = static_cast<float>(c.rope.attention_factor);
  const float* xn = ws_.xn.data();

  profile::Sections prof(sections::kProjections);
  // The projections of xn, and then those of the normed q_resid, each in one pass over the pool.
  // Forced rows attend to their span's forced slots; the indexer runs when some other row needs it.
  auto forced_of = [&](int64_t s) -> const TopkOverride* {
    const HYV4RowSpan& sp = spans_[row_span_[s]];
    return sp.forced && s - sp.first_row >= sp.forced->first_row ? sp.forced : nullptr;
  };
  bool all_forced = true;
  for (int64_t s = 0; s < S && all_forced; ++s) all_forced = forced_of(s) != nullptr;
  const bool run_indexer = !all_forced && a.has_indexer;
  {
    ops::MatmulOut outs[5] = {{&a.gate_proj, ws_.gate.data()},      // [S, nh*v]
                              {&a.q_a_proj, ws_.q_resid.data()},    // [S, q_lora]
                              {&a.kv_a_proj, ws_.kv_a.data()},      // [S, kvl + rope]
                              {&a.indexer.wk, ws_.ik.data()},       // [S, ihd]
                              {&a.indexer.weights_proj, ws_.iw.data()}};  // [S, nih]
    ops::matmul_many(pool_, xn, S, outs, run_indexer ? 5 : 3);
  }
  ops::rms_norm(ws_.q_resid.data(), S, c.q_lora_rank, a.q_a_norm.data(), eps, ws_.q_resid.data());
  {
    ops::MatmulOut outs[2] = {{&a.q_b_proj, ws_.q.data()},         // [S, nh*qkd]
                              {&a.indexer.wq_b, ws_.iq.data()}};   // [S, nih*ihd]
    ops::matmul_many(pool_, ws_.q_resid.data(), S, outs, run_indexer ? 2 : 1);
  }

  // Row s's cache, slot and position.
  auto cache_of = [&](int64_t s) -> KVCache& { return *spans_[row_span_[s]].cache; };
  auto slot_of = [&](int64_t s) {
    const HYV4RowSpan& sp = spans_[row_span_[s]];
    return sp.slot0 + (s - sp.first_row);
  };
  auto pos_of = [&](int64_t s) {
    const HYV4RowSpan& sp = spans_[row_span_[s]];
    return sp.pos0 + (s - sp.first_row);
  };
  float* cosv = ws_.rope_cs.data();  // [half] cos, then [half] sin of one position
  float* sinv = cosv + half;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pos = pos_of(s), slot = slot_of(s);
    ops::rope_tables(c.rope.inv_freq.data(), half, pos, af, cosv, sinv);
    float* q = ws_.q.data() + s * nh * qkd;
    for (int64_t h = 0; h < nh; ++h) ops::rope_rotate_half(q + h * qkd + nope, rope, cosv, sinv);
    const float* kva = ws_.kv_a.data() + s * (kvl + rope);
    float* key = cache_of(s).key_row(layer, slot);
    ops::rms_norm(kva, 1, kvl, a.kv_a_norm.data(), eps, key);
    float* kr = key + kvl;
    std::copy(kva + kvl, kva + kvl + rope, kr);
    ops::rope_rotate_half(kr, rope, cosv, sinv);
  }

  prof.next(sections::kIndexer);
  // DSA indexer: top-k key positions per query row (ascending), or reuse the previous full layer's.
  const int64_t K = topk_stride();  // index_topk, or every position when there are fewer
  auto force_rows = [&] {
    for (int64_t s = 0; s < S; ++s)
      if (const TopkOverride* f = forced_of(s)) {
        const int64_t n = std::min<int64_t>(f->count, K);
        std::copy(f->slots, f->slots + n, ws_.topk.data() + s * K);
        ws_.topk_count[s] = static_cast<int32_t>(n);
      }
  };
  if (run_indexer) {
    const IndexerWeights& ix = a.indexer;
    const int64_t nih = c.index_n_heads, ihd = c.index_head_dim;
    ops::layer_norm(ws_.ik.data(), S, ihd, ix.k_norm_w.data(), ix.k_norm_b.data(), eps, ws_.ik.data());
    const float wscale_a = 1.0f / std::sqrt(static_cast<float>(nih));
    const float wscale_b = 1.0f / std::sqrt(static_cast<float>(ihd));
    for (int64_t s = 0; s < S; ++s) {
      const int64_t pos = pos_of(s), slot = slot_of(s);
      ops::rope_tables(c.rope.inv_freq.data(), half, pos, af, cosv, sinv);
      float* iq = ws_.iq.data() + s * nih * ihd;
      // The indexer rotates the *last* rope dims of its heads.
      for (int64_t h = 0; h < nih; ++h) ops::rope_rotate_half(iq + h * ihd + (ihd - rope), rope, cosv, sinv);
      float* ik = ws_.ik.data() + s * ihd;
      ops::rope_rotate_half(ik + (ihd - rope), rope, cosv, sinv);
      std::copy(ik, ik + ihd, cache_of(s).index_row(layer, slot));
      float* iw = ws_.iw.data() + s * nih;
      for (int64_t h = 0; h < nih; ++h) iw[h] = iw[h] * wscale_a * wscale_b;
    }
    const int64_t max_seq = ws_max_seq_;
    // Scores of keys [j0, j1) for row s: Σ_h w_h·relu(q_h·k_j), every key on its own (any split of the
    // keys gives the same values), page by page.
    auto score_keys = [&](int64_t s, int64_t j0, int64_t j1) {
      const KVCache& kc = cache_of(s);
      for (int64_t j = j0; j < j1;) {
        const int64_t end = std::min(j1, kc.page_end(j));
        ops::indexer_scores(ws_.iq.data() + s * nih * ihd, ws_.iw.data() + s * nih, nih, ihd,
                            kc.index_keys(layer) + int64_t(kc.physical(j)) * ihd, end - j,
                            ws_.idx_scratch.data() + s * max_seq + j);
        j = end;
      }
    };
    auto select = [&](int64_t s) {
      const int64_t n = slot_of(s) + 1;
      ws_.topk_count[s] = static_cast<int32_t>(ops::topk_ascending(ws_.idx_scratch.data() + s * max_seq, n, K,
                                                                   ws_.topk.data() + s * K,
                                                                   ws_.idx_tmp.data() + s * max_seq));
    };
    int64_t keys_scored = 0;
    for (int64_t s = 0; s < S; ++s) keys_scored += slot_of(s) + 1;
    const int64_t work = keys_scored * nih * ihd;
    const int threads = pool_ ? pool_->size() : 1;
    ThreadPool* ipool = pool_for(work);
    if (ipool && S < threads) {
      // Few rows (decode, verification): each row's keys in chunks over the threads, then the selections.
      const int64_t G = (threads + S - 1) / S;
      parallel_for(ipool, S * G, 1, [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t s = t / G, g = t % G, n = slot_of(s) + 1, parts = std::min<int64_t>(G, n);
          if (g >= parts) continue;  // fewer keys than chunks
          const auto [j0, j1] = ThreadPool::chunk_range(n, static_cast<int>(parts), static_cast<int>(g));
          score_keys(s, j0, j1);
        }
      });
      for (int64_t s = 0; s < S; ++s) select(s);
    } else {
      parallel_for(ipool && work >= 2 * min_parallel_work() ? ipool : nullptr, S, 1, [&](int64_t s0, int64_t s1, int) {
        for (int64_t s = s0; s < s1; ++s) {
          score_keys(s, 0, slot_of(s) + 1);
          select(s);
        }
      });
    }
  }
  force_rows();  // (where the indexer ran, it chose for these rows too)

  prof.next(sections::kAttention);
  // Sparse MLA over the cached latents, absorbed: q·(W_kb c) = (W_kbᵀ q)·c and out = W_vb (Σ p c), with
  // kv_b_proj used as stored (bf16 / FP8 rows decoded by the kernels, never copied). Three phases:
  //   1. per head, all rows at once (W_kb[h] decoded once per 6 rows):
  //        q_cat [S, nh, kvl + rope] = [W_kb[h]ᵀ q_nope, q_rope];
  //   2. per row, over its selected cache rows [kvl + rope] (latent, then rope part; read in place), per head
  //        scores [nsel] = q_cat·keysᵀ;  p = softmax with the sink;  o_lat [kvl] = Σ_j p_j C[j] (ascending j);
  //   3. per head, all rows at once: out [S, vd] = o_lat · W_vb[h]ᵀ, times the sigmoid gate.
  // Threads take heads in phases 1 and 3; in phase 2 (row, head) pairs when rows are few (decode,
  // verification), whole rows otherwise (prefill, the scores of all heads of a row in one call). Every
  // value is computed by the same kernels in the same order either way (they are batch invariant).
  const Linear& kvb = a.kv_b_proj;
  const float scale = static_cast<float>(c.attn_scale);
  const AttentionScratch sz{nh, kvl, rope, vd, K};
  const int64_t kr = sz.kr();
  float* qcat = ws_.att_q.data();  // [S, nh, kr]
  float* olat = ws_.att_o.data();  // [S, nh, kvl]
  float* vout = ws_.att_v.data();  // [S, nh, vd]
  // Row s's selected cache slots (ascending) as physical rows of its cache's key plane: sel_rows [S, K].
  for (int64_t s = 0; s < S; ++s) {
    const KVCache& kc = cache_of(s);
    const int64_t nsel = ws_.topk_count[s];
    const int32_t* sel = ws_.topk.data() + s * K;
    int32_t* rows = ws_.sel_rows.data() + s * K;
    for (int64_t i = 0; i < nsel; ++i) rows[i] = kc.physical(sel[i]);
  }
  auto absorb = [&](int64_t h) {  // phase 1 for head h
    for (int64_t s = 0; s < S; ++s) {
      float* qc = qcat + (s * nh + h) * kr;
      const float* qh = ws_.q.data() + s * nh * qkd + h * qkd;
      std::fill(qc, qc + kvl, 0.0f);
      std::copy(qh + nope, qh + qkd, qc + kvl);
    }
    ops::matmul_transposed(ws_.q.data() + h * qkd, S, nh * qkd, kvb.rows(h * (nope + vd), nope), qcat + h * kr,
                           nh * kr);
  };
  // Phase 2 for row s, heads [h0, h1): their scores in one pass over the selected keys, then per head the
  // softmax with the sink (which takes part, then is dropped) and the latent sum. sc [h1 - h0, nsel].
  auto heads_row = [&](int64_t s, int64_t h0, int64_t h1, float* sc) {
    const int64_t nsel = ws_.topk_count[s];
    const int32_t* sel = ws_.sel_rows.data() + s * K;
    const float* keys = cache_of(s).keys(layer);
    ops::gathered_dots(qcat + (s * nh + h0) * kr, h1 - h0, kr, keys, kr, sel, nsel, kr, sc, nsel);
    for (int64_t h = h0; h < h1; ++h) {
      float* p = sc + (h - h0) * nsel;
      ops::softmax_with_sink(p, nsel, scale, a.sinks[h]);
      ops::weighted_row_sum(p, keys, nsel, kvl, kr, olat + (s * nh + h) * kvl, sel);
    }
  };
  auto output = [&](int64_t h) {  // phase 3 for head h
    ops::matmul(nullptr, olat + h * kvl, S, kvb.rows(h * (nope + vd) + nope, vd), vout + h * vd, nh * kvl, nh * vd);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t o = (s * nh + h) * vd;
      ops::mul_sigmoid(vout + o, ws_.gate.data() + o, vd, ws_.attn.data() + o);
    }
  };

  const int64_t row_work = nh * ((nope + vd) * kvl + K * (2 * kvl + rope));  // multiply-adds per row
  const int threads = pool_ ? pool_->size() : 1;
  const bool few_rows = S < 2 * threads && S <= kHeadParallelRows;
  ThreadPool* hpool = pool_for(S * row_work);
  if (hpool && few_rows && nh >= threads) {
    // Decode and verification with at least a head per thread: a head's three phases need nothing from the
    // other heads, so each thread runs whole heads after a single hand-off.
    parallel_for(hpool, nh, 1, [&](int64_t h0, int64_t h1, int tid) {
      float* sc = ws_.att_scratch.data() + tid * sz.floats();
      for (int64_t h = h0; h < h1; ++h) absorb(h);
      for (int64_t s = 0; s < S; ++s) heads_row(s, h0, h1, sc);
      for (int64_t h = h0; h < h1; ++h) output(h);
    });
  } else {
    parallel_for(hpool, nh, 1, [&](int64_t h0, int64_t h1, int) {
      for (int64_t h = h0; h < h1; ++h) absorb(h);
    });
    if (hpool && few_rows) {  // (row, head) pairs over the threads
      parallel_for(hpool, S * nh, 1, [&](int64_t t0, int64_t t1, int tid) {
        float* sc = ws_.att_scratch.data() + tid * sz.floats();
        for (int64_t t = t0; t < t1; ++t) heads_row(t / nh, t % nh, t % nh + 1, sc);
      });
    } else {  // whole rows: the scores of all heads of a row in one call
      ThreadPool* apool = hpool && S * row_work >= 2 * min_parallel_work() ? hpool : nullptr;
      parallel_for(apool, S, 1, [&](int64_t s0, int64_t s1, int tid) {
        float* sc = ws_.att_scratch.data() + tid * sz.floats();
        for (int64_t s = s0; s < s1; ++s) heads_row(s, 0, nh, sc);
      });
    }
    parallel_for(hpool, nh, 1, [&](int64_t h0, int64_t h1, int) {
      for (int64_t h = h0; h < h1; ++h) output(h);
    });
  }
  prof.next(sections::kOutput);
  ops::matmul(pool_, ws_.attn.data(), S, a.o_proj, ws_.y.data());  // [S, H]
  for (const HYV4RowSpan& sp : spans_)
    if (sp.last_topk) {
      const int64_t last = sp.first_row + sp.rows - 1;
      const int32_t* sel = ws_.topk.data() + last * K;
      sp.last_topk->assign(sel, sel + ws_.topk_count[last]);
      for (int32_t& p : *sp.last_topk) p += static_cast<int32_t>(sp.cache->base_position());
    }
}

// xn [S, H] -> y [S, H]
size_t HYV4CpuBlocks::ffn(const FfnWeights& F) {
  const int64_t S = S_;
  const float* x = ws_.xn.data();
  float* out = ws_.y.data();
  size_t routed_bytes = 0;
  const HYV4Config& c = cfg_;
  const int64_t H = c.hidden_size;
  // A SwiGLU MLP (expert_jobs.h) on all threads, with the workspace's buffers
  auto mlp = [&](const Linear& g, const Linear& u, const Linear& d, float limit, const float* in, int64_t rows,
                 float* dst) { swiglu_mlp(pool_, g, u, d, limit, in, rows, ws_.ffn_a.data(), ws_.ffn_b.data(), dst); };
  if (!F.sparse) {
    const profile::Sections prof(sections::kDenseMlp);
    if (F.gate_proj.out > 0)
      mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, out);
    else  // a tensor-parallel rank with no features of this MLP
      std::fill(out, out + S * H, 0.0f);
    return 0;
  }
  profile::Sections prof(sections::kRouter);
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  ops::matmul(pool_, x, S, F.router, ws_.router.data());  // [S, E]
  route_tokens(c, F, ws_.router.data(), S, ws_.expert_ids.data(), ws_.expert_w.data());
  // Gather each used expert's tokens (experts in ascending id, rows grouped by expert). The experts then
  // run as independent jobs — one thread streams a whole expert, instead of every expert's three
  // matrices being split across threads with a hand-off each — and the results are added per token in
  // ascending expert order (batch and thread invariant).
  const float limit = static_cast<float>(c.swiglu_limit);
  int64_t njobs = 0, n = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (F.expert_gate[e].out == 0) continue;  // another tensor-parallel rank's expert
    const int64_t first = n;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < k; ++i)
        if (ws_.expert_ids[s * k + i] == e) {
          ws_.expert_rows[n] = static_cast<int32_t>(s * k + i);
          std::copy(x + s * H, x + (s + 1) * H, ws_.gathered.data() + n * H);
          ++n;
        }
    if (n > first) ws_.expert_jobs[njobs++] = {static_cast<int32_t>(e), first, n - first};
  }
  prof.next(sections::kExperts);
  const int threads = pool_ ? pool_->size() : 1;
  const int64_t I = c.moe_intermediate_size;
  float* shared_out = ws_.shared_out.data();  // [S, H]
  // Job j < njobs is routed expert jobs[j].expert on its gathered rows; job njobs, if any, the shared expert
  // on all S rows (models/common/expert_jobs.h).
  ExpertJob* jobs = ws_.expert_jobs.data();
  for (int64_t j = 0; j < njobs; ++j) {
    const int32_t e = jobs[j].expert;
    const Linear &g = F.expert_gate[e], &u = F.expert_up[e], &d = F.expert_down[e];
    routed_bytes += swiglu_bytes(g, u, d);
    jobs[j].cost = swiglu_job_cost(g, u, d, jobs[j].rows);
  }
  const int64_t n_all = njobs + (F.has_shared ? 1 : 0);
  if (F.has_shared) jobs[njobs] = {-1, 0, S, swiglu_job_cost(F.gate_proj, F.up_proj, F.down_proj, S)};
  int64_t total_cost = 0;
  for (int64_t j = 0; j < n_all; ++j) total_cost += jobs[j].cost;
  const int64_t scratch_floats = static_cast<int64_t>(ws_.expert_scratch.size()) / std::max(1, threads);
  auto run_job = [&](const ExpertJob& job, int tid) {
    const bool shared = job.expert < 0;
    const Linear& g = shared ? F.gate_proj : F.expert_gate[job.expert];
    const Linear& u = shared ? F.up_proj : F.expert_up[job.expert];
    const Linear& d = shared ? F.down_proj : F.expert_down[job.expert];
    float* act = ws_.expert_scratch.data() + int64_t(tid) * scratch_floats;  // [rows, I] gate, then [rows, I] up
    swiglu_mlp(nullptr, g, u, d, shared ? 0.0f : limit, shared ? x : ws_.gathered.data() + job.first * H, job.rows,
               act, act + job.rows * g.out, shared ? shared_out : ws_.expert_out.data() + job.first * H);
  };
  // Tiny experts cost less than a hand-off: below the pool's threshold they run on the calling thread.
  const bool parallel = pool_for(total_cost) != nullptr;
  // A shared expert that streams from memory (shared_split_bytes_, 1 MB, and more) is not a job: whole jobs
  // leave the threads uneven (5 equal experts on 2 threads run as 3 + 2), so it runs after the routed
  // jobs, split over all threads (synthetic FP8 on 2 threads: 61-63 -> 65-67 tokens/s). Small ones (the
  // bundled model's, 74 KB) are cheaper whole than split (k = 3 speculation 4% faster as a job).
  const bool shared_apart = F.has_shared && swiglu_bytes(F.gate_proj, F.up_proj, F.down_proj) >= tuning_.shared_split_bytes;
  const int64_t n_jobs = shared_apart ? njobs : n_all;  // whole jobs
  const bool split = parallel && n_jobs < threads;
  if (split) {
    // Fewer experts than threads (decode on many cores): every expert matrix, the shared expert's too, is
    // cut into column chunks over all threads; gate/up (+ SwiGLU) first, then down: two hand-offs in all.
    struct Part {
      const Linear *g, *u, *d;
      const float* in;
      int64_t rows, I;
      float limit;
      float* act;  // [rows, I] gate -> activation, then [rows, I] up
      float* dst;  // [rows, H]
    };
    static thread_local std::vector<Part> part_buf;
    part_buf.resize(static_cast<size_t>(njobs + 1));
    Part* parts = part_buf.data();
    int64_t np = 0, off = 0;
    for (int64_t j = 0; j < njobs; ++j) {
      const ExpertJob& job = ws_.expert_jobs[j];
      parts[np++] = {&F.expert_gate[job.expert], &F.expert_up[job.expert], &F.expert_down[job.expert],
                     ws_.gathered.data() + job.first * H, job.rows, I, limit, ws_.moe_act.data() + off,
                     ws_.expert_out.data() + job.first * H};
      off += 2 * job.rows * I;
    }
    if (F.has_shared)
      parts[np++] = {&F.gate_proj, &F.up_proj, &F.down_proj, x, S, F.gate_proj.out, 0.0f, ws_.moe_act.data() + off,
                     shared_out};
    // Each phase splits the concatenation of all parts' output columns evenly over the threads (grain 16):
    // phase 1 the gate/up columns [0, I) of every part, phase 2 the down columns [0, H).
    auto phase = [&](auto width_of, auto run) {
      int64_t total = 0;
      for (int64_t p = 0; p < np; ++p) total += width_of(parts[p]);
      parallel_for(pool_, total, 16, [&](int64_t n0, int64_t n1, int) {
        int64_t base = 0;
        for (int64_t p = 0; p < np; ++p) {
          const int64_t w = width_of(parts[p]);
          const int64_t c0 = std::max(n0, base) - base, c1 = std::min(n1, base + w) - base;
          if (c0 < c1) run(parts[p], c0, c1);
          base += w;
        }
      });
    };
    phase([](const Part& q) { return q.I; },
          [&](const Part& q, int64_t c0, int64_t c1) {
            float* g = q.act;
            float* u = q.act + q.rows * q.I;
            const Linear gs = q.g->rows(c0, c1 - c0), us = q.u->rows(c0, c1 - c0);
            const ops::MatmulOut gu[2] = {{&gs, g + c0, q.I}, {&us, u + c0, q.I}};
            ops::matmul_many(nullptr, q.in, q.rows, gu, 2);
            for (int64_t r = 0; r < q.rows; ++r)
              ops::swiglu(g + r * q.I + c0, u + r * q.I + c0, c1 - c0, q.limit, g + r * q.I + c0);
          });
    phase([&](const Part&) { return H; },
          [&](const Part& q, int64_t h0, int64_t h1) {
            ops::matmul(nullptr, q.act, q.rows, q.d->rows(h0, h1 - h0), q.dst + h0, q.I, H);
          });
  } else if (parallel) {
    // At least as many jobs as threads: whole jobs per thread (expert_jobs.h), one hand-off.
    run_expert_jobs(*pool_, jobs, n_jobs, run_job);
  } else {
    for (int64_t j = 0; j < njobs; ++j) {
      const ExpertJob& job = ws_.expert_jobs[j];
      mlp(F.expert_gate[job.expert], F.expert_up[job.expert], F.expert_down[job.expert], limit,
          ws_.gathered.data() + job.first * H, job.rows, ws_.expert_out.data() + job.first * H);
    }
  }
  std::fill(out, out + S * H, 0.0f);
  for (int64_t r = 0; r < n; ++r) {  // rows are in ascending expert order
    const int64_t slot = ws_.expert_rows[r], s = slot / k;
    const float wt = ws_.expert_w[slot];
    const float* src = ws_.expert_out.data() + r * H;
    float* dst = out + s * H;
    for (int64_t i = 0; i < H; ++i) dst[i] += src[i] * wt;
  }
  if (F.has_shared) {
    if (!parallel || (shared_apart && !split)) mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, shared_out);
    for (int64_t i = 0; i < S * H; ++i) out[i] += shared_out[i];
  }
  return routed_bytes;
}

}  // namespace nextn
