// The CUDA backend of HY V4's blocks (cuda_blocks.h). Shapes are in [rows, cols] comments; every buffer named
// here lives in device memory unless it says host.
#include "models/hy_v4/cuda_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/profile.h"
#include "models/hy_v4/model.h"

namespace nextn {
namespace {
// Where a GPU forward's host time goes (NEXTN_PROFILE=1): the per-forward uploads, and the waits for the
// device at the copies back (the kernels' time shows there; queueing them is the rest of a step).
const profile::Section kUpload = profile::section("cuda: uploads");
const profile::Section kWait = profile::section("cuda: wait + copy back");
// With NEXTN_PROFILE the blocks run eagerly (no graphs) and each is timed between device synchronizations:
// where the device time goes, by block, at the price of a wait per block.
const profile::Section kHyper = profile::section("cuda: hyper-connections");
const profile::Section kNorms = profile::section("cuda: norms, adds, MTP input");
const profile::Section kProjections = profile::section("cuda: attention projections");
const profile::Section kIndexer = profile::section("cuda: indexer + top-k");
const profile::Section kSparseMla = profile::section("cuda: sparse MLA + o_proj");
const profile::Section kMoe = profile::section("cuda: MoE");
const profile::Section kMlp = profile::section("cuda: dense MLP");
const profile::Section kLmHead = profile::section("cuda: lm_head");

class BlockTimer {
 public:
  explicit BlockTimer(profile::Section s) : on_(profile::enabled()) {
    if (!on_) return;
    cuda::synchronize();
    sections_.emplace(s);
  }
  void next(profile::Section s) {
    if (!on_) return;
    cuda::synchronize();
    sections_->next(s);
  }
  ~BlockTimer() {
    if (!on_) return;
    try {
      cuda::synchronize();
    } catch (...) {  // (a failed kernel: the forward's next synchronization reports it)
    }
  }

 private:
  bool on_;
  std::optional<profile::Sections> sections_;
};

}  // namespace

struct HYV4CudaBlocks::Workspace {
  int64_t rows = 0, positions = 0;
  cuda::DeviceBuffer streams, x, xn, y, hidden, mixes, post;
  cuda::DeviceBuffer q_resid, q, kv_a, gate, attn, qcat, olat, mla_part, vout;
  cuda::DeviceBuffer iq, ik, iw, scores, topk, topk_count, forced;
  cuda::DeviceBuffer ffn_a, ffn_b, router, gathered, expert_a, expert_b, expert_out, shared_out, moe_i32, moe_f32;
  cuda::DeviceBuffer mtp_in, h_prev, logits, lm_in, lm_out, meta_i32, meta_i64;
};

cuda::MoeRouting moe_routing(const HYV4Config& c) {
  cuda::MoeRouting r;
  r.experts = c.n_routed_experts;
  r.k = c.num_experts_per_tok;
  r.groups = c.n_group;
  r.topk_group = c.topk_group;
  r.norm_topk_prob = c.norm_topk_prob;
  r.routed_scaling_factor = float(c.routed_scaling_factor);
  return r;
}

HYV4CudaBlocks::~HYV4CudaBlocks() = default;

HYV4CudaBlocks::HYV4CudaBlocks(const HYV4Config& config, const HYV4Weights& w, Uploads uploads)
    : cfg_(config), ws_(workspaces_.for_steps(0)) {
  std::string why;
  if (!cuda::available(&why)) throw Error("--device cuda: " + why);
  upload_weights(w, uploads == Uploads::kAll);
  cuda::synchronize();
}

// ---- weights -------------------------------------------------------------------------------------------------

const Linear& HYV4CudaBlocks::dev(const Linear& w) { return weights_(w); }
const float* HYV4CudaBlocks::dev(const std::vector<float>& v) { return weights_(v); }

void HYV4CudaBlocks::upload_weights(const HYV4Weights& w, bool target_layers) {
  auto linear = [&](const Linear& l) { weights_.add(l); };
  auto vec = [&](const std::vector<float>& v) { weights_.add(v); };
  auto ffn = [&](const FfnWeights& f) {
    for (const Linear* l : {&f.gate_proj, &f.up_proj, &f.down_proj, &f.router}) linear(*l);
    vec(f.e_bias);
    if (f.expert_gate.empty()) return;
    // The experts held: all, or a tensor-parallel rank's range (the others' are empty Linears).
    UnitRange held;
    if (!held_units(f.expert_gate, &held)) throw Error("internal: a rank's routed experts are not one range");
    const int64_t e0 = held.begin, e1 = held.end;
    for (int64_t e = e0; e < e1; ++e) {
      linear(f.expert_gate[size_t(e)]);
      linear(f.expert_up[size_t(e)]);
      linear(f.expert_down[size_t(e)]);
    }
    auto table = [&](const std::vector<Linear>& ws) {
      std::vector<const Linear*> d;
      for (int64_t e = e0; e < e1; ++e) d.push_back(&dev(ws[size_t(e)]));
      return d.empty() ? cuda::WeightTable{} : cuda::weight_table(d.data(), int64_t(d.size()));
    };
    experts_.emplace(&f, ExpertTables{table(f.expert_gate), table(f.expert_up), table(f.expert_down), e0});
  };
  auto block = [&](const DecoderLayerWeights& L) {
    const AttentionWeights& a = L.attn;
    for (const Linear* l : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.kv_b_proj, &a.o_proj, &a.gate_proj,
                            &a.indexer.wq_b, &a.indexer.wk, &a.indexer.weights_proj, &L.attn_hc.fn, &L.ffn_hc.fn})
      linear(*l);
    for (const std::vector<float>* v : {&a.q_a_norm, &a.kv_a_norm, &a.sinks, &a.indexer.k_norm_w, &a.indexer.k_norm_b,
                                        &L.input_norm, &L.post_attn_norm, &L.attn_hc.base, &L.ffn_hc.base})
      vec(*v);
    ffn(L.ffn);
  };
  linear(w.embed);
  linear(w.lm_head);
  linear(w.hc_head_fn);
  vec(w.hc_head_base);
  vec(w.final_norm);
  vec(cfg_.rope.inv_freq);
  if (target_layers)
    for (const DecoderLayerWeights& L : w.layers) block(L);
  for (const MtpLayerWeights& m : w.mtp) {
    linear(m.eh_proj);
    vec(m.enorm);
    vec(m.hnorm);
    vec(m.final_norm);
    block(m.block);
  }
}

