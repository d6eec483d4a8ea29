// Qwen4-Exp forward on the ops layer (model.h has the data flow). Every row's values are computed by the same
// instructions whatever the batch: rows only meet in the QSA keys and the recurrent state of their own
// sequence, read in position order.
#include "models/qwen4_exp/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/finite.h"
#include "core/sizes.h"
#include "core/threadpool.h"
#include "models/common/scan.h"

namespace nextn {

namespace {

// Draft rows a forced (reused) selection may add after step 0's query: the rest of one round.
constexpr int64_t kMaxDraftExtension = 64;

float silu(float x) { return x / (1.0f + std::exp(-x)); }
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

void softmax_scaled(float* x, int64_t n, float scale) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i] * scale);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] * scale - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

template <class V>
void grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

size_t swiglu_bytes(const Linear& g, const Linear& u, const Linear& d) {
  return g.weight_bytes() + u.weight_bytes() + d.weight_bytes();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Sequences

Qwen4ExpSequence::Qwen4ExpSequence(const Qwen4ExpModel* owner, KVCache kv, int64_t capacity, int64_t slots,
                                   int64_t slot_floats, bool has_kv, std::shared_ptr<int64_t> live)
    : owner_(owner), kv_(std::move(kv)), capacity_(capacity), slots_(slots), slot_floats_(slot_floats),
      has_kv_(has_kv), live_(std::move(live)) {
  tokens_.reserve(static_cast<size_t>(capacity));
  states_.assign(static_cast<size_t>(slots * slot_floats), 0.0f);  // the state of length 0 is all zeros
  ++*live_;
}

Qwen4ExpSequence::~Qwen4ExpSequence() { --*live_; }

void Qwen4ExpSequence::rollback(int64_t n) {
  if (n < 0 || n > length()) throw Error("rollback: length " + std::to_string(n) + " outside [0, " +
                                         std::to_string(length()) + "]");
  // The states of the last `slots` lengths are kept (slot n mod slots): a verify of k + 1 <= slots rows can
  // keep any of its rows (the first is always kept: it is the target's own token).
  if (length() - n >= slots_)
    throw Error("rollback: " + std::to_string(length() - n) + " positions back, but the recurrent state keeps " +
                std::to_string(slots_ - 1) + " (a verify of more rows than MemoryOptions::max_verify_rows)");
  tokens_.resize(static_cast<size_t>(n));
  if (has_kv_) kv_.truncate(n);
}

// ---------------------------------------------------------------------------------------------------
// Loading and facts

Qwen4ExpModel::Qwen4ExpModel(const std::string& model_dir, ThreadPool* pool)
    : dir_(model_dir), cfg_(load_qwen4_exp_config(model_dir)), store_(WeightStore::open_dir(model_dir)), pool_(pool) {
  LoadReport r;
  bind_qwen4_exp_weights(cfg_, store_, w_, r);
  r.print_or_throw(model_dir);
  init_facts();
}

Qwen4ExpModel::~Qwen4ExpModel() = default;

void Qwen4ExpModel::init_facts() {
  facts_.model_type = cfg_.composite ? "qwen4_exp" : "qwen4_exp_text";
  facts_.dir = dir_;
  facts_.vocab_size = cfg_.vocab_size;
  facts_.hidden_width = cfg_.hc_width();
  facts_.context = cfg_.max_position_embeddings;
  facts_.num_mtp_layers = num_mtp_layers();
  facts_.sparse_budget = cfg_.indexer_budget;
  for (int64_t e : cfg_.eos_token_ids) facts_.eos_token_ids.push_back(static_cast<int32_t>(e));
  // Each layer's place in a sequence's memory: QSA layers in KV planes, GDN / PLE state in the slots.
  int64_t off = 0, q = 0;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    const bool linear = cfg_.kinds[i] == Qwen4LayerKind::Linear;
    qsa_index_.push_back(linear ? -1 : static_cast<int>(q++));
    state_off_.push_back(linear ? off : -1);
    if (linear)
      off += int64_t(cfg_.linear_conv_kernel_dim - 1) * cfg_.conv_dim() +
             int64_t(cfg_.linear_num_value_heads) * cfg_.linear_key_head_dim * cfg_.linear_value_head_dim;
    ple_off_.push_back(w_.layers[i].has_ple ? off : -1);
    if (w_.layers[i].has_ple) off += cfg_.ple_conv_state_rows() * cfg_.hc_width();
  }
  slots_ = std::max<int64_t>(memory_.max_verify_rows, 1);
}

// The pool when `work` (multiply-adds) is worth a hand-off now, else null (run on the calling thread): tiny
// models lose more to waking the workers than they gain.
ThreadPool* Qwen4ExpModel::pool_for(int64_t work) {
  return pool_ && pool_->size() > 1 && work >= pool_->min_parallel_work() && pool_->worth_waking(work) ? pool_ : nullptr;
}

void Qwen4ExpModel::prefault(bool progress) const { prefault_weights(store_, dir_, progress); }

size_t Qwen4ExpModel::checkpoint_bytes() const {
  size_t total = 0;
  for (const auto& f : store_.files()) total += f->file_bytes();
  return total;
}

