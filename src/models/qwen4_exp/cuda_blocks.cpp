// The CUDA backend of Qwen4-Exp's blocks (cuda_blocks.h); cpu_blocks.cpp says what each block computes. Shapes
// are in [rows, cols] comments; every buffer named here lives in device memory unless it says host.
#include "models/qwen4_exp/cuda_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "models/qwen4_exp/model.h"
#include "models/qwen4_exp/ngram.h"
#include "ops/cuda/cuda_sparse_attention.h"

namespace nextn {
struct Qwen4CudaBlocks::Workspace {
  int64_t rows = 0, positions = 0;
  cuda::DeviceBuffer X, Xn, x, y, inj, mid, wgt, ones, lm_streams;
  cuda::DeviceBuffer qkv, z, ab, conv, core;
  cuda::DeviceBuffer q, kv, iq, bscores, blocks, bcount, sel, sel_count;
  cuda::DeviceBuffer router, ids, wts, moe_i32, gathered, ea, eb, eo, sa, sb, sg, sh;
  cuda::DeviceBuffer emb, key, value, gated, normed;
  cuda::DeviceBuffer e_in, e, h_prev, logits, meta_i32, meta_i64;
};

// Device buffers for sequences' recurrent state, handed back by a sequence's end and reused by the next.
struct Qwen4CudaBlocks::StateSlots {
  std::vector<cuda::DeviceBuffer> free;
};

Qwen4CudaBlocks::~Qwen4CudaBlocks() = default;

Qwen4CudaBlocks::Qwen4CudaBlocks(const Qwen4ExpConfig& config, const Qwen4StateLayout& layout,
                                 const Qwen4ExpWeights& w, Uploads uploads)
    : cfg_(config), layout_(layout), ws_(workspaces_.for_steps(0)), states_(std::make_shared<StateSlots>()) {
  std::string why;
  if (!cuda::available(&why)) throw Error("--device cuda: " + why);
  forced_stride_ = qsa_selection_cap(config);
  upload_weights(w, uploads == Uploads::kAll);
  cuda::synchronize();
}

// ---- weights -------------------------------------------------------------------------------------------------

const Linear& Qwen4CudaBlocks::dev(const Linear& w) const { return weights_(w); }
const float* Qwen4CudaBlocks::dev(const std::vector<float>& v) const { return weights_(v); }

// The n-gram table's shards (split along rows in the checkpoint) as one device table, so that a row id indexes it
// directly: their bytes one after another (every shard has the table's dtype and width).
void Qwen4CudaBlocks::upload_ple_table(const PleWeights& p) {
  const Linear& first = p.table_shards.at(0);
  if (first.dtype == DType::F8_E4M3)
    throw Error("--device cuda: an FP8 PLE n-gram table (the CUDA backend takes F32 or BF16 tables)");
  const size_t elem = dtype_size(first.dtype);
  std::vector<uint8_t> bytes;
  int64_t rows = 0;
  for (const Linear& s : p.table_shards) {
    if (s.dtype != first.dtype || s.in != first.in)
      throw Error("--device cuda: PLE n-gram table shards of different dtypes or widths");
    for (int64_t r = 0; r < s.out; ++r) {
      const auto* row = static_cast<const uint8_t*>(s.data) + size_t(r * s.row_stride) * elem;
      bytes.insert(bytes.end(), row, row + size_t(s.in) * elem);
    }
    rows += s.out;
  }
  Linear whole = first;
  whole.out = rows;
  whole.row_stride = first.in;
  whole.data = bytes.data();
  whole.bias = nullptr;
  ple_tables_.emplace(&p, cuda::upload(whole));
}

void Qwen4CudaBlocks::upload_weights(const Qwen4ExpWeights& w, bool target_layers) {
  auto linear = [&](const Linear& l) { weights_.add(l); };
  auto vec = [&](const std::vector<float>& v) { weights_.add(v); };
  auto mixer = [&](const GatedResidualWeights& g) {
    for (const Linear* l : {&g.mix_down, &g.mix_up, &g.inject}) linear(*l);
    vec(g.hc_norm);
  };
  auto layer = [&](const Qwen4LayerWeights& L) {
    mixer(L.attn_hc);
    mixer(L.mlp_hc);
    const GdnWeights& g = L.gdn;
    for (const Linear* l : {&g.in_q, &g.in_k, &g.in_v, &g.in_z, &g.in_b, &g.in_a, &g.out_proj}) linear(*l);
    for (const std::vector<float>* v : {&g.conv, &g.neg_A, &g.dt_bias, &g.norm}) vec(*v);
    const QsaWeights& a = L.attn;
    for (const Linear* l : {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &a.index_qk}) linear(*l);
    for (const std::vector<float>* v : {&a.q_norm, &a.k_norm, &a.index_q_norm, &a.index_k_norm}) vec(*v);
    const MoeWeights& m = L.moe;
    for (const Linear* l : {&m.router, &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_expert_gate}) linear(*l);
    // The experts held: all, or a tensor-parallel rank's range (the others' are empty Linears).
    UnitRange held;
    if (!held_units(m.gate, &held)) throw Error("internal: a rank's routed experts are not one range");
    for (int64_t e = held.begin; e < held.end; ++e) {
      linear(m.gate[size_t(e)]);
      linear(m.up[size_t(e)]);
      linear(m.down[size_t(e)]);
    }
    auto table = [&](const std::vector<Linear>& ws) {
      std::vector<const Linear*> d;
      for (int64_t e = held.begin; e < held.end; ++e) d.push_back(&dev(ws[size_t(e)]));
      return d.empty() ? cuda::WeightTable{} : cuda::weight_table(d.data(), int64_t(d.size()));
    };
    if (!m.gate.empty())
      experts_.emplace(&m, ExpertTables{table(m.gate), table(m.up), table(m.down), held.begin});
    if (L.has_ple) {
      const PleWeights& p = L.ple;
      linear(p.key_proj);
      linear(p.value_proj);
      for (const std::vector<float>* v : {&p.norm_key, &p.norm_query, &p.norm_conv, &p.conv}) vec(*v);
      upload_ple_table(p);
    }
  };
  linear(w.embed);
  linear(w.lm_head);
  mixer(w.mixer);
  vec(cfg_.rope.inv_freq);
  if (target_layers)
    for (const Qwen4LayerWeights& L : w.layers) {
      layer(L);
      ple_layers_.push_back(L.has_ple ? &L.ple : nullptr);
    }
  const Qwen4MtpWeights& m = w.mtp;
  linear(m.fc_embedding);
  linear(m.fc_hidden);
  vec(m.pre_fc_norm_embedding);
  vec(m.pre_fc_norm_hidden);
  mixer(m.mixer);
  for (const Qwen4LayerWeights& L : m.layers) {
    if (L.kind == Qwen4LayerKind::Linear || L.has_ple)
      throw Error("--device cuda: an MTP layer with Gated DeltaNet or PLE (the drafter keeps no recurrent state)");
    layer(L);
  }
}

size_t Qwen4CudaBlocks::weight_bytes_on_device() const {
  size_t bytes = weights_.bytes();
  for (const auto& [p, t] : ple_tables_) bytes += t.data.bytes();
  return bytes;
}

// ---- workspace, caches, state --------------------------------------------------------------------------------

void Qwen4CudaBlocks::ensure_workspace(int64_t S, int64_t P) {
  Workspace& w = *ws_;
  if (S <= w.rows && P <= w.positions) return;
  S = std::max(S, w.rows);
  P = std::max(P, w.positions);
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width(), SK = S * std::max(1, c.num_experts_per_tok);
  const int64_t qdim = int64_t(c.num_attention_heads) * 2 * c.head_dim, kvd = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t ratio = std::max<int64_t>(c.indexer_compress_ratio, 1);
  if (workspaces_.graphs_hold(ws_)) graphs_.forget("the workspace grew");  // (recorded with the old addresses)
  w = Workspace();
  for (cuda::DeviceBuffer* b : {&w.X, &w.Xn, &w.wgt, &w.lm_streams, &w.key, &w.gated, &w.normed, &w.h_prev})
    grow_device<float>(*b, S * CH);
  for (cuda::DeviceBuffer* b : {&w.x, &w.y, &w.value, &w.e_in, &w.e, &w.sh}) grow_device<float>(*b, S * H);
  grow_device<float>(w.inj, S * C);
  grow_device<float>(w.mid, S * c.hc_lowrank);
  std::vector<float> ones(size_t(S * C), 1.0f);
  grow_device<float>(w.ones, S * C);
  w.ones.upload(ones.data(), ones.size() * sizeof(float));
  grow_device<float>(w.qkv, S * c.conv_dim());
  grow_device<float>(w.conv, S * c.conv_dim());
  grow_device<float>(w.z, S * c.linear_value_dim());
  grow_device<float>(w.ab, S * 2 * c.linear_num_value_heads);
  grow_device<float>(w.core, S * std::max(c.linear_value_dim(), int64_t(c.num_attention_heads) * c.head_dim));
  // (padding rows run no recurrence: they read what real rows left in these, zero at first, always finite)
  cuda::fill_zero(w.conv.get(), w.conv.bytes());
  cuda::fill_zero(w.core.get(), w.core.bytes());
  grow_device<float>(w.q, S * qdim);
  grow_device<float>(w.kv, S * 2 * kvd);
  grow_device<float>(w.iq, S * int64_t(c.indexer_n_heads + 1) * c.indexer_head_dim);
  grow_device<float>(w.bscores, S * (P / ratio + 1));
  grow_device<int32_t>(w.blocks, S * std::max<int64_t>(c.block_topk(), 1));
  grow_device<int32_t>(w.bcount, S);
  grow_device<int32_t>(w.sel, S * qsa_selection_cap(c));
  grow_device<int32_t>(w.sel_count, S);
  grow_device<float>(w.router, S * std::max(1, c.num_experts));
  grow_device<int32_t>(w.ids, SK);
  grow_device<float>(w.wts, SK);
  grow_device<int32_t>(w.moe_i32, 2 * SK + std::max(1, c.num_experts) + 1);
  grow_device<float>(w.gathered, SK * H);
  grow_device<float>(w.eo, SK * H);
  grow_device<float>(w.ea, SK * c.moe_intermediate_size);
  grow_device<float>(w.eb, SK * c.moe_intermediate_size);
  grow_device<float>(w.sa, S * c.shared_expert_intermediate_size);
  grow_device<float>(w.sb, S * c.shared_expert_intermediate_size);
  grow_device<float>(w.sg, S);
  grow_device<float>(w.emb, S * std::max<int64_t>(c.ple_embed_dim, 1));
  grow_device<float>(w.logits, S * c.vocab_size);
  tp_.reserve(S, H);
  w.rows = S;
  w.positions = P;
  stream_rows_.reserve(S * CH);
}

void Qwen4CudaBlocks::reserve(int64_t rows, int64_t positions, int64_t page_tokens) {
  rows = std::max<int64_t>(rows, 1);
  positions = std::max<int64_t>(positions, 1);
  ws_ = workspaces_.for_steps(rows);
  ensure_workspace(rows, positions);
  // The per-forward uploads of `rows` rows (upload_rows's layout), each a span of its own with its page table,
  // and the padding span's: a buffer that grows later forgets every graph recorded with it.
  const int64_t pt = std::max<int64_t>(page_tokens, 1), pages = (positions + pt - 1) / pt;
  const int64_t ints = fixed_upload_ints(rows, true) + (rows + 1) * (pages + 1);
  Workspace& w = *ws_;
  if (w.meta_i32.bytes() < size_t(ints) * sizeof(int32_t) || w.meta_i64.bytes() < size_t(3 * rows) * sizeof(int64_t)) {
    grow_device<int32_t>(w.meta_i32, ints);
    grow_device<int64_t>(w.meta_i64, 3 * rows);
    if (workspaces_.graphs_hold(ws_)) graphs_.forget("the upload buffers grew");
  }
}

// A sequence's state slots on the device, zeroed (the state of length 0) at its first forward; its buffer comes
// back to states_ when the sequence ends.
void Qwen4CudaBlocks::attach_state(Qwen4ExpSequence& seq) {
  if (seq.device_state()) return;
  const size_t bytes = size_t(std::max<int64_t>(seq.slots() * seq.slot_floats(), 1)) * sizeof(float);
  cuda::DeviceBuffer buffer;
  for (auto it = states_->free.begin(); it != states_->free.end(); ++it)
    if (it->bytes() == bytes) {
      buffer = std::move(*it);
      states_->free.erase(it);
      break;
    }
  if (!buffer.get()) buffer = cuda::DeviceBuffer(bytes);
  cuda::fill_zero(buffer.get(), bytes);
  auto* held = new cuda::DeviceBuffer(std::move(buffer));
  std::weak_ptr<StateSlots> pool = states_;
  const std::shared_ptr<void> owner(held, [pool](void* p) {
    auto* b = static_cast<cuda::DeviceBuffer*>(p);
    if (auto slots = pool.lock()) slots->free.push_back(std::move(*b));
    delete b;
  });
  seq.set_device_state(std::shared_ptr<void>(owner, held->get()));  // (the device address, owned by `owner`)
}

// ---- a forward's rows ----------------------------------------------------------------------------------------

void Qwen4CudaBlocks::begin(const Qwen4RowSpan* spans, size_t count) {
  graphs_.abandon();  // (a forward that threw mid-way)
  stream_rows_.forget();
  spans_.assign(spans, spans + count);
  mirrors_.drop_expired();
  S_ = pad_ = 0;
  int64_t max_pos = 1;
  any_forced_ = false;
  all_forced_ = true;
  for (const Qwen4RowSpan& sp : spans_) {
    S_ += sp.rows;
    max_pos = std::max(max_pos, sp.seq ? sp.seq->capacity() : sp.cache->capacity());
    any_forced_ = any_forced_ || sp.forced;
    all_forced_ = all_forced_ && sp.forced && sp.forced->first_row <= 0;
    if (sp.seq) attach_state(*sp.seq);
  }
  if (S_ == 0) return;
  constexpr int64_t kMaxRows = 65535;  // (the attention kernels take a row per grid.x, heads per grid.y)
  if (S_ > kMaxRows)
    throw Error("cuda: a forward of " + std::to_string(S_) + " rows is more than the " + std::to_string(kMaxRows) +
                " the GPU's kernels take in one launch; send a shorter prompt");
  pad_ = padded_forward_rows(S_) - S_;
  S_ += pad_;
  ws_ = workspaces_.for_forward(S_, tp_.active());
  ensure_workspace(S_, std::max(max_pos, pad_));
  upload_rows();
}

// The int32 part of upload_rows's layout before the page tables, for S rows: 14 [S] fields, the PLE layers'
// [S, ngram heads] table rows, and the forced selections [S, forced_stride_] when any row is forced.
int64_t Qwen4CudaBlocks::fixed_upload_ints(int64_t S, bool forced) const {
  int64_t ple_layers = 0;
  for (const PleWeights* p : ple_layers_) ple_layers += p != nullptr;
  return (14 + ple_layers * cfg_.ngram_heads() + (forced ? forced_stride_ : 0)) * S;
}

// One upload of the rows' facts, at offsets set by the rows S alone (a recorded forward reads them there):
// int32 [S] each: tokens, span, slot, position, logit rows, QSA blocks a row sees, the position of the block it
// completes, forced count, forced-from, (unused), then [S] (at most a span a row) each: page size, first row,
// rows, first position; per PLE layer [S, ngram heads] table rows; forced selections [S, kForcedStride] when
// any; then the page tables. int64 [S] each: a span's page-table offset, its pool's plane table, its state
// slots' address. The padding rows (begin()) come last, as one more span of the attention's (its entries of the
// recurrent spans are empty: a padding row runs no recurrence); the real rows' count is at 9·S.
void Qwen4CudaBlocks::upload_rows() {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t S = S_, n = int64_t(spans_.size()), ratio = std::max<int64_t>(c.indexer_compress_ratio, 1);
  const int heads = c.ngram_heads();
  const int64_t forced_at = fixed_upload_ints(S, false), fixed = fixed_upload_ints(S, any_forced_);
  std::vector<int32_t>& m = meta_i32_;
  m.assign(size_t(fixed), 0);
  int32_t *tokens = m.data(), *span = tokens + S, *slot = span + S, *pos = slot + S, *logit_rows = pos + S;
  int32_t *blocks = logit_rows + S, *block_pos = blocks + S, *fcount = block_pos + S, *ffrom = fcount + S;
  int32_t *page_tokens = m.data() + 10 * S, *first_row = page_tokens + S, *rows = first_row + S, *pos0 = rows + S;
  std::vector<int64_t>& m64 = meta_i64_;
  m64.assign(size_t(3 * S), 0);
  logit_rows_ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Qwen4RowSpan& sp = spans_[size_t(i)];
    for (int64_t r = 0; r < sp.rows; ++r) {
      const int64_t row = sp.first_row + r, s = sp.slot0 + r;
      tokens[row] = tp_.local_token(sp.tokens[r]);
      span[row] = int32_t(i);
      slot[row] = int32_t(s);
      pos[row] = int32_t(sp.pos0 + r);
      blocks[row] = int32_t((s + 1) / ratio);
      block_pos[row] = sp.cache ? int32_t(sp.cache->base_position() + s + 1 - ratio) : 0;
      const bool forced = sp.forced && r >= sp.forced->first_row;
      fcount[row] = forced ? int32_t(std::min<int64_t>(sp.forced->count, forced_stride_)) : -1;
      ffrom[row] = forced ? int32_t(sp.forced->extend_from_slot >= 0 ? sp.forced->extend_from_slot : s + 1) : 0;
      if (forced)
        std::copy(sp.forced->slots, sp.forced->slots + fcount[row], m.data() + forced_at + row * forced_stride_);
      if (sp.all_logits || r == sp.rows - 1) logit_rows[logit_rows_++] = int32_t(row);
    }
    page_tokens[i] = sp.cache ? int32_t(sp.cache->page_tokens()) : 1;
    first_row[i] = int32_t(sp.first_row);
    rows[i] = int32_t(sp.rows);
    pos0[i] = int32_t(sp.pos0);
    m64[size_t(2 * S + i)] = sp.seq ? reinterpret_cast<int64_t>(sp.seq->device_state()) : 0;
  }
  for (int64_t r = 0; r < pad_; ++r) {  // the padding span: one page of kMaxPaddingRows slots
    const int64_t row = S - pad_ + r;
    tokens[row] = tp_.local_token(0);
    span[row] = int32_t(n);
    slot[row] = pos[row] = int32_t(r);
    blocks[row] = int32_t((r + 1) / ratio);
    block_pos[row] = int32_t(r + 1 - ratio);
    fcount[row] = all_forced_ ? 1 : -1;  // (no indexer runs when all are forced: the first slot, as forced)
    ffrom[row] = int32_t(r + 1);
  }
  if (pad_ > 0) page_tokens[n] = int32_t(kMaxPaddingRows);
  m[size_t(9 * S)] = int32_t(S - pad_);
  // PLE n-gram table rows per layer (target forwards: the spans' token histories, then their new tokens)
  ple_ids_.assign(ple_layers_.size(), nullptr);
  std::vector<int64_t>& ple_at = ple_at_;  // per layer: where its ids start in m (-1: none)
  ple_at.assign(ple_layers_.size(), -1);
  int64_t at = 14 * S;
  ngram_.resize(size_t(std::max(heads, 1)));
  for (size_t layer = 0; layer < ple_layers_.size(); ++layer) {
    const PleWeights* p = ple_layers_[layer];
    if (!p) continue;
    ple_at[layer] = at;
    at += S * heads;
    if (!spans_[0].seq) continue;  // (MTP forwards run no PLE layer)
    int32_t* ids = m.data() + ple_at[layer];
    for (const Qwen4RowSpan& sp : spans_) {
      const std::vector<int32_t>& history = sp.seq->tokens();
      const int64_t len = int64_t(history.size());
      auto token = [&](int64_t t) { return int64_t(t < len ? history[size_t(t)] : sp.tokens[t - len]); };
      for (int64_t r = 0; r < sp.rows; ++r) {
        ple_ngram_ids(c, *p, sp.pos0 + r, token, ngram_.data());
        for (int h = 0; h < heads; ++h) ids[(sp.first_row + r) * heads + h] = int32_t(ngram_[size_t(h)]);
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {  // the page tables, after the fixed part
    const Qwen4RowSpan& sp = spans_[size_t(i)];
    m64[size_t(i)] = int64_t(m.size());
    if (!sp.cache) {
      m.push_back(0);
      continue;
    }
    const int64_t pt = sp.cache->page_tokens(), pages = (sp.slot0 + sp.rows + pt - 1) / pt;
    m.insert(m.end(), sp.cache->page_table(), sp.cache->page_table() + pages);
    m64[size_t(S + i)] = reinterpret_cast<int64_t>(mirrors_.of(*sp.cache).table.get());
  }
  if (pad_ > 0) {
    m64[size_t(n)] = int64_t(m.size());
    m.push_back(0);
    if (spans_[0].cache)
      m64[size_t(S + n)] = reinterpret_cast<int64_t>(pad_planes_.like(*spans_[0].cache).table.get());
  }
  Workspace& w = *ws_;
  const void* before[2] = {w.meta_i32.get(), w.meta_i64.get()};
  // (twice what this forward needs when they grow: the page tables lengthen as sequences do)
  if (w.meta_i32.bytes() < m.size() * sizeof(int32_t)) grow_device<int32_t>(w.meta_i32, 2 * int64_t(m.size()));
  if (w.meta_i64.bytes() < m64.size() * sizeof(int64_t)) grow_device<int64_t>(w.meta_i64, 2 * int64_t(m64.size()));
  int32_t* d32 = device_as<int32_t>(w.meta_i32);
  int64_t* d64 = device_as<int64_t>(w.meta_i64);
  if ((d32 != before[0] || d64 != before[1]) && workspaces_.graphs_hold(ws_))
    graphs_.forget("the upload buffers grew");  // (recorded with the old addresses)
  cuda::copy_to_device(d32, m.data(), m.size() * sizeof(int32_t));
  cuda::copy_to_device(d64, m64.data(), m64.size() * sizeof(int64_t));
  tokens_ = d32;
  rc_.span = d32 + S;
  rc_.slot = d32 + 2 * S;
  rc_.position = d32 + 3 * S;
  logit_row_ids_ = d32 + 4 * S;
  blocks_of_ = d32 + 5 * S;
  block_position_ = d32 + 6 * S;
  forced_count_ = d32 + 7 * S;
  forced_from_ = d32 + 8 * S;
  real_rows_ = d32 + 9 * S;
  rc_.page_tokens = d32 + 10 * S;
  rc_.tables = d32;
  rc_.table_offset = d64;
  rc_.planes = reinterpret_cast<float* const* const*>(d64 + S);
  forced_ = any_forced_ ? d32 + forced_at : nullptr;
  rs_.state = reinterpret_cast<float* const*>(d64 + 2 * S);
  rs_.first_row = d32 + 11 * S;
  rs_.rows = d32 + 12 * S;
  rs_.pos0 = d32 + 13 * S;
  rs_.count = S;  // (the entries past the n spans have 0 rows: one graph serves any number of spans)
  rs_.slots = layout_.slots;
  rs_.slot_floats = spans_[0].seq ? spans_[0].seq->slot_floats() : 0;
  for (size_t layer = 0; layer < ple_at.size(); ++layer)
    if (ple_at[layer] >= 0) ple_ids_[layer] = d32 + ple_at[layer];
}

// At a forward's first block (embed_streams or mtp_input): replay its shape's graph, or record or run it. The
// spans' count is not part of the shape (the recurrent kernels take S span entries, the unused ones empty).
bool Qwen4CudaBlocks::replay_or_record(uintptr_t which) {
  if (!tp_.capturable()) return false;  // (host-staged collectives wait for the device mid-forward)
  if (!workspaces_.graphs_hold(ws_)) return false;  // (a long forward: eager, in buffers no graph holds)
  return graphs_.replay_or_record({S_, which, int(any_forced_) + 2 * int(all_forced_)});
}

void Qwen4CudaBlocks::finish() {
  graphs_.finish();
  read_selections();
}

// ---- blocks --------------------------------------------------------------------------------------------------

void Qwen4CudaBlocks::embed_streams(const Linear& embed) {
  if (replay_or_record(0)) return;  // (a target forward starts here)
  const int64_t C = cfg_.hc_count, H = cfg_.hidden_size;
  if (tp_.active()) {
    // Each rank embeds the rows whose tokens it owns (the others' are zero: their ids are -1 here, upload_rows),
    // and the sum over the ranks moves each row from its owner: owner's row + zeros, the same values.
    float* x = ws_->x.f32();
    cuda::embed_rows(dev(embed), tokens_, S_, 1, x, H);  // [S, H]
    tp_.sum(x, S_ * H);
    for (int64_t j = 0; j < C; ++j) cuda::copy_cols(x, S_, H, H, ws_->X.f32() + j * H, C * H);  // X [S, C, H]
    return;
  }
  cuda::embed_rows(dev(embed), tokens_, S_, int(C), ws_->X.f32(), C * H);  // X [S, C, H]
}

void Qwen4CudaBlocks::mix(const GatedResidualWeights& g, const float* X, int64_t rows, float* x, float* inj) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width();
  const float eps = float(c.rms_norm_eps);
  Workspace& w = *ws_;
  float* Xn = w.Xn.f32();
  cuda::rms_norm_groups(X, rows, C, H, CH, H, dev(g.hc_norm), H, eps, Xn);  // per stream
  cuda::matmul(Xn, rows, dev(g.mix_down), w.mid.f32());                   // [rows, rank]
  cuda::map(w.mid.f32(), rows * c.hc_lowrank, cuda::Map::kSiluOf, float(C));
  cuda::matmul(w.mid.f32(), rows, dev(g.mix_up), w.wgt.f32());  // [rows, C·H]
  cuda::mul_sigmoid(Xn, w.wgt.f32(), rows * CH, w.wgt.f32());
  cuda::stream_mean(w.wgt.f32(), rows, C, H, x);
  if (!inj) return;
  cuda::matmul(Xn, rows, dev(g.inject), inj);  // [rows, C]
  cuda::map(inj, rows * C, cuda::Map::kTwoSigmoidOf, float(C));
}

void Qwen4CudaBlocks::gated_residual(const GatedResidualWeights& g, bool inject) {
  if (graphs_.skipping()) return;
  mix(g, ws_->X.f32(), S_, ws_->x.f32(), inject ? ws_->inj.f32() : nullptr);
}

void Qwen4CudaBlocks::inject() {
  if (graphs_.skipping()) return;
  cuda::hc_post(ws_->X.f32(), ws_->inj.f32(), ws_->y.f32(), S_, cfg_.hc_count, cfg_.hidden_size);
}

void Qwen4CudaBlocks::ple_add(const PleWeights& p, int layer) {
  if (graphs_.skipping()) return;
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width(), S = S_, dph = c.ple_head_dim();
  const float eps = float(c.rms_norm_eps);
  Workspace& w = *ws_;
  const int32_t* ids = size_t(layer) < ple_ids_.size() ? ple_ids_[size_t(layer)] : nullptr;
  if (!ids) throw Error("internal: PLE without its n-gram ids (not a target forward?)");
  cuda::embed_rows(ple_tables_.at(&p).w, ids, S * c.ngram_heads(), 1, w.emb.f32(), dph);  // [S, E]
  const ops::MatmulOut outs[] = {{&dev(p.key_proj), w.key.f32()}, {&dev(p.value_proj), w.value.f32()}};
  cuda::matmul_many(w.emb.f32(), S, outs, 2);  // key [S, C·H], value [S, H]
  cuda::rms_norm_groups(w.key.f32(), S, C, H, CH, H, dev(p.norm_key), H, eps, w.key.f32());
  cuda::rms_norm_groups(w.X.f32(), S, C, H, CH, H, dev(p.norm_query), H, eps, w.Xn.f32());  // the queries
  cuda::stream_gates(w.key.f32(), w.Xn.f32(), w.value.f32(), S, C, H, w.gated.f32());
  cuda::rms_norm_groups(w.gated.f32(), S, C, H, CH, H, dev(p.norm_conv), H, eps, w.normed.f32());
  cuda::causal_conv_rows(w.normed.f32(), CH, CH, dev(p.conv), c.ple_conv_kernel_size, c.ngram_size, rs_,
                         layout_.ple_off[size_t(layer)], w.gated.f32(), CH, /*accumulate=*/true);
  cuda::add(w.X.f32(), w.gated.f32(), S * CH);
}

// (a tensor-parallel rank without Gated DeltaNet heads adds nothing to the ranks' sum: an FP8 out_proj whose
// scale block spans every head's columns puts them all on one rank)
void Qwen4CudaBlocks::gdn(const GdnWeights& g, int layer) {
  if (graphs_.skipping()) return;
  if (cfg_.linear_num_key_heads > 0)
    gdn_rows(g, layer);
  else
    cuda::fill_zero(ws_->y.get(), size_t(S_ * cfg_.hidden_size) * sizeof(float));
  if (tp_.active()) tp_.sum(ws_->y.f32(), S_ * cfg_.hidden_size);
}

void Qwen4CudaBlocks::gdn_rows(const GdnWeights& g, int layer) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t S = S_, CD = c.conv_dim(), Kd = c.linear_key_dim(), nv = c.linear_num_value_heads;
  const int64_t K = c.linear_conv_kernel_dim;
  Workspace& w = *ws_;
  float *qkv = w.qkv.f32(), *ab = w.ab.f32();
  const ops::MatmulOut outs[] = {{&dev(g.in_q), qkv, CD},     {&dev(g.in_k), qkv + Kd, CD},
                                 {&dev(g.in_v), qkv + 2 * Kd, CD}, {&dev(g.in_z), w.z.f32(), -1},
                                 {&dev(g.in_b), ab, -1},       {&dev(g.in_a), ab + S * nv, -1}};
  cuda::matmul_many(w.x.f32(), S, outs, 6);
  const int64_t off = layout_.state_off[size_t(layer)];
  cuda::causal_conv_rows(qkv, CD, CD, dev(g.conv), K, 1, rs_, off, w.conv.f32(), CD, false);  // [S, CD]
  const bool sigmoid_gate = (c.output_gate_type.empty() ? c.hidden_act : c.output_gate_type) == "sigmoid";
  const cuda::DeltaRuleShape shape{c.linear_num_key_heads, nv, c.linear_key_head_dim, c.linear_value_head_dim,
                                   float(c.rms_norm_eps), sigmoid_gate};
  cuda::gated_delta_rule(w.conv.f32(), ab, ab + S * nv, w.z.f32(), dev(g.neg_A), dev(g.dt_bias), dev(g.norm), shape,
                         rs_, off + (K - 1) * CD, w.core.f32());  // [S, nv·dv]
  cuda::matmul(w.core.f32(), S, dev(g.out_proj), w.y.f32());
}

// (a tensor-parallel rank without query heads adds nothing to the ranks' sum)
void Qwen4CudaBlocks::qsa(const QsaWeights& a, size_t cache_layer) {
  if (graphs_.skipping()) return;
  if (cfg_.num_attention_heads > 0)
    qsa_rows(a, cache_layer);
  else
    cuda::fill_zero(ws_->y.get(), size_t(S_ * cfg_.hidden_size) * sizeof(float));
  if (tp_.active()) tp_.sum(ws_->y.f32(), S_ * cfg_.hidden_size);
}

void Qwen4CudaBlocks::qsa_rows(const QsaWeights& a, size_t cache_layer) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t S = S_, hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads, kvd = nkv * hd;
  const int64_t ih = c.indexer_n_heads, ihd = c.indexer_head_dim, ratio = c.indexer_compress_ratio;
  const int64_t idim = (ih + 1) * ihd, rope = c.rope.dim, btk = std::max<int64_t>(c.block_topk(), 1);
  const int64_t sel_cap = qsa_selection_cap(c);
  const float eps = float(c.rms_norm_eps), af = float(c.rope.attention_factor);
  const float* inv_freq = dev(c.rope.inv_freq);
  Workspace& w = *ws_;
  const LayerPlanes& planes = spans_[0].cache->layer_planes(cache_layer);
  float *q = w.q.f32(), *kv = w.kv.f32(), *iq = w.iq.f32();
  const ops::MatmulOut outs[] = {{&dev(a.q_proj), q, -1},
                                 {&dev(a.k_proj), kv, 2 * kvd},
                                 {&dev(a.v_proj), kv + kvd, 2 * kvd},
                                 {&dev(a.index_qk), iq, -1}};
  cuda::matmul_many(w.x.f32(), S, outs, 4);  // q [S, nh, 2hd], kv [S, k | v], iq [S, ih + 1, ihd]
  // The selection (the indexer's queries and keys, the pooled block keys, their scores and top-k) runs as a
  // branch beside the queries' and keys' norms, RoPE and cache writes; they meet at the attention.
  cuda::branch_begin();
  cuda::rms_norm_groups(iq, S, ih, ihd, idim, ihd, dev(a.index_q_norm), 0, eps, iq);
  cuda::rope_rows(iq, S, ih, idim, ihd, 0, rope, rc_.position, inv_freq, af);
  cuda::write_cache_rows(iq + ih * ihd, S, ihd, idim, rc_, planes.index_plane, 2 * ihd);  // the raw index key
  cuda::pool_block_keys(rc_, planes.index_plane, S, ihd, ratio, dev(a.index_k_norm), eps, rope, inv_freq, af,
                        block_position_);
  int32_t *blocks = device_as<int32_t>(w.blocks), *bcount = device_as<int32_t>(w.bcount);
  if (!all_forced_) {
    const int64_t stride = w.positions / ratio + 1;
    cuda::block_scores(iq, idim, S, ih, ihd, rc_, planes.index_plane, ratio, stride,
                       1.0f / std::sqrt(float(ihd)), w.bscores.f32(), stride);
    cuda::topk_rows(w.bscores.f32(), S, stride, blocks_of_, btk, blocks, bcount);
  }
  int32_t *sel = device_as<int32_t>(w.sel), *count = device_as<int32_t>(w.sel_count);
  cuda::expand_selection(rc_, S, ratio, blocks, bcount, btk, forced_, forced_count_, forced_from_, forced_stride_, sel,
                         count, sel_cap);
  cuda::branch_end();
  cuda::rms_norm_groups(q, S, nh, hd, nh * 2 * hd, 2 * hd, dev(a.q_norm), 0, eps, q);
  cuda::rms_norm_groups(kv, S, nkv, hd, 2 * kvd, hd, dev(a.k_norm), 0, eps, kv);
  cuda::rope_rows(q, S, nh, nh * 2 * hd, 2 * hd, 0, rope, rc_.position, inv_freq, af);
  cuda::rope_rows(kv, S, nkv, 2 * kvd, hd, 0, rope, rc_.position, inv_freq, af);
  cuda::write_cache_rows(kv, S, 2 * kvd, 2 * kvd, rc_, planes.key_plane);
  cuda::branch_join();
  cuda::sparse_gqa_attention(q, S, nh, nkv, hd, rc_, planes.key_plane, sel, count, sel_cap, float(c.attn_scale),
                             w.core.f32());  // [S, nh, hd]
  cuda::matmul(w.core.f32(), S, dev(a.o_proj), w.y.f32());
}