// ---- workspace and the forward's rows --------------------------------------------------------------------------

int64_t HYV4CudaBlocks::topk_stride() const {
  return std::min<int64_t>(std::max<int64_t>(cfg_.index_topk, 1), ws_->positions);
}

void HYV4CudaBlocks::ensure_workspace(int64_t S, int64_t P) {
  Workspace& w = *ws_;
  if (S <= w.rows && P <= w.positions) return;
  S = std::max(S, w.rows);
  P = std::max(P, w.positions);
  const HYV4Config& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_mult, nh = c.num_attention_heads, kvl = c.kv_lora_rank;
  const int64_t kr = kvl + c.qk_rope_head_dim, K = std::min<int64_t>(std::max<int64_t>(c.index_topk, 1), P);
  const int64_t I_moe = c.moe_intermediate_size * std::max(1, c.n_shared_experts);
  const int64_t I2 = std::max<int64_t>(c.intermediate_size, I_moe), k = std::max(1, c.num_experts_per_tok);
  const int64_t SK = S * k;
  if (workspaces_.graphs_hold(ws_)) graphs_.forget("the workspace grew");  // (recorded with the old addresses)
  w = Workspace();  // (frees the old buffers before the new ones are taken)
  grow_device<float>(w.streams, S * C * H);
  for (cuda::DeviceBuffer* b : {&w.x, &w.xn, &w.y, &w.hidden, &w.shared_out, &w.h_prev, &w.lm_in})
    grow_device<float>(*b, S * H);
  grow_device<float>(w.mixes, cuda::hc_pre_scratch_floats(S, C, H, 2 * C));  // (the mixers' partials)
  grow_device<float>(w.post, S * C);
  grow_device<float>(w.q_resid, S * c.q_lora_rank);
  grow_device<float>(w.q, S * nh * c.qk_head_dim);
  grow_device<float>(w.kv_a, S * kr);
  for (cuda::DeviceBuffer* b : {&w.gate, &w.attn, &w.vout}) grow_device<float>(*b, S * nh * c.v_head_dim);
  grow_device<float>(w.qcat, S * nh * kr);
  grow_device<float>(w.olat, S * nh * kvl);
  grow_device<float>(w.mla_part, cuda::sparse_mla_scratch_floats(S, nh, kvl));
  grow_device<float>(w.iq, S * c.index_n_heads * c.index_head_dim);
  grow_device<float>(w.ik, S * c.index_head_dim);
  grow_device<float>(w.iw, S * c.index_n_heads);
  grow_device<float>(w.scores, S * P);
  grow_device<int32_t>(w.topk, S * K);
  grow_device<int32_t>(w.forced, S * K);
  grow_device<int32_t>(w.topk_count, S);
  grow_device<float>(w.ffn_a, S * I2);
  grow_device<float>(w.ffn_b, S * I2);
  grow_device<float>(w.router, S * std::max(1, c.n_routed_experts));
  grow_device<float>(w.gathered, SK * H);
  grow_device<float>(w.expert_out, SK * H);
  grow_device<float>(w.expert_a, SK * c.moe_intermediate_size);
  grow_device<float>(w.expert_b, SK * c.moe_intermediate_size);
  grow_device<int32_t>(w.moe_i32, 3 * SK + std::max(1, c.n_routed_experts) + 1);
  grow_device<float>(w.moe_f32, SK);
  grow_device<float>(w.mtp_in, S * 2 * H);
  grow_device<float>(w.logits, S * c.vocab_size);
  grow_device<float>(w.lm_out, S * c.vocab_size);
  tp_.reserve(S, H);
  w.rows = S;
  w.positions = P;
  // The host staging of the per-forward uploads, sized now so that a forward does not allocate.
  meta_i32_.reserve(size_t(8 * S + P + S * K));
  meta_i64_.reserve(size_t(2 * S));
  host_f32_.reserve(size_t(S * H));
  hidden_rows_.reserve(S * H);
  host_i32_.reserve(size_t(S));
  host_sel_count_.reserve(size_t(S));
  host_sel_.reserve(size_t(S * K));
}