size_t Qwen4ExpModel::weight_bytes_total() const {
  size_t routed = 0;
  for (const auto& L : w_.layers)
    routed += size_t(cfg_.num_experts_per_tok) * swiglu_bytes(L.moe.gate[0], L.moe.up[0], L.moe.down[0]);
  return weight_bytes_with(routed);
}

size_t Qwen4ExpModel::last_forward_weight_bytes() const { return weight_bytes_with(last_routed_bytes_); }

// Weights a target forward reads apart from its routed experts, plus routed_bytes of those.
size_t Qwen4ExpModel::weight_bytes_with(size_t routed_bytes) const {
  size_t total = w_.lm_head.weight_bytes() + routed_bytes;
  auto gr = [](const GatedResidualWeights& g) {
    return g.mix_down.weight_bytes() + g.mix_up.weight_bytes() + (g.inject.data ? g.inject.weight_bytes() : 0);
  };
  total += gr(w_.mixer);
  for (const auto& L : w_.layers) {
    total += gr(L.attn_hc) + gr(L.mlp_hc);
    if (L.kind == Qwen4LayerKind::Linear) {
      const GdnWeights& g = L.gdn;
      total += g.in_qkv.weight_bytes() + g.in_z.weight_bytes() + g.in_a.weight_bytes() + g.in_b.weight_bytes() +
               g.out_proj.weight_bytes();
    } else {
      const QsaWeights& a = L.attn;
      total += a.q_proj.weight_bytes() + a.k_proj.weight_bytes() + a.v_proj.weight_bytes() + a.o_proj.weight_bytes() +
               a.index_qk.weight_bytes();
    }
    const MoeWeights& m = L.moe;
    total += m.router.weight_bytes() + swiglu_bytes(m.shared_gate, m.shared_up, m.shared_down) +
             m.shared_expert_gate.weight_bytes();
    if (L.has_ple) total += L.ple.key_proj.weight_bytes() + L.ple.value_proj.weight_bytes();
  }
  return total;
}

// ---------------------------------------------------------------------------------------------------
// Memory: QSA keys and values in KV pages; recurrent state in per-sequence slots.

std::vector<int64_t> Qwen4ExpModel::plane_widths() const {
  const int64_t kv = int64_t(cfg_.num_key_value_heads) * cfg_.head_dim;
  return {2 * kv, 2 * int64_t(cfg_.indexer_head_dim)};
}

std::vector<LayerPlanes> Qwen4ExpModel::target_planes() const {
  std::vector<LayerPlanes> layers;
  for (int q : qsa_index_)
    if (q >= 0) layers.push_back(LayerPlanes{2 * q, 2 * q + 1});
  return layers;
}

int64_t Qwen4ExpModel::state_slot_floats() const {
  int64_t floats = 0;
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    if (state_off_[i] >= 0)
      floats = std::max(floats, state_off_[i] + int64_t(cfg_.linear_conv_kernel_dim - 1) * cfg_.conv_dim() +
                                    int64_t(cfg_.linear_num_value_heads) * cfg_.linear_key_head_dim *
                                        cfg_.linear_value_head_dim);
    if (ple_off_[i] >= 0) floats = std::max(floats, ple_off_[i] + cfg_.ple_conv_state_rows() * cfg_.hc_width());
  }
  return floats;
}

int64_t Qwen4ExpModel::state_bytes() const {
  return checked_mul(checked_mul(slots_, state_slot_floats(), "recurrent state"), int64_t(sizeof(float)),
                     "recurrent state");
}

int64_t Qwen4ExpModel::kv_bytes_per_position(bool drafting) const {
  const auto widths = plane_widths();
  const int64_t per_layer = KVPool::bytes_per_page(widths, 1);
  int64_t layers = static_cast<int64_t>(target_planes().size());
  if (drafting) layers += num_mtp_layers();
  return per_layer * layers;
}

int64_t Qwen4ExpModel::sequence_bytes(int64_t capacity, bool drafting) const {
  return checked_add(checked_mul(capacity, kv_bytes_per_position(drafting), "a sequence's KV cache"), state_bytes(),
                     "a sequence's memory");
}

// (ensure_pools gives a quarter of the bytes, at most, to recurrent state: enough for all of them, and three
// quarters for their pages)
int64_t Qwen4ExpModel::memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const {
  const std::string what = "the KV memory of " + std::to_string(sequences) + " sequences";
  const int64_t pages = (capacity + page_tokens - 1) / page_tokens;
  const int64_t kv = checked_mul(checked_mul(sequences, pages * page_tokens, what), kv_bytes_per_position(true), what);
  const int64_t state = checked_mul(sequences, state_bytes(), what);
  return std::max(checked_mul(state, 4, what), checked_add(kv / 3 * 4, page_tokens * kv_bytes_per_position(true), what)) +
         4 * state_bytes();
}

void Qwen4ExpModel::configure_memory(const MemoryOptions& options) {
  if (target_pool_) throw Error("configure_memory: the KV pool is already in use");
  if (options.page_tokens < 1 || options.page_tokens > 4096) throw Error("KV page size must be in 1..4096 positions");
  if (options.kv_cache_bytes < 0) throw Error("KV cache size must not be negative");
  if (options.max_verify_rows < 1 || options.max_verify_rows > 64)
    throw Error("max_verify_rows must be in 1..64 (k + 1 of the largest speculative round)");
  memory_ = options;
  slots_ = options.max_verify_rows;
}