void Qwen4CudaBlocks::read_selections() {
  read_last_selections(spans_, device_as<int32_t>(ws_->sel_count), device_as<int32_t>(ws_->sel),
                       qsa_selection_cap(cfg_), host_sel_count_, host_sel_);
}

size_t Qwen4CudaBlocks::moe(const MoeWeights& m) {
  if (graphs_.skipping()) return 0;
  const Qwen4ExpConfig& c = cfg_;
  const int64_t S = S_, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, SK = S * k;
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  Workspace& w = *ws_;
  const float* x = w.x.f32();
  const ExpertTables& t = experts_.at(&m);
  // The shared expert runs as a branch beside the routing and the routed experts; they meet at the combine.
  const float* shared = nullptr;
  if (m.shared_gate.out > 0) {  // sigmoid(shared_expert_gate(x)) · shared_expert(x)
    cuda::branch_begin();
    const ops::MatmulOut outs[] = {{&dev(m.shared_gate), w.sa.f32()}, {&dev(m.shared_up), w.sb.f32()},
                                   {&dev(m.shared_expert_gate), w.sg.f32()}};
    cuda::matmul_many(x, S, outs, 3);
    cuda::swiglu(w.sa.f32(), w.sb.f32(), S * Is, 0.0f, w.sa.f32());
    cuda::matmul(w.sa.f32(), S, dev(m.shared_down), w.sh.f32());  // [S, H]
    cuda::scale_rows_sigmoid(w.sh.f32(), w.sg.f32(), S, H);
    shared = w.sh.f32();
    cuda::branch_end();
  }
  cuda::matmul(x, S, dev(m.router), w.router.f32());  // [S, E]
  int32_t* ids = device_as<int32_t>(w.ids);
  int32_t *token_of = device_as<int32_t>(w.moe_i32), *row_of = token_of + SK, *first = row_of + SK;
  cuda::moe_route_softmax(w.router.f32(), S, E, k, c.norm_topk_prob, ids, w.wts.f32());
  cuda::moe_dispatch(ids, S, k, E, first, token_of, row_of, real_rows_);  // (padding rows run no expert)
  cuda::gather_rows(x, H, token_of, SK, w.gathered.f32());  // [S·k, H]
  // (a tensor-parallel rank runs its own experts' rows, first[t.first ..]; the others' rows add zero)
  if (tp_.active()) cuda::fill_zero(w.eo.get(), size_t(SK * H) * sizeof(float));
  if (t.gate.count > 0) {
    const int32_t* held = first + t.first;
    cuda::grouped_matmul(w.gathered.f32(), t.gate, held, SK, w.ea.f32());  // [S·k, I]
    cuda::grouped_matmul(w.gathered.f32(), t.up, held, SK, w.eb.f32());
    cuda::swiglu(w.ea.f32(), w.eb.f32(), SK * I, 0.0f, w.ea.f32());
    cuda::grouped_matmul(w.ea.f32(), t.down, held, SK, w.eo.f32());  // [S·k, H]
  }
  cuda::branch_join();
  cuda::moe_combine(w.eo.f32(), row_of, w.wts.f32(), S, k, H, shared, w.y.f32());
  if (tp_.active()) tp_.sum(w.y.f32(), S * H);
  return 0;  // (which experts ran stays on the device)
}