void HYV4CudaBlocks::reserve(int64_t rows, int64_t positions, int64_t page_tokens) {
  rows = std::max<int64_t>(rows, 1);
  positions = std::max<int64_t>(positions, 1);
  ws_ = workspaces_.for_steps(rows);
  ensure_workspace(rows, positions);
  // The per-forward uploads of `rows` rows, each a span of its own with its page table, and the padding span
  // (begin()'s layout): a buffer that grows later forgets every graph recorded with it.
  const int64_t pages = (positions + std::max<int64_t>(page_tokens, 1) - 1) / std::max<int64_t>(page_tokens, 1);
  const int64_t ints = 7 * rows + 1 + (rows + 1) * pages + rows * topk_stride();
  if (ws_->meta_i32.bytes() < size_t(ints) * sizeof(int32_t) || ws_->meta_i64.bytes() < size_t(2 * rows) * 8) {
    grow_device<int32_t>(ws_->meta_i32, ints);
    grow_device<int64_t>(ws_->meta_i64, 2 * rows);
    graphs_.forget("the upload buffers grew");
  }
}

// One upload of the rows' facts: tokens, span, slot, position, pages and forced selections (int32), and per
// span its page table's offset and its pool's plane table (int64). A forward's padding rows
// (padded_forward_rows) come last, as one more span.
void HYV4CudaBlocks::begin(const HYV4RowSpan* spans, size_t count) {
  const profile::Sections prof(kUpload);
  graphs_.abandon();  // (a forward that threw mid-way)
  hidden_rows_.forget();
  spans_.assign(spans, spans + count);
  mirrors_.drop_expired();
  S_ = 0;
  pad_ = 0;
  int64_t max_seq = 1;
  any_forced_ = false;
  all_forced_ = true;  // every row attends to forced selections: no indexer runs
  for (const HYV4RowSpan& sp : spans_) {
    S_ += sp.rows;
    max_seq = std::max(max_seq, sp.cache->capacity());
    any_forced_ = any_forced_ || sp.forced;
    all_forced_ = all_forced_ && sp.forced && sp.forced->first_row <= 0;
  }
  if (S_ == 0) return;
  constexpr int64_t kMaxRows = 65535;  // (the attention kernels take a row per grid.y or grid.z)
  if (S_ > kMaxRows)
    throw Error("cuda: a forward of " + std::to_string(S_) + " rows (prompts and rounds together) is more than the " +
                std::to_string(kMaxRows) + " the GPU's attention kernels take in one launch; send a shorter prompt");
  pad_ = padded_forward_rows(S_) - S_;
  S_ += pad_;
  ws_ = workspaces_.for_forward(S_, tp_.active());
  ensure_workspace(S_, std::max(max_seq, pad_));
  const int64_t S = S_, n_real = int64_t(spans_.size()), n = n_real + (pad_ > 0), K = topk_stride();
  std::vector<int32_t>& m = meta_i32_;
  m.assign(size_t(7 * S + 1), 0);  // (n <= S: page_tokens has room for S spans; then the real rows' count)
  int32_t *tokens = m.data(), *span = tokens + S, *slot = span + S, *pos = slot + S, *forced_count = pos + S;
  int32_t* logit_rows = forced_count + S;
  int32_t* page_tokens = logit_rows + S;
  std::vector<int64_t>& m64 = meta_i64_;
  m64.assign(size_t(2 * S), 0);  // [S] page-table offsets, then [S] plane tables: at most a span a row
  logit_rows_ = 0;
  for (int64_t i = 0; i < n_real; ++i) {
    const HYV4RowSpan& sp = spans_[i];
    for (int64_t r = 0; r < sp.rows; ++r) {
      const int64_t row = sp.first_row + r;
      tokens[row] = tp_.local_token(sp.tokens[r]);
      span[row] = int32_t(i);
      slot[row] = int32_t(sp.slot0 + r);
      pos[row] = int32_t(sp.pos0 + r);
      forced_count[row] = -1;
      if (sp.all_logits || r == sp.rows - 1) logit_rows[logit_rows_++] = int32_t(row);
    }
    page_tokens[i] = int32_t(sp.cache->page_tokens());
  }
  for (int64_t r = 0; r < pad_; ++r) {  // the padding span: one page of kMaxPaddingRows slots
    const int64_t row = S - pad_ + r;
    tokens[row] = tp_.local_token(0);
    span[row] = int32_t(n - 1);
    slot[row] = pos[row] = int32_t(r);
    forced_count[row] = -1;
  }
  if (pad_ > 0) page_tokens[n - 1] = int32_t(kMaxPaddingRows);
  m[size_t(7 * S)] = int32_t(S - pad_);
  for (int64_t i = 0; i < n_real; ++i) {  // the page tables, after the fixed part
    const HYV4RowSpan& sp = spans_[i];
    const int64_t pt = sp.cache->page_tokens(), pages = (sp.slot0 + sp.rows + pt - 1) / pt;
    m64[size_t(i)] = int64_t(m.size());
    m.insert(m.end(), sp.cache->page_table(), sp.cache->page_table() + pages);
    m64[size_t(S + i)] = reinterpret_cast<int64_t>(mirrors_.of(*sp.cache).table.get());
  }
  if (pad_ > 0) {
    m64[size_t(n - 1)] = int64_t(m.size());
    m.push_back(0);
    m64[size_t(S + n - 1)] = reinterpret_cast<int64_t>(pad_planes_.like(*spans_[0].cache).table.get());
  }
  if (any_forced_) {  // forced rows' selections [S, K] after the page tables
    const size_t at = m.size();
    m.resize(at + size_t(S * K), 0);
    for (const HYV4RowSpan& sp : spans_) {
      if (!sp.forced) continue;
      const int64_t take = std::min<int64_t>(sp.forced->count, K);
      for (int64_t r = std::max<int64_t>(sp.forced->first_row, 0); r < sp.rows; ++r) {
        const int64_t row = sp.first_row + r;
        m[size_t(4 * S + row)] = int32_t(take);
        std::copy(sp.forced->slots, sp.forced->slots + take, m.data() + at + row * K);
      }
    }
    if (all_forced_)  // (no indexer runs: the padding rows attend to their first slot)
      for (int64_t row = S - pad_; row < S; ++row) m[size_t(4 * S + row)] = 1;
    cuda::copy_to_device(ws_->forced.get(), m.data() + at, size_t(S * K) * sizeof(int32_t));
  }
  const void* before[2] = {ws_->meta_i32.get(), ws_->meta_i64.get()};
  // (twice what this forward needs when they grow: the page tables lengthen as sequences do)
  if (ws_->meta_i32.bytes() < m.size() * sizeof(int32_t)) grow_device<int32_t>(ws_->meta_i32, 2 * int64_t(m.size()));
  if (ws_->meta_i64.bytes() < size_t(2 * S) * sizeof(int64_t)) grow_device<int64_t>(ws_->meta_i64, 4 * S);
  int32_t* d32 = device_as<int32_t>(ws_->meta_i32);
  int64_t* d64 = device_as<int64_t>(ws_->meta_i64);
  if ((d32 != before[0] || d64 != before[1]) && workspaces_.graphs_hold(ws_))
    graphs_.forget("the upload buffers grew");  // (recorded with the old addresses)
  cuda::copy_to_device(d32, m.data(), m.size() * sizeof(int32_t));
  cuda::copy_to_device(d64, m64.data(), m64.size() * sizeof(int64_t));
  rc_.span = d32 + S;
  rc_.slot = d32 + 2 * S;
  rc_.position = d32 + 3 * S;
  rc_.page_tokens = d32 + 6 * S;
  real_rows_ = d32 + 7 * S;
  rc_.tables = d32;
  rc_.table_offset = d64;
  rc_.planes = reinterpret_cast<float* const* const*>(d64 + S);  // (at S, not n: no argument depends on the spans)
}