// Pools are made at the first sequence. With --kv-cache-mb the bytes cover the KV pages and the recurrent
// state: a quarter (at most) goes to the state of as many sequences as it holds, the rest to pages. By default
// the pages hold one sequence as long as the context and the state 16 sequences.
void Qwen4ExpModel::ensure_pools() {
  if (target_pool_) return;
  const int64_t page = memory_.page_tokens;
  const auto widths = plane_widths();
  std::vector<int64_t> target_widths;
  for (size_t i = 0; i < target_planes().size(); ++i) target_widths.insert(target_widths.end(), widths.begin(), widths.end());
  if (target_widths.empty()) target_widths.push_back(1);  // no QSA layer: an empty pool the caches never use
  const int64_t nl = num_mtp_layers();
  const int64_t t = KVPool::bytes_per_page(target_widths, page), d = nl * KVPool::bytes_per_page(widths, page);
  const int64_t sb = state_bytes();
  int64_t target_pages;
  if (memory_.kv_cache_bytes > 0) {
    state_sets_ = sb > 0 ? std::max<int64_t>(1, memory_.kv_cache_bytes / 4 / sb) : 0;
    const int64_t kv_bytes = memory_.kv_cache_bytes - state_sets_ * sb;
    target_pages = kv_bytes / (t + d);
    if (target_pages < 1)
      throw Error("--kv-cache-mb: " + gib(memory_.kv_cache_bytes) + " holds no KV page next to one sequence's " +
                  gib(sb) + " of recurrent state (a page of " + std::to_string(page) + " positions takes " +
                  std::to_string(t + d) + " bytes)");
  } else {
    const int64_t context = cfg_.max_position_embeddings;
    state_sets_ = sb > 0 ? 16 : 0;
    require_memory(checked_add(sequence_bytes(context, true), 15 * sb, "the KV pool"),
                   "a KV cache of " + std::to_string(context) +
                       " positions (the context; set a smaller one with --kv-cache-mb)");
    target_pages = (context + page - 1) / page;
  }
  target_pool_ = std::make_shared<KVPool>("KV cache", target_widths, page, target_pages);
  draft_pool_ = std::make_shared<KVPool>("MTP draft KV cache", widths, page, std::max<int64_t>(target_pages * nl, 1));
}

bool Qwen4ExpModel::can_admit(int64_t capacity, bool drafting) const {
  if (!target_pool_) return could_ever_admit(capacity, drafting);
  if (state_sets_ > 0 && *live_states_ >= state_sets_) return false;
  const int64_t pages = target_pool_->pages_for(capacity);
  return pages <= target_pool_->unreserved_pages() &&
         (!drafting || num_mtp_layers() == 0 || pages * num_mtp_layers() <= draft_pool_->unreserved_pages());
}

bool Qwen4ExpModel::could_ever_admit(int64_t capacity, bool drafting) const {
  if (capacity > cfg_.max_position_embeddings) return false;
  if (!target_pool_) return memory_.kv_cache_bytes <= 0 || sequence_bytes(capacity, drafting) <= memory_.kv_cache_bytes;
  const int64_t pages = target_pool_->pages_for(capacity);
  return pages <= target_pool_->pages() && (!drafting || pages * num_mtp_layers() <= draft_pool_->pages());
}

double Qwen4ExpModel::kv_usage() const {
  if (!target_pool_ || target_pool_->pages() == 0) return 0.0;
  return 1.0 - double(target_pool_->unreserved_pages()) / double(target_pool_->pages());
}

std::string Qwen4ExpModel::memory_summary() const {
  if (!target_pool_) return "KV pool not allocated yet";
  return target_pool_->describe() + ", " + draft_pool_->describe() + ", recurrent state " + gib(state_bytes()) +
         " per sequence (" + std::to_string(slots_) + " slots; " + std::to_string(*live_states_) + " of " +
         (state_sets_ > 0 ? std::to_string(state_sets_) : std::string("unbounded")) + " in use)";
}

std::unique_ptr<SequenceState> Qwen4ExpModel::new_sequence(int64_t capacity) {
  if (capacity < 1 || capacity > cfg_.max_position_embeddings)
    throw Error("a sequence of " + std::to_string(capacity) + " positions: outside the model's context (" +
                "max_position_embeddings = " + std::to_string(cfg_.max_position_embeddings) + ")");
  if (!could_ever_admit(capacity, false))
    throw Error("a sequence of " + std::to_string(capacity) + " positions needs " + gib(sequence_bytes(capacity, true)) +
                " of KV cache and recurrent state, more than the KV pool holds (" + gib(memory_.kv_cache_bytes) +
                "; raise --kv-cache-mb or shorten max_tokens)");
  ensure_pools();
  if (state_sets_ > 0 && *live_states_ >= state_sets_)
    throw Error("the recurrent state of " + std::to_string(state_sets_) + " sequences is in use (raise --kv-cache-mb)");
  require_memory(state_bytes(), "a sequence's recurrent state");
  const auto planes = target_planes();
  const bool has_kv = !planes.empty();
  KVCache kv = has_kv ? KVCache(target_pool_, planes, capacity) : KVCache();
  return std::make_unique<Qwen4ExpSequence>(this, std::move(kv), capacity, slots_, state_slot_floats(), has_kv,
                                            live_states_);
}