void Qwen4CudaBlocks::mtp_input(const Qwen4MtpWeights& m, const Linear& embed, DraftRequest* const* requests,
                                size_t count) {
  const Qwen4ExpConfig& c = cfg_;
  const int64_t H = c.hidden_size, C = c.hc_count, CH = c.hc_width(), S = S_;
  const float eps = float(c.rms_norm_eps);
  Workspace& w = *ws_;
  std::vector<float>& h = host_f32_;
  h.resize(size_t(S * CH));
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    std::copy(r.h_prev, r.h_prev + r.rows * CH, h.data() + row * CH);
    row += r.rows;
  }
  std::fill(h.begin() + row * CH, h.end(), 0.0f);  // the padding rows
  cuda::copy_to_device(w.h_prev.f32(), h.data(), h.size() * sizeof(float));
  // (after the upload: an MTP forward starts here; its shape is its layer's, every request being of one layer)
  const Qwen4LayerWeights& layer = m.layers.at(size_t(requests[0]->layer));
  if (replay_or_record(reinterpret_cast<uintptr_t>(&layer))) return;
  // e = fc_embedding(pre_fc_norm_embedding(embed(token)))  [S, H]
  cuda::embed_rows(dev(embed), tokens_, S, 1, w.e_in.f32(), H);
  cuda::rms_norm_rows(w.e_in.f32(), S, H, H, dev(m.pre_fc_norm_embedding), eps, w.e_in.f32(), H);
  cuda::matmul(w.e_in.f32(), S, dev(m.fc_embedding), w.e.f32());
  // X = fc_hidden(pre_fc_norm_hidden(h_prev)) per stream, + e on every stream  [S, C·H]
  cuda::rms_norm_rows(w.h_prev.f32(), S, CH, CH, dev(m.pre_fc_norm_hidden), eps, w.Xn.f32(), CH);
  cuda::matmul(w.Xn.f32(), S * C, dev(m.fc_hidden), w.X.f32());
  cuda::hc_post(w.X.f32(), w.ones.f32(), w.e.f32(), S, C, H);
}