float* HYV4CudaBlocks::act(HYV4Act a) {
  switch (a) {
    case HYV4Act::kX: return ws_->x.f32();
    case HYV4Act::kXn: return ws_->xn.f32();
    case HYV4Act::kY: return ws_->y.f32();
    case HYV4Act::kHidden: return ws_->hidden.f32();
  }
  throw Error("internal: unknown activation");
}

// ---- embeddings, iHC, norms --------------------------------------------------------------------------------

bool HYV4CudaBlocks::replay_or_record(uintptr_t which) {
  if (profile::enabled()) return false;  // (BlockTimer times each block as it runs)
  if (!tp_.capturable()) return false;  // (host-staged collectives wait for the device mid-forward)
  if (!workspaces_.graphs_hold(ws_)) return false;  // (a long forward: eager, in buffers no graph holds)
  // (neither the spans nor the logit rows change a kernel's arguments: the spans are read from the uploads at
  // addresses set by S alone, and logits() runs after the graph)
  return graphs_.replay_or_record({S_, which, int(any_forced_) + 2 * int(all_forced_)});
}

void HYV4CudaBlocks::embed_streams(const Linear& embed) {
  if (replay_or_record(0)) return;  // (a target forward starts here)
  const BlockTimer timer(kNorms);
  const int64_t H = cfg_.hidden_size, C = cfg_.hc_mult;
  if (tp_.active()) {
    // Each rank embeds the rows whose tokens it owns (the others' are zero: their ids are -1 here, begin()),
    // and the sum over the ranks moves each row from its owner: owner's row + zeros, the same values.
    float* x = ws_->x.f32();
    cuda::embed_rows(dev(embed), device_as<int32_t>(ws_->meta_i32), S_, 1, x, H);  // [S, H]
    tp_.sum(x, S_ * H);
    for (int64_t j = 0; j < C; ++j) cuda::copy_cols(x, S_, H, H, ws_->streams.f32() + j * H, C * H);  // [S, C, H]
    return;
  }
  cuda::embed_rows(dev(embed), device_as<int32_t>(ws_->meta_i32), S_, int(C), ws_->streams.f32(), C * H);  // [S, C, H]
}