KVCache Qwen4ExpModel::new_shared_draft_cache(int64_t capacity) {
  ensure_pools();
  return KVCache(draft_pool_, {LayerPlanes{0, 1}}, capacity);
}

std::unique_ptr<DraftSession> Qwen4ExpModel::new_draft_session(SequenceState& sequence, const DraftOptions& options) {
  if (num_mtp_layers() == 0) return nullptr;
  auto* seq = dynamic_cast<Qwen4ExpSequence*>(&sequence);
  if (!seq || seq->owner() != this) throw Error("new_draft_session: the sequence does not belong to this model");
  return std::make_unique<ChainedDraftSession<Qwen4ExpModel>>(*this, seq->capacity(), options);
}

void Qwen4ExpModel::prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) {
  if (num_mtp_layers() == 0) throw Error(dir_ + ": the checkpoint has no MTP layers (mtp.layers.*)");
  if (T < 2) return;
  const int64_t page = std::clamp<int64_t>(T, 1, memory_.page_tokens);
  auto pool = std::make_shared<KVPool>("MTP draft KV cache", plane_widths(), page, (T + page - 1) / page);
  KVCache dc(pool, {LayerPlanes{0, 1}}, T);
  draft_forward(0, tokens + 1, hidden, T - 1, 0, dc, logits, nullptr, nullptr, nullptr);
}

void Qwen4ExpModel::reserve_batch(int64_t rows, int64_t positions) {
  ensure_rows(std::max<int64_t>(rows, 1));
  ensure_thread_scratch(std::max<int64_t>(positions, 1));
  spans_.reserve(static_cast<size_t>(rows));
  row_span_.reserve(static_cast<size_t>(rows));
}

// ---------------------------------------------------------------------------------------------------
// Buffers

void Qwen4ExpModel::ensure_rows(int64_t S) {
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
  grow(b_.ew, S * 2 * c.moe_intermediate_size);
  grow(b_.eo, S * H);
  grow(b_.shared, S * H);
  grow(b_.sgate, S);
  grow(b_.emb, S * c.ple_embed_dim);
  grow(b_.rope, S * c.rope.dim);
  grow(b_.rope1, c.rope.dim);
  grow(b_.expert_ids, S * c.num_experts_per_tok);
  grow(b_.expert_w, S * c.num_experts_per_tok);
  grow(b_.expert_rows, S);
  const int64_t window_rows = std::max<int64_t>(c.linear_conv_kernel_dim - 1, c.ple_conv_state_rows()) + S;
  grow(b_.window, window_rows * std::max(c.conv_dim(), CH));
}