// ---- what comes back to the host -----------------------------------------------------------------------------

void Qwen4CudaBlocks::read_streams(int64_t first, int64_t rows, float* out) {
  const int64_t CH = cfg_.hc_width();
  stream_rows_.read(ws_->X.f32(), CH, S_ - pad_, first, rows, out);
}

// logits [rows, V] on the device = lm_head(mixer(X [rows, C·H])).
const float* Qwen4CudaBlocks::final_logits(const GatedResidualWeights& mixer, const Linear& lm_head, const float* X,
                                           int64_t rows) {
  float* x = ws_->x.f32();
  mix(mixer, X, rows, x, nullptr);
  if (tp_.active())
    tp_.logits(dev(lm_head), x, rows, cfg_.vocab_size, ws_->logits.f32());  // (each rank's part, gathered)
  else
    cuda::matmul(x, rows, dev(lm_head), ws_->logits.f32());  // [rows, V]
  return ws_->logits.f32();
}

void Qwen4CudaBlocks::logits(const GatedResidualWeights& mixer, const Linear& lm_head, float* out) {
  // The rows that want logits (every row of an all_logits span, else its last), gathered, through the mixer.
  float* rows = ws_->lm_streams.f32();
  cuda::gather_rows(ws_->X.f32(), cfg_.hc_width(), logit_row_ids_, logit_rows_, rows);
  logit_out_.mark_greedy(spans_, logit_rows_);
  if (tp_.active() && logit_out_.all_by_id(logit_rows_)) {  // (each rank's best per row: no logits gathered)
    mix(mixer, rows, logit_rows_, ws_->x.f32(), nullptr);
    tp_.argmax(dev(lm_head), ws_->x.f32(), logit_rows_, logit_out_.ids_for(logit_rows_));
  } else {
    const float* logits = final_logits(mixer, lm_head, rows, logit_rows_);
    logit_out_.read(logits, logit_rows_, cfg_.vocab_size, out);
  }
  logit_out_.deliver_ids(spans_);
}

void Qwen4CudaBlocks::logits_of(const GatedResidualWeights& mixer, const Linear& lm_head, const float* streams,
                                int64_t rows, float* out, int32_t* argmax, int64_t argmax_rows) {
  if (rows <= 0) return;
  ensure_workspace(rows, 1);
  float* X = ws_->lm_streams.f32();
  cuda::copy_to_device(X, streams, size_t(rows * cfg_.hc_width()) * sizeof(float));
  const float* logits = final_logits(mixer, lm_head, X, rows);
  const int64_t greedy = std::clamp<int64_t>(argmax_rows, 0, rows);
  logit_out_.mark_first(rows, greedy);
  logit_out_.read(logits, rows, cfg_.vocab_size, out);
  std::copy(logit_out_.ids().begin(), logit_out_.ids().begin() + greedy, argmax);
}

// ---- tensor parallel ----------------------------------------------------------------------------------------

void Qwen4CudaBlocks::set_tensor_parallel(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab) {
  tp_.set(comm, std::move(vocab));
  graphs_.forget("tensor parallel");
  ws_ = workspaces_.reset();  // (the next forward sizes it with the gathers' buffers)
}

}  // namespace nextn