// streams -> xn [S, H] (the pre-mix normed in the same kernel), post gates [S, C]
void HYV4CudaBlocks::hyper_pre(const HyperConnectionWeights& hc, const std::vector<float>& norm) {
  if (skipping()) return;
  const BlockTimer timer(kHyper);
  const HYV4Config& c = cfg_;
  const int64_t C = c.hc_mult;
  const float eps = float(c.rms_norm_eps);
  const cuda::HcNorm normed{dev(norm), eps, ws_->xn.f32()};
  cuda::hc_pre(ws_->streams.f32(), S_, C, c.hidden_size, dev(hc.fn), ws_->mixes.f32(), dev(hc.base), hc.scale[0],
               hc.scale[1], eps, float(c.hc_eps), float(c.hc_magnitude), ws_->x.f32(), ws_->post.f32(), &normed);
}

// streams -> hidden [S, H]
void HYV4CudaBlocks::hc_head(const Linear& fn, const std::vector<float>& base, const std::vector<float>& scale,
                             const std::vector<float>& norm) {
  if (skipping()) return;
  const BlockTimer timer(kHyper);
  const HYV4Config& c = cfg_;
  const float eps = float(c.rms_norm_eps);
  const cuda::HcNorm normed{dev(norm), eps, ws_->hidden.f32()};
  cuda::hc_pre(ws_->streams.f32(), S_, c.hc_mult, c.hidden_size, dev(fn), ws_->mixes.f32(), dev(base), scale[0],
               0.0f, eps, float(c.hc_eps), 0.0f, ws_->x.f32(), nullptr, &normed);
}

// kY: y itself; kAddToX: x += output (stored into x); kHyperPost: y, and the streams through the post gates.
cuda::OutputSink HYV4CudaBlocks::sink_for(HYV4Out out, float** y) {
  cuda::OutputSink sink;
  if (tp_.active()) {  // (a rank's output is a partial sum: the residual updates wait for reduce_and_deliver)
    *y = ws_->y.f32();
    return sink;
  }
  *y = out == HYV4Out::kAddToX ? ws_->x.f32() : ws_->y.f32();
  sink.accumulate = out == HYV4Out::kAddToX;
  if (out == HYV4Out::kHyperPost) {
    sink.streams = ws_->streams.f32();
    sink.post = ws_->post.f32();
    sink.C = cfg_.hc_mult;
    sink.H = cfg_.hidden_size;
  }
  return sink;
}

void HYV4CudaBlocks::mtp_input(const MtpLayerWeights& m, const Linear& embed, DraftRequest* const* requests,
                               size_t count) {
  const int64_t H = cfg_.hidden_size, S = S_;
  const float eps = float(cfg_.rms_norm_eps);
  // The token ids (-1 at absolute position 0, whose embedding the seed zeroes) and h_prev [S, H], from the host.
  std::vector<int32_t>& ids = host_i32_;
  std::vector<float>& h = host_f32_;
  ids.clear();
  h.resize(size_t(S * H));
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    for (int64_t s = 0; s < r.rows; ++s) ids.push_back(r.pos0 + s == 0 ? -1 : r.tokens[s]);
    std::copy(r.h_prev, r.h_prev + r.rows * H, h.data() + row * H);
    row += r.rows;
  }
  ids.resize(size_t(S), -1);  // padding rows: no embedding, no previous hidden state
  std::fill(h.begin() + row * H, h.end(), 0.0f);
  int32_t* ids_d = device_as<int32_t>(ws_->moe_i32);
  cuda::copy_to_device(ids_d, ids.data(), ids.size() * sizeof(int32_t));
  cuda::copy_to_device(ws_->h_prev.f32(), h.data(), h.size() * sizeof(float));
  if (replay_or_record(reinterpret_cast<uintptr_t>(&m))) return;  // (after the uploads: an MTP forward starts here)
  const BlockTimer timer(kNorms);
  float* in = ws_->mtp_in.f32();  // [S, 2H]: enorm(embed) | hnorm(h_prev)
  cuda::embed_rows(dev(embed), ids_d, S, 1, in, 2 * H);
  cuda::copy_cols(ws_->h_prev.f32(), S, H, H, in + H, 2 * H);
  cuda::rms_norm_rows(in, S, H, 2 * H, dev(m.enorm), eps, in, 2 * H);
  cuda::rms_norm_rows(in + H, S, H, 2 * H, dev(m.hnorm), eps, in + H, 2 * H);
  cuda::matmul(in, S, dev(m.eh_proj), ws_->x.f32());  // [S, H]
}

void HYV4CudaBlocks::rms_norm(HYV4Act in, const std::vector<float>& weight, HYV4Act out) {
  if (skipping()) return;
  const BlockTimer timer(kNorms);
  const int64_t H = cfg_.hidden_size;
  cuda::rms_norm_rows(act(in), S_, H, H, dev(weight), float(cfg_.rms_norm_eps), act(out), H);
}