// Per-thread scratch of the GDN head tasks and the QSA row tasks, for caches of up to `positions`.
void Qwen4ExpModel::ensure_thread_scratch(int64_t positions) {
  const Qwen4ExpConfig& c = cfg_;
  if (positions <= max_positions_ && !b_.thread.empty()) return;
  max_positions_ = std::max(max_positions_, positions);
  const int threads = pool_ ? pool_->size() : 1;
  const int64_t gdn = int64_t(c.linear_key_head_dim) * c.linear_value_head_dim + 2 * c.linear_value_head_dim;
  int64_t qsa = 0, ints = 1;
  if (c.has_qsa()) {
    const int64_t nb = max_positions_ / c.indexer_compress_ratio + 1;
    const int64_t sel = c.indexer_budget + c.indexer_compress_ratio + kMaxDraftExtension;
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
void Qwen4ExpModel::gated_residual(const GatedResidualWeights& g, const float* X, int64_t S, float* x_out,
                                   float* inj_out) {
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_count, CH = C * H, r = cfg_.hc_lowrank;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  float* Xn = b_.Xn.data();
  grouped_norm(X, S, C, H, g.hc_norm.data(), eps, Xn);
  float* mid = b_.mid.data();
  ops::matmul(pool_, Xn, S, g.mix_down, mid);  // [S, rank]
  for (int64_t i = 0; i < S * r; ++i) mid[i] = silu(mid[i] / static_cast<float>(C));
  float* wgt = b_.rows_out.data();
  ops::matmul(pool_, mid, S, g.mix_up, wgt);  // [S, C·H]
  for (int64_t s = 0; s < S; ++s) {
    const float* w = wgt + s * CH;
    const float* xn = Xn + s * CH;
    float* x = x_out + s * H;
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += ops::sigmoid(w[c * H + h]) * xn[c * H + h];
      x[h] = acc / static_cast<float>(C);  // the mean over the streams
    }
  }
  if (!inj_out) return;
  ops::matmul(pool_, Xn, S, g.inject, inj_out);  // [S, C]
  for (int64_t i = 0; i < S * C; ++i) inj_out[i] = 2.0f * ops::sigmoid(inj_out[i] / static_cast<float>(C));
}

void Qwen4ExpModel::inject(const float* y, const float* inj, int64_t S, float* X) {
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
void Qwen4ExpModel::gdn(const GdnWeights& g, int layer, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t K = c.linear_conv_kernel_dim, CD = c.conv_dim(), Kd = c.linear_key_dim();
  const int64_t nv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t group = nv / c.linear_num_key_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* qkv = b_.qkv.data();
  float* z = b_.z.data();
  float* ab = b_.ab.data();  // [S, nv] b, then [S, nv] a
  const ops::MatmulOut outs[] = {{&g.in_qkv, qkv, -1}, {&g.in_z, z, -1}, {&g.in_b, ab, -1}, {&g.in_a, ab + S * nv, -1}};
  ops::matmul_many(pool_, x, S, outs, 4);
  float* conv = b_.conv.data();
  const int64_t conv_state = (K - 1) * CD;
  for (const RowSpan& sp : spans_) {
    // Window: the K-1 inputs before the span (the state), then its rows.
    float* win = b_.window.data();
    const float* st = sp.seq->state(sp.pos0) + state_off_[layer];
    std::copy(st, st + conv_state, win);
    std::copy(qkv + sp.first_row * CD, qkv + (sp.first_row + sp.rows) * CD, win + conv_state);
    for (int64_t i = 0; i < sp.rows; ++i) {
      float* out = conv + (sp.first_row + i) * CD;
      for (int64_t ch = 0; ch < CD; ++ch) {
        const float* wk = g.conv.data() + ch * K;
        float acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += wk[j] * win[(i + j) * CD + ch];
        out[ch] = silu(acc);
      }
      const int64_t len = sp.pos0 + i + 1;
      if (len > sp.pos0 + sp.rows - slots_) {
        float* dst = sp.seq->state(len) + state_off_[layer];
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
  float* core = b_.core.data();
  const int64_t tasks = static_cast<int64_t>(spans_.size()) * nv;
  const int64_t rec_off = conv_state;
  auto head_task = [&](int64_t begin, int64_t end, int thread) {
    float* Sm = b_.thread.data() + int64_t(thread) * b_.thread_floats;  // [dk, dv]
    float* kv_mem = Sm + dk * dv;
    for (int64_t t = begin; t < end; ++t) {
      const RowSpan& sp = spans_[t / nv];
      const int64_t h = t % nv, kh = h / group;
      const float* st = sp.seq->state(sp.pos0) + state_off_[layer] + rec_off + h * dk * dv;
      std::copy(st, st + dk * dv, Sm);
      for (int64_t i = 0; i < sp.rows; ++i) {
        const int64_t row = sp.first_row + i;
        const float* q = conv + row * CD + kh * dk;
        const float* k = conv + row * CD + Kd + kh * dk;
        const float* v = conv + row * CD + 2 * Kd + h * dv;
        const float beta = ops::sigmoid(ab[row * nv + h]);
        const float decay = std::exp(g.neg_A[h] * softplus(ab[S * nv + row * nv + h] + g.dt_bias[h]));
        for (int64_t e = 0; e < dk * dv; ++e) Sm[e] *= decay;
        std::fill(kv_mem, kv_mem + dv, 0.0f);
        for (int64_t a = 0; a < dk; ++a)
          for (int64_t e = 0; e < dv; ++e) kv_mem[e] += Sm[a * dv + e] * k[a];
        for (int64_t e = 0; e < dv; ++e) kv_mem[e] = (v[e] - kv_mem[e]) * beta;  // delta
        for (int64_t a = 0; a < dk; ++a)
          for (int64_t e = 0; e < dv; ++e) Sm[a * dv + e] += k[a] * kv_mem[e];
        float* o = core + row * c.linear_value_dim() + h * dv;
        std::fill(o, o + dv, 0.0f);
        for (int64_t a = 0; a < dk; ++a)
          for (int64_t e = 0; e < dv; ++e) o[e] += Sm[a * dv + e] * q[a];
        const int64_t len = sp.pos0 + i + 1;
        if (len > sp.pos0 + sp.rows - slots_) {
          float* dst = sp.seq->state(len) + state_off_[layer] + rec_off + h * dk * dv;
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
  const bool sigmoid_gate = (c.output_gate_type.empty() ? c.hidden_act : c.output_gate_type) == "sigmoid";
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < nv; ++h) {
      float* o = core + s * c.linear_value_dim() + h * dv;
      const float* zz = z + s * c.linear_value_dim() + h * dv;
      const float r = ops::inv_rms(o, dv, eps);
      for (int64_t e = 0; e < dv; ++e) {
        const float gate = sigmoid_gate ? ops::sigmoid(zz[e]) : silu(zz[e]);
        o[e] = g.norm[e] * (o[e] * r) * gate;
      }
    }
  ops::matmul(pool_, core, S, g.out_proj, y);
}

// QSA attention. Every row's key, value and raw indexer key are written first, then each block of
// compress_ratio slots completed by these rows gets its pooled key (mean of the raw keys, k_layernorm, RoPE at
// the block's first position). A query at slot s sees slots 0..s: its complete blocks are scored by
// Σ_heads relu(q·k)/√d, the block_topk best are kept with the tail of the incomplete block, and attention runs
// over those slots (all of them while there are no more blocks than block_topk).
void Qwen4ExpModel::qsa(const QsaWeights& a, size_t cache_layer, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads, kvd = nkv * hd;
  const int64_t ih = c.indexer_n_heads, ihd = c.indexer_head_dim, ratio = c.indexer_compress_ratio;
  const int64_t half = c.rope.dim / 2, group = nh / nkv;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float af = static_cast<float>(c.rope.attention_factor);
  float* q = b_.q.data();
  float* k = b_.k.data();
  float* v = b_.v.data();
  float* iq = b_.iq.data();
  const ops::MatmulOut outs[] = {{&a.q_proj, q, -1}, {&a.k_proj, k, -1}, {&a.v_proj, v, -1}, {&a.index_qk, iq, -1}};
  ops::matmul_many(pool_, x, S, outs, 4);
  auto add_bias = [](float* m, int64_t rows, const std::vector<float>& bias) {
    if (bias.empty()) return;
    const int64_t n = static_cast<int64_t>(bias.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) m[r * n + j] += bias[j];
  };
  add_bias(q, S, a.q_bias);
  add_bias(k, S, a.k_bias);
  add_bias(v, S, a.v_bias);
  float* rope = b_.rope.data();  // [S, dim]: cos, then sin
  for (const RowSpan& sp : spans_) {
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
  const int64_t sel_cap = c.indexer_budget + ratio + kMaxDraftExtension;
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
      const RowSpan& sp = spans_[row_span_[row]];
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
  for (const RowSpan& sp : spans_)
    if (sp.last_topk) sp.last_topk->reserve(static_cast<size_t>(sel_cap));
  // Work of a row: its attention over up to sel_cap keys, and scoring every block of its sequence.
  int64_t work = 0;
  for (const RowSpan& sp : spans_)
    work += sp.rows * (2 * nh * hd * std::min<int64_t>(sel_cap, sp.slot0 + sp.rows) +
                       ih * ihd * ((sp.slot0 + sp.rows) / ratio));
  if (ThreadPool* p = pool_for(work); p && S > 1)
    p->parallel_for(S, 1, row_task);
  else
    row_task(0, S, 0);
  ops::matmul(pool_, out, S, a.o_proj, y);
  add_bias(y, S, a.o_bias);
}

// MoE: softmax router over all experts, the top k (renormalized when norm_topk_prob), each expert run over the
// rows that chose it, summed per row in ascending expert order; plus the shared expert scaled by
// sigmoid(shared_expert_gate(x)).
void Qwen4ExpModel::moe(const MoeWeights& m, const float* x, int64_t S, float* y) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, E = c.num_experts, topk = c.num_experts_per_tok, I = c.moe_intermediate_size;
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
  std::fill(y, y + S * H, 0.0f);
  float* xe = b_.eh.data();
  float* gu = b_.ew.data();
  float* eo = b_.eo.data();
  int32_t* rows = b_.expert_rows.data();
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t j = 0; j < topk; ++j)
        if (ids[s * topk + j] == e) rows[n++] = static_cast<int32_t>(s * topk + j);
    if (n == 0) continue;
    routed_bytes_ += swiglu_bytes(m.gate[e], m.up[e], m.down[e]);
    for (int64_t r = 0; r < n; ++r) std::copy(x + (rows[r] / topk) * H, x + (rows[r] / topk + 1) * H, xe + r * H);
    const ops::MatmulOut o2[] = {{&m.gate[e], gu, 2 * I}, {&m.up[e], gu + I, 2 * I}};
    ops::matmul_many(pool_, xe, n, o2, 2);
    for (int64_t r = 0; r < n; ++r) ops::swiglu(gu + r * 2 * I, gu + r * 2 * I + I, I, 0.0f, gu + r * 2 * I);
    ops::matmul(pool_, gu, n, m.down[e], eo, 2 * I);
    for (int64_t r = 0; r < n; ++r) {
      const float w = wts[rows[r]];
      float* dst = y + (rows[r] / topk) * H;
      for (int64_t h = 0; h < H; ++h) dst[h] += eo[r * H + h] * w;
    }
  }
  // Shared expert.
  const int64_t Is = c.shared_expert_intermediate_size;
  float* sgu = b_.wide.data();
  float* sg = b_.sgate.data();
  const ops::MatmulOut o3[] = {{&m.shared_gate, sgu, 2 * Is}, {&m.shared_up, sgu + Is, 2 * Is}, {&m.shared_expert_gate, sg, 1}};
  ops::matmul_many(pool_, x, S, o3, 3);
  for (int64_t s = 0; s < S; ++s) ops::swiglu(sgu + s * 2 * Is, sgu + s * 2 * Is + Is, Is, 0.0f, sgu + s * 2 * Is);
  float* sh = b_.shared.data();
  ops::matmul(pool_, sgu, S, m.shared_down, sh, 2 * Is);
  for (int64_t s = 0; s < S; ++s) {
    const float gate = ops::sigmoid(sg[s]);
    for (int64_t h = 0; h < H; ++h) y[s * H + h] += gate * sh[s * H + h];
  }
}

// PLE: the hashed n-gram embedding of each row's token history, gating one value per stream by the stream's
// normed activation, plus a dilated causal conv over the normed gated values. out [S, C·H] is added to X.
void Qwen4ExpModel::ple(const PleWeights& p, int layer, const float* X, int64_t S, float* out) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = C * H, E = c.ple_embed_dim, dph = c.ple_head_dim();
  const int n = c.ngram_size, hpn = c.heads_per_ngram;
  const int64_t eos = c.eos_id();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* emb = b_.emb.data();
  int64_t shifted[Qwen4ExpLimits::kNgram];
  for (const RowSpan& sp : spans_) {
    const std::vector<int32_t>& toks = sp.seq->tokens();
    for (int64_t i = 0; i < sp.rows; ++i) {
      const int64_t pos = sp.pos0 + i;
      // shifted[s]: the token s back, or eos when that crosses the start or an eos (the n-gram resets there).
      shifted[0] = toks[pos];
      for (int sh = 1; sh < n; ++sh) {
        const int64_t src = pos - sh;
        bool valid = src >= 0;
        for (int64_t t = std::max<int64_t>(src, 0); valid && t < pos; ++t) valid = toks[t] != eos;
        shifted[sh] = valid ? toks[src] : eos;
      }
      float* e = emb + (sp.first_row + i) * E;
      for (int g = 2; g <= n; ++g) {
        int64_t mixed = shifted[0] * p.multipliers[0];
        for (int s = 1; s < g; ++s) mixed ^= shifted[s] * p.multipliers[s];
        for (int hh = 0; hh < hpn; ++hh) {
          const int head = (g - 2) * hpn + hh;
          const int64_t id = mixed % p.head_sizes[head] + p.head_offsets[head];
          const size_t shard =
              std::upper_bound(p.shard_starts.begin(), p.shard_starts.end(), id) - p.shard_starts.begin() - 1;
          ops::dequant_row(p.table_shards[shard], id - p.shard_starts[shard], e + head * dph);
        }
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
  for (const RowSpan& sp : spans_) {
    float* win = b_.window.data();
    const float* st = sp.seq->state(sp.pos0) + ple_off_[layer];
    std::copy(st, st + R * CH, win);
    std::copy(normed + sp.first_row * CH, normed + (sp.first_row + sp.rows) * CH, win + R * CH);
    for (int64_t i = 0; i < sp.rows; ++i) {
      float* o = out + (sp.first_row + i) * CH;
      for (int64_t ch = 0; ch < CH; ++ch) {
        float acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += p.conv[ch * K + j] * win[(i + j * n) * CH + ch];
        o[ch] += silu(acc);
      }
      const int64_t len = sp.pos0 + i + 1;
      if (len > sp.pos0 + sp.rows - slots_) {
        float* dst = sp.seq->state(len) + ple_off_[layer];
        std::copy(win + (i + 1) * CH, win + (i + 1 + R) * CH, dst);
      }
    }
  }
}

void Qwen4ExpModel::layer_forward(const Qwen4LayerWeights& L, int layer, int qsa_layer, int64_t S, float* X) {
  if (L.has_ple) {
    float* add = b_.rows_out.data();
    ple(L.ple, layer, X, S, add);
    for (int64_t i = 0; i < S * cfg_.hc_width(); ++i) X[i] += add[i];
  }
  float* x = b_.x.data();
  float* y = b_.y.data();
  float* inj = b_.inj.data();
  gated_residual(L.attn_hc, X, S, x, inj);
  if (L.kind == Qwen4LayerKind::Linear)
    gdn(L.gdn, layer, x, S, y);
  else
    qsa(L.attn, static_cast<size_t>(qsa_layer), x, S, y);
  inject(y, inj, S, X);
  gated_residual(L.mlp_hc, X, S, x, inj);
  moe(L.moe, x, S, y);
  inject(y, inj, S, X);
}

// ---------------------------------------------------------------------------------------------------
// Forwards

void Qwen4ExpModel::forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, CH = c.hc_width(), V = c.vocab_size;
  int64_t S = 0, max_pos = 1;
  spans_.clear();
  for (size_t i = 0; i < count; ++i) {
    const BatchSegment& g = segments[i];
    if (g.rows <= 0) continue;
    auto* seq = dynamic_cast<Qwen4ExpSequence*>(g.state);
    if (!seq || seq->owner() != this) throw Error("forward: a sequence does not belong to this model");
    if (seq->length() + g.rows > seq->capacity())
      throw Error("forward: " + std::to_string(g.rows) + " more positions do not fit the sequence's " +
                  std::to_string(seq->capacity()));
    for (int64_t s = 0; s < g.rows; ++s)
      if (g.tokens[s] < 0 || g.tokens[s] >= V)
        throw Error("token id " + std::to_string(g.tokens[s]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    spans_.push_back(
        {seq, seq->has_kv() ? &seq->kv() : nullptr, S, g.rows, seq->length(), seq->length(), g.tokens, g.all_logits,
         nullptr, nullptr});
    S += g.rows;
    max_pos = std::max(max_pos, seq->capacity());
  }
  if (S == 0) return;
  ensure_rows(S);
  ensure_thread_scratch(max_pos);
  row_span_.assign(static_cast<size_t>(S), 0);
  for (size_t i = 0; i < spans_.size(); ++i) {
    RowSpan& sp = spans_[i];
    std::fill(row_span_.begin() + sp.first_row, row_span_.begin() + sp.first_row + sp.rows, static_cast<int32_t>(i));
    if (sp.cache) sp.cache->prepare(sp.rows);
    sp.seq->tokens().insert(sp.seq->tokens().end(), sp.tokens, sp.tokens + sp.rows);
  }
  routed_bytes_ = 0;
  float* X = b_.X.data();
  for (const RowSpan& sp : spans_)
    for (int64_t r = 0; r < sp.rows; ++r) {
      float* row = X + (sp.first_row + r) * CH;
      ops::dequant_row(w_.embed, sp.tokens[r], row);
      for (int64_t j = 1; j < c.hc_count; ++j) std::copy(row, row + H, row + j * H);
    }
  for (size_t li = 0; li < w_.layers.size(); ++li)
    layer_forward(w_.layers[li], static_cast<int>(li), qsa_index_[li], S, X);
  for (const RowSpan& sp : spans_)
    if (sp.cache) sp.cache->advance(sp.rows);
  last_routed_bytes_ = routed_bytes_;
  if (hidden) std::copy(X, X + S * CH, hidden);
  if (!logits) return;
  // The rows that need logits (a prefill only its last), gathered in place at the front of X (a row never moves
  // back past where it is read), through the final mixer and one lm_head.
  int64_t n = 0;
  for (const RowSpan& sp : spans_) {
    const bool all = sp.all_logits;
    const int64_t first = all ? sp.first_row : sp.first_row + sp.rows - 1, rows = all ? sp.rows : 1;
    if (first != n) std::memmove(X + n * CH, X + first * CH, size_t(rows * CH) * sizeof(float));
    n += rows;
  }
  float* x = b_.x.data();
  gated_residual(w_.mixer, b_.X.data(), n, x, nullptr);
  ops::matmul(pool_, x, n, w_.lm_head, logits);
}

void Qwen4ExpModel::check_draft_request(const DraftRequest& r) const {
  const int64_t V = cfg_.vocab_size;
  if (r.layer < 0 || r.layer >= num_mtp_layers()) throw Error("draft_forward: no MTP layer " + std::to_string(r.layer));
  if (r.rows <= 0 || !r.cache) throw Error("draft_forward: a request without rows");
  for (int64_t s = 0; s < r.rows; ++s)
    if (r.tokens[s] < 0 || r.tokens[s] >= V)
      throw Error("token id " + std::to_string(r.tokens[s]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
  r.cache->check_room(r.rows);
  const int64_t next = r.cache->base_position() + r.cache->length();
  if ((!r.forced || r.forced->first_row > 0) && r.pos0 != next)
    throw Error("internal: MTP rows must extend the layer's chain (position " + std::to_string(r.pos0) + ", expected " +
                std::to_string(next) + ")");
}

void Qwen4ExpModel::draft_forward(int layer, const int32_t* tokens, const float* h_prev, int64_t S, int64_t pos0,
                                  KVCache& dcache, float* logits_out, float* hidden_out, const TopkOverride* forced,
                                  std::vector<int32_t>* last_topk_positions) {
  if (S <= 0) return;
  DraftRequest r = layer_request(layer, tokens, h_prev, S, pos0, &dcache, hidden_out, forced, last_topk_positions);
  DraftRequest* one = &r;
  draft_forward_batch(layer, &one, 1);
  if (logits_out) {  // (b_.X holds the output streams)
    gated_residual(w_.mtp.mixer, b_.X.data(), S, b_.x.data(), nullptr);
    ops::matmul(pool_, b_.x.data(), S, w_.lm_head, logits_out);
  }
}

// The rows of all requests, in request order, through MTP layer `layer`; each request's rows extend its own
// cache (a row's values never depend on the other requests'). b_.X keeps the output streams [S, C·H].
void Qwen4ExpModel::draft_forward_batch(int layer, DraftRequest* const* requests, size_t count) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width();
  int64_t S = 0, max_seq = 1;
  for (size_t i = 0; i < count; ++i) {
    check_draft_request(*requests[i]);
    if (requests[i]->layer != layer) throw Error("internal: draft requests of several layers in one forward");
    S += requests[i]->rows;
    max_seq = std::max(max_seq, requests[i]->cache->capacity());
  }
  if (S == 0) return;
  ensure_rows(S);
  ensure_thread_scratch(max_seq);
  spans_.clear();
  row_span_.assign(static_cast<size_t>(S), 0);
  const Qwen4MtpWeights& m = w_.mtp;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* X = b_.X.data();
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    DraftRequest& r = *requests[i];
    for (int64_t s = 0; s < r.rows; ++s) ops::dequant_row(w_.embed, r.tokens[s], b_.y.data() + (row + s) * H);
    // (the hidden rows normed here; fc_hidden below maps each of their C streams)
    ops::rms_norm(r.h_prev, r.rows, CH, m.pre_fc_norm_hidden.data(), eps, b_.Xn.data() + row * CH);
    spans_.push_back({nullptr, r.cache, row, r.rows, r.cache->length(), r.pos0, r.tokens, true, r.forced, r.topk_out});
    std::fill(row_span_.begin() + row, row_span_.begin() + row + r.rows, static_cast<int32_t>(i));
    r.cache->prepare(r.rows);
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
  layer_forward(m.layers[layer], -1, 0, S, X);
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    const RowSpan& sp = spans_[i];
    r.cache->advance(r.rows);
    if (r.hidden_out) std::copy(X + sp.first_row * CH, X + (sp.first_row + r.rows) * CH, r.hidden_out);
  }
}

void Qwen4ExpModel::draft_logits_rows(const float* hidden, int64_t rows, float* logits) {
  ensure_rows(rows);
  float* X = b_.X.data();
  std::copy(hidden, hidden + rows * cfg_.hc_width(), X);
  gated_residual(w_.mtp.mixer, X, rows, b_.x.data(), nullptr);
  ops::matmul(pool_, b_.x.data(), rows, w_.lm_head, logits);
}

}  // namespace nextn