// ---- attention -----------------------------------------------------------------------------------------------

// xn [S, H] -> out: the CPU backend's sparse MLA (cpu_blocks.cpp says what each step is), on the device.
void HYV4CudaBlocks::attention(const DecoderLayerWeights& L, size_t layer, HYV4Out out) {
  if (skipping()) return;
  if (cfg_.num_attention_heads == 0) {  // a tensor-parallel rank without heads: its part of the sum is zero
    cuda::fill_zero(ws_->y.get(), size_t(S_ * cfg_.hidden_size) * sizeof(float));
    reduce_and_deliver(out);
    return;
  }
  BlockTimer timer(kProjections);
  const HYV4Config& c = cfg_;
  const AttentionWeights& a = L.attn;
  Workspace& w = *ws_;
  const int64_t S = S_, nh = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t qkd = c.qk_head_dim, vd = c.v_head_dim, kvl = c.kv_lora_rank, kr = kvl + rope;
  const float eps = float(c.rms_norm_eps), af = float(c.rope.attention_factor);
  const float* inv_freq = dev(c.rope.inv_freq);
  const int32_t* pos = rc_.position;
  const int key_plane = spans_[0].cache->layer_planes(layer).key_plane;
  const int index_plane = spans_[0].cache->layer_planes(layer).index_plane;
  const bool run_indexer = !all_forced_ && a.has_indexer;
  const float* xn = w.xn.f32();

  // Two paths from xn meet at the indexer's scores: the keys' (kv_a, the indexer's key and head weights, and
  // the cache writes) runs as a branch beside the queries' (the output gate and q_a, q_a's norm, q_b and the
  // indexer's query weights, RoPE, and W_kb's absorption), so that their small and narrow kernels overlap.
  // (BlockTimer's sections begin and end outside the branch.)
  cuda::branch_begin();
  ops::MatmulOut key_outs[3] = {{&dev(a.kv_a_proj), w.kv_a.f32()}};  // [S, kvl + rope]
  if (run_indexer) {
    key_outs[1] = {&dev(a.indexer.wk), w.ik.f32()};            // [S, ihd]
    key_outs[2] = {&dev(a.indexer.weights_proj), w.iw.f32()};  // [S, nih]
  }
  cuda::matmul_many(xn, S, key_outs, run_indexer ? 3 : 1);
  // The cached key [kr]: kv_a_layernorm(latent) | rotated rope part, written at each row's slot.
  cuda::write_key_rows(w.kv_a.f32(), S, kr, kr, {dev(a.kv_a_norm), nullptr, eps, kvl}, kvl, rope, inv_freq, af, rc_,
                       key_plane);
  if (run_indexer) {  // (the indexer rotates the *last* rope dims of its heads; its key is layer-normed first)
    const int64_t ihd = c.index_head_dim;
    cuda::write_key_rows(w.ik.f32(), S, ihd, ihd, {dev(a.indexer.k_norm_w), dev(a.indexer.k_norm_b), eps, ihd},
                         ihd - rope, rope, inv_freq, af, rc_, index_plane);
  }
  cuda::branch_end();

  ops::MatmulOut query_outs[2] = {{&dev(a.gate_proj), w.gate.f32()},    // [S, nh*v]
                                  {&dev(a.q_a_proj), w.q_resid.f32()}};  // [S, q_lora]
  cuda::matmul_many(xn, S, query_outs, 2);
  cuda::rms_norm_rows(w.q_resid.f32(), S, c.q_lora_rank, c.q_lora_rank, dev(a.q_a_norm), eps, w.q_resid.f32(),
                      c.q_lora_rank);
  // q_b and the indexer's query weights read the same normalized rows: one launch where the kernels allow.
  ops::MatmulOut q_outs[2] = {{&dev(a.q_b_proj), w.q.f32()}};  // [S, nh*qkd]
  if (run_indexer) q_outs[1] = {&dev(a.indexer.wq_b), w.iq.f32()};  // [S, nih*ihd]
  cuda::matmul_many(w.q_resid.f32(), S, q_outs, run_indexer ? 2 : 1);
  cuda::rope_rows(w.q.f32(), S, nh, nh * qkd, qkd, nope, rope, pos, inv_freq, af);
  if (run_indexer) {
    const int64_t nih = c.index_n_heads, ihd = c.index_head_dim;
    cuda::rope_rows(w.iq.f32(), S, nih, nih * ihd, ihd, ihd - rope, rope, pos, inv_freq, af);
  }
  // Absorbed: q_cat [S, nh, kr] = [W_kb[h]ᵀ q_nope, q_rope]; o_lat [S, nh, kvl] over the selected keys;
  // out [S, nh, v] = o_lat · W_vb[h]ᵀ, times the sigmoid gate.
  const Linear& kvb = dev(a.kv_b_proj);
  float* qcat = w.qcat.f32();
  cuda::matmul_transposed_heads(w.q.f32(), S, nh * qkd, qkd, kvb, 0, nope + vd, nope, nh, qcat, nh * kr, kr, rope);
  cuda::branch_join();

  const int64_t K = topk_stride();
  int32_t* topk = device_as<int32_t>(w.topk);  // [S, K] slots, ascending (kept for the layers that share it)
  int32_t* count = device_as<int32_t>(w.topk_count);
  timer.next(kIndexer);
  if (run_indexer) {
    const int64_t nih = c.index_n_heads, ihd = c.index_head_dim;
    // (the head weights scaled by 1/sqrt(heads) and 1/sqrt(dim) as the scores' kernel reads them)
    cuda::indexer_scores(w.iq.f32(), w.iw.f32(), S, nih, ihd, rc_, index_plane, w.positions, w.scores.f32(),
                         w.positions, 1.0f / std::sqrt(float(nih)), 1.0f / std::sqrt(float(ihd)));
    cuda::topk_rows(w.scores.f32(), S, w.positions, rc_, K, topk, count);
  }
  if (any_forced_)
    cuda::override_selection(topk, count, S, K, device_as<int32_t>(w.forced), device_as<int32_t>(w.meta_i32) + 4 * S);

  timer.next(kSparseMla);
  cuda::sparse_mla(qcat, S, nh, kvl, rope, topk, K, count, rc_, key_plane, float(c.attn_scale), dev(a.sinks),
                   w.mla_part.f32(), w.olat.f32());
  cuda::matmul_heads(w.olat.f32(), S, nh * kvl, kvl, kvb, nope, nope + vd, vd, nh, w.vout.f32(), nh * vd, vd);
  cuda::mul_sigmoid(w.vout.f32(), w.gate.f32(), S * nh * vd, w.attn.f32());
  float* y = nullptr;
  const cuda::OutputSink sink = sink_for(out, &y);
  cuda::matmul(w.attn.f32(), S, dev(a.o_proj), y, -1, -1, sink);  // [S, H]
  if (tp_.active()) reduce_and_deliver(out);

}

// The spans' last rows' selections (MTP forwards: the draft steps after step 0 reuse them), read after the
// forward has run: the top-k buffer then holds the last attention's, which is the MTP layer's only one.
void HYV4CudaBlocks::read_selections() {
  const profile::Sections prof(kWait);
  read_last_selections(spans_, device_as<int32_t>(ws_->topk_count), device_as<int32_t>(ws_->topk), topk_stride(),
                       host_sel_count_, host_sel_);
}

// ---- MLP and MoE ---------------------------------------------------------------------------------------------

void HYV4CudaBlocks::swiglu_mlp(const Linear& g, const Linear& u, const Linear& d, float limit, const float* in,
                                int64_t rows, float* a, float* b, float* out, const cuda::OutputSink& sink) {
  const Linear &gd = dev(g), &ud = dev(u);
  const ops::MatmulOut outs[] = {{&gd, a}, {&ud, b}};  // [rows, I] each
  cuda::matmul_many(in, rows, outs, 2);
  cuda::swiglu(a, b, rows * gd.out, limit, a);
  cuda::matmul(a, rows, dev(d), out, -1, -1, sink);  // [rows, H]
}

// xn [S, H] -> out
size_t HYV4CudaBlocks::ffn(const FfnWeights& F, HYV4Out out) {
  if (skipping()) return 0;
  const BlockTimer timer(F.sparse ? kMoe : kMlp);
  const HYV4Config& c = cfg_;
  Workspace& w = *ws_;
  const int64_t S = S_, H = c.hidden_size;
  const float* x = w.xn.f32();
  float* y = nullptr;
  const cuda::OutputSink sink = sink_for(out, &y);
  if (!F.sparse) {
    if (F.gate_proj.out > 0)
      swiglu_mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, w.ffn_a.f32(), w.ffn_b.f32(), y, sink);
    else  // a tensor-parallel rank with no features of this MLP
      cuda::fill_zero(y, size_t(S * H) * sizeof(float));
    if (tp_.active()) reduce_and_deliver(out);
    return 0;
  }
  // Routing and dispatch on the device (no host round trip): each token's k experts, the tokens grouped by
  // expert (ascending) into rows of `gathered`, every expert's rows through its weights in one grouped launch
  // per matrix, and each token adding its experts' outputs in ascending expert order (as the CPU backend).
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size, SK = S * k;
  const ExpertTables& t = experts_.at(&F);
  // The shared expert runs as a branch beside the routing and the routed experts; they meet at the combine.
  if (F.has_shared) {
    cuda::branch_begin();
    swiglu_mlp(F.gate_proj, F.up_proj, F.down_proj, 0.0f, x, S, w.ffn_a.f32(), w.ffn_b.f32(), w.shared_out.f32());
    cuda::branch_end();
  }
  cuda::matmul(x, S, dev(F.router), w.router.f32());  // [S, E]
  const cuda::MoeRouting r = moe_routing(c);
  int32_t* ids = device_as<int32_t>(w.moe_i32);  // [S, k] | token_of [S·k] | row_of [S, k] | first [E + 1]
  int32_t *token_of = ids + SK, *row_of = token_of + SK, *first = row_of + SK;
  cuda::moe_route(w.router.f32(), dev(F.e_bias), S, r, ids, w.moe_f32.f32());
  cuda::moe_dispatch(ids, S, k, E, first, token_of, row_of, real_rows_);  // (padding rows run no expert)
  cuda::gather_rows(x, H, token_of, SK, w.gathered.f32());  // [S·k, H]
  // (a tensor-parallel rank runs its own experts' rows, first[t.first ..]; the others' rows add zero)
  if (tp_.active()) cuda::fill_zero(w.expert_out.get(), size_t(SK * H) * sizeof(float));
  if (t.gate.count > 0) {
    const int32_t* held = first + t.first;
    cuda::grouped_matmul(w.gathered.f32(), t.gate, held, SK, w.expert_a.f32());  // [S·k, I]
    cuda::grouped_matmul(w.gathered.f32(), t.up, held, SK, w.expert_b.f32());
    cuda::swiglu(w.expert_a.f32(), w.expert_b.f32(), SK * I, float(c.swiglu_limit), w.expert_a.f32());
    cuda::grouped_matmul(w.expert_a.f32(), t.down, held, SK, w.expert_out.f32());  // [S·k, H]
  }
  cuda::branch_join();
  cuda::moe_combine(w.expert_out.f32(), row_of, w.moe_f32.f32(), S, k, H, F.has_shared ? w.shared_out.f32() : nullptr,
                    y, sink);
  if (tp_.active()) reduce_and_deliver(out);
  return 0;  // (which experts ran stays on the device: bench's verify bytes do not count them here)
}

// ---- tensor parallel ------------------------------------------------------------------------------------------

void HYV4CudaBlocks::set_tensor_parallel(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab) {
  tp_.set(comm, std::move(vocab));
  graphs_.forget("tensor parallel");
  ws_ = workspaces_.reset();  // (the next forward sizes it with the gathers' buffers)
}

void HYV4CudaBlocks::reduce_and_deliver(HYV4Out out) {
  const int64_t H = cfg_.hidden_size, count = S_ * H;
  float* y = ws_->y.f32();
  tp_.sum(y, count);
  // (the separate ops whose bits the one-rank output sinks give: cuda_ops.h, OutputSink)
  if (out == HYV4Out::kAddToX) cuda::add(ws_->x.f32(), y, count);
  if (out == HYV4Out::kHyperPost) cuda::hc_post(ws_->streams.f32(), ws_->post.f32(), y, S_, cfg_.hc_mult, H);
}

// ---- what comes back to the host ---------------------------------------------------------------------------

void HYV4CudaBlocks::finish() {
  graphs_.finish();
  read_selections();
}

void HYV4CudaBlocks::read_hidden(int64_t first, int64_t rows, float* out) {
  const int64_t H = cfg_.hidden_size;
  const profile::Sections prof(kWait);
  hidden_rows_.read(ws_->hidden.f32(), H, S_ - pad_, first, rows, out);
}

void HYV4CudaBlocks::logits(const Linear& lm_head, float* out) {
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size, n = logit_rows_;
  const float* rows = ws_->hidden.f32();
  if (n < S_ - pad_) {  // only some rows want logits (prefill: the last): gather them, one lm_head for all
    cuda::gather_rows(ws_->hidden.f32(), H, device_as<int32_t>(ws_->meta_i32) + 5 * S_, n, ws_->x.f32());
    rows = ws_->x.f32();
  }
  // Greedy rows come back as their ids, the others' rows as they are.
  logit_out_.mark_greedy(spans_, n);
  if (tp_.active() && logit_out_.all_by_id(n)) {  // (each rank's best per row: no logits cross the ranks)
    const BlockTimer timer(kLmHead);
    tp_.argmax(dev(lm_head), rows, n, logit_out_.ids_for(n));
    logit_out_.deliver_ids(spans_);
    return;
  }
  {
    const BlockTimer timer(kLmHead);
    if (tp_.active())
      tp_.logits(dev(lm_head), rows, n, V, ws_->logits.f32());
    else
      cuda::matmul(rows, n, dev(lm_head), ws_->logits.f32());  // [n, V]
  }
  const profile::Sections prof(kWait);
  logit_out_.read(ws_->logits.f32(), n, V, out);
  logit_out_.deliver_ids(spans_);
}

void HYV4CudaBlocks::lm_head_rows(const Linear& lm_head, const float* hidden, int64_t rows, float* out,
                                  int32_t* argmax, int64_t argmax_rows) {
  if (rows <= 0) return;
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  float* in = grow_device<float>(ws_->lm_in, rows * H);
  float* y = grow_device<float>(ws_->lm_out, rows * V);
  cuda::copy_to_device(in, hidden, size_t(rows * H) * sizeof(float));
  cuda::matmul(in, rows, dev(lm_head), y);
  const profile::Sections prof(kWait);
  const int64_t greedy = std::clamp<int64_t>(argmax_rows, 0, rows);  // (greedy drafts: ids, not rows)
  logit_out_.mark_first(rows, greedy);
  logit_out_.read(y, rows, V, out);
  std::copy(logit_out_.ids().begin(), logit_out_.ids().begin() + greedy, argmax);
}

}  // namespace nextn
