// HY V4: memory, sequences, and the forwards as builders over the backend's blocks (blocks.h); model.h has
// the data flow.
#include "models/hy_v4/model.h"
#include "models/hy_v4/cuda_blocks.h"
#include "models/hy_v4/sharding.h"
#include "core/communicator.h"
#include "models/common/device_memory.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <type_traits>

#include "core/error.h"
#include "core/profile.h"
#include "core/sizes.h"
#include "core/threadpool.h"
#include "models/common/mlp_bytes.h"
#include "models/common/prepared_forwards.h"
#include "models/common/scan.h"

#include <unistd.h>

namespace nextn {

HYV4Model::~HYV4Model() = default;

void HYV4Model::prefault(bool progress) const { prefault_weights(store_, dir_, progress); }

void HYV4Model::use_device(Device device) {
  if (device == device_) return;
  if (target_pool_) throw Error("use_device: the model already has sequences on its current device");
  if (shard_) return use_device_as_rank(device);
  if (device == Device::kCuda) {
    require_device_room(dir_, checkpoint_bytes());
    device_blocks_ = std::make_unique<HYV4CudaBlocks>(cfg_, w_);
    blocks_ = device_blocks_.get();
    draft_head_.hold_in(*blocks_);
  } else {
    blocks_ = cpu_blocks_.get();
    device_blocks_.reset();
  }
  device_ = device;
}

// A rank moves to its GPU (rank r on GPU r mod the GPUs it sees): its shard's blocks, and on rank 0 the MTP
// layers' over the whole weights (the target's layers stay off that GPU: the shard holds rank 0's part). Every
// rank makes this call at once (TensorParallelModel::use_device): the device collectives are set up together.
void HYV4Model::use_device_as_rank(Device device) {
  shard_device_blocks_.reset();
  device_comm_.reset();
  device_blocks_.reset();
  blocks_ = cpu_blocks_.get();
  device_ = Device::kCpu;
  if (device != Device::kCuda) return;
  device_comm_ = join_gpu_group(*tp_comm_, dir_, checkpoint_bytes() / size_t(tp_comm_->size()));
  shard_device_blocks_ = std::make_unique<HYV4CudaBlocks>(shard_->config, shard_->weights);
  shard_device_blocks_->set_tensor_parallel(device_comm_.get(), shard_->vocab);
  if (tp_comm_->rank() == 0) {
    device_blocks_ = std::make_unique<HYV4CudaBlocks>(cfg_, w_, HYV4CudaBlocks::Uploads::kAllButTargetLayers);
    blocks_ = device_blocks_.get();
    draft_head_.hold_in(*blocks_);
  }
  device_ = device;
}

std::string HYV4Model::use_draft_head(DraftHeadKind kind) {
  if (num_mtp_layers() == 0) return "";
  draft_head_.build(w_.lm_head, kind, cpu_blocks_->pool());
  draft_head_.hold_in(*blocks_);
  return draft_head_.describe(w_.lm_head);
}

std::string HYV4Model::collectives() const { return device_comm_ ? device_comm_->describe() : ""; }

void HYV4Model::make_tensor_parallel_rank(Communicator& comm) {
  if (target_pool_) throw Error("tensor parallel: the model already has sequences");
  if (device_ != Device::kCpu) throw Error("tensor parallel: make the ranks before moving them to a GPU");
  tp_comm_ = &comm;
  shard_ = std::make_unique<HYV4Shard>(shard_target(cfg_, w_, comm.rank(), comm.size()));
  shard_blocks_ = std::make_unique<HYV4CpuBlocks>(shard_->config, cpu_blocks_->pool());
  shard_blocks_->tuning() = cpu_blocks_->tuning();
  shard_blocks_->set_tensor_parallel(&comm, shard_->vocab);
}

uint64_t HYV4Model::one_off_forwards() const {
  const HYV4Blocks* shard = shard_device_blocks_.get();  // (a rank's target forwards, on its GPU)
  return blocks_->one_off_forwards() + (shard ? shard->one_off_forwards() : 0);
}

void HYV4Model::check_tensor_parallel(int ranks) const {
  if (device_ != Device::kCpu) throw Error("tensor parallel: make the ranks before moving them to a GPU");
  for (int r = 0; r < ranks; ++r) shard_target(cfg_, w_, r, ranks);
}

HYV4Blocks& HYV4Model::target_blocks() {
  if (!shard_) return *blocks_;
  return shard_device_blocks_ ? static_cast<HYV4Blocks&>(*shard_device_blocks_) : *shard_blocks_;
}
const HYV4Weights& HYV4Model::target_weights() const { return shard_ ? shard_->weights : w_; }

size_t HYV4Model::weight_bytes_with(size_t routed_bytes) const {
  size_t total = w_.lm_head.weight_bytes() + routed_bytes;
  for (const auto& L : w_.layers) {
    const AttentionWeights& a = L.attn;
    total += a.q_a_proj.weight_bytes() + a.q_b_proj.weight_bytes() + a.kv_a_proj.weight_bytes() +
             a.kv_b_proj.weight_bytes() + a.o_proj.weight_bytes() + a.gate_proj.weight_bytes();
    if (a.has_indexer)
      total += a.indexer.wq_b.weight_bytes() + a.indexer.wk.weight_bytes() + a.indexer.weights_proj.weight_bytes();
    const FfnWeights& f = L.ffn;
    total += swiglu_bytes(f.gate_proj, f.up_proj, f.down_proj);
    if (f.sparse && !f.expert_gate.empty()) total += f.router.weight_bytes();
    total += L.attn_hc.fn.weight_bytes() + L.ffn_hc.fn.weight_bytes();
  }
  return total;
}

size_t HYV4Model::checkpoint_bytes() const {
  size_t total = 0;
  for (const auto& f : store_.files()) total += f->file_bytes();
  return total;
}

size_t HYV4Model::weight_bytes_total() const {
  size_t routed = 0;  // one token: num_experts_per_tok experts per MoE layer
  for (const auto& L : w_.layers)
    if (L.ffn.sparse && !L.ffn.expert_gate.empty())
      routed += size_t(cfg_.num_experts_per_tok) *
                swiglu_bytes(L.ffn.expert_gate[0], L.ffn.expert_up[0], L.ffn.expert_down[0]);
  return weight_bytes_with(routed);
}

size_t HYV4Model::last_forward_weight_bytes() const { return weight_bytes_with(last_routed_bytes_); }

void HYV4Model::init_facts() {
  facts_.model_type = "hy_v4";
  facts_.dir = dir_;
  facts_.vocab_size = cfg_.vocab_size;
  facts_.hidden_width = cfg_.hidden_size;
  facts_.context = cfg_.max_position_embeddings;
  facts_.num_mtp_layers = num_mtp_layers();
  facts_.sparse_budget = cfg_.index_topk;
  for (int64_t e : cfg_.eos_token_ids) facts_.eos_token_ids.push_back(static_cast<int32_t>(e));
}

// ---------------------------------------------------------------------------------------------------
// KV memory: per target layer a key plane [kv_lora + rope] and, for layers with their own indexer, an
// index plane [index_head_dim]; the MTP layers share a pool of one key and one index plane.

std::vector<int64_t> HYV4Model::target_plane_widths(std::vector<LayerPlanes>* layers) const {
  std::vector<int64_t> widths;
  for (const auto& L : w_.layers) {
    LayerPlanes lp;
    lp.key_plane = static_cast<int>(widths.size());
    widths.push_back(cfg_.kv_lora_rank + cfg_.qk_rope_head_dim);
    if (L.attn.has_indexer) {
      lp.index_plane = static_cast<int>(widths.size());
      widths.push_back(cfg_.index_head_dim);
    }
    if (layers) layers->push_back(lp);
  }
  return widths;
}

std::vector<int64_t> HYV4Model::draft_plane_widths() const {
  return {cfg_.kv_lora_rank + cfg_.qk_rope_head_dim, cfg_.index_head_dim};
}

// A cache of `capacity` positions must lie within the context and fit in memory (checked before any pool
// is allocated).
void HYV4Model::require_cache_fits(int64_t capacity, bool target, const char* what) const {
  const int64_t context = cfg_.max_position_embeddings;
  if (capacity < 0 || capacity > context)
    throw Error(std::string(what) + " of " + std::to_string(capacity) +
                " positions: outside the model's context (max_position_embeddings = " + std::to_string(context) + ")");
  const auto widths = target ? target_plane_widths(nullptr) : draft_plane_widths();
  int64_t per_position = 0;
  for (int64_t w : widths) per_position = checked_add(per_position, w, what);
  require_memory(checked_mul(checked_mul(capacity, per_position, what), int64_t(sizeof(float)), what),
                 std::string("a ") + what + " of " + std::to_string(capacity) + " positions");
}

// The page of a cache's own pool: the configured page, or the whole capacity when that is smaller.
int64_t HYV4Model::own_pool_page(int64_t capacity) const {
  return std::clamp<int64_t>(capacity, 1, memory_.page_tokens);
}

KVCache HYV4Model::new_cache(int64_t capacity) const {
  require_cache_fits(capacity, true, "KV cache");
  std::vector<LayerPlanes> layers;
  auto widths = target_plane_widths(&layers);
  const int64_t page = own_pool_page(capacity);
  auto pool = std::make_shared<KVPool>("KV cache", std::move(widths), page, (capacity + page - 1) / page);
  return KVCache(std::move(pool), std::move(layers), capacity);
}

KVCache HYV4Model::new_draft_cache(int64_t capacity) const {
  require_cache_fits(capacity, false, "MTP draft KV cache");
  const int64_t page = own_pool_page(capacity);
  auto pool = std::make_shared<KVPool>("MTP draft KV cache", draft_plane_widths(), page, (capacity + page - 1) / page);
  return KVCache(std::move(pool), {LayerPlanes{0, 1}}, capacity);
}

int64_t HYV4Model::sequence_bytes(int64_t capacity, bool drafting) const {
  const std::string what = "the KV cache of a sequence";
  const int64_t page = memory_.page_tokens, pages = (capacity + page - 1) / page;
  int64_t bytes = checked_mul(pages, KVPool::bytes_per_page(target_plane_widths(nullptr), page), what);
  if (drafting && num_mtp_layers() > 0)
    bytes = checked_add(bytes, checked_mul(pages * num_mtp_layers(), KVPool::bytes_per_page(draft_plane_widths(), page), what), what);
  return bytes;
}

int64_t HYV4Model::memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const {
  const std::string what = "the KV memory of " + std::to_string(sequences) + " sequences";
  const int64_t pages = (capacity + page_tokens - 1) / page_tokens;
  return checked_mul(checked_mul(sequences, pages * page_tokens, what), kv_bytes_per_position(true), what);
}

int64_t HYV4Model::kv_bytes_per_position(bool drafting) const {
  int64_t bytes = KVPool::bytes_per_page(target_plane_widths(nullptr), 1);
  if (drafting) bytes += num_mtp_layers() * KVPool::bytes_per_page(draft_plane_widths(), 1);
  return bytes;
}

void HYV4Model::configure_memory(const MemoryOptions& options) {
  if (target_pool_) throw Error("configure_memory: the KV pool is already in use");
  if (options.page_tokens < 1 || options.page_tokens > 4096) throw Error("KV page size must be in 1..4096 positions");
  if (options.kv_cache_bytes < 0) throw Error("KV cache size must not be negative");
  memory_ = options;
}

// The pools are made at the first sequence: by default as large as one sequence of the whole context (with
// its MTP layers); pages are only touched as they are written, so unused capacity costs address space only.
void HYV4Model::ensure_pools() {
  if (target_pool_) return;
  const int64_t page = memory_.page_tokens;
  const auto target_widths = target_plane_widths(nullptr);
  const auto draft_widths = draft_plane_widths();
  const int64_t nl = num_mtp_layers();
  int64_t target_pages, draft_pages;
  if (memory_.kv_cache_bytes > 0) {
    // Split the bytes so that both pools run out at the same number of positions (every sequence drafts).
    const int64_t t = KVPool::bytes_per_page(target_widths, page), d = nl * KVPool::bytes_per_page(draft_widths, page);
    target_pages = memory_.kv_cache_bytes / (t + d);
    draft_pages = target_pages * nl;
    if (target_pages < 1)
      throw Error("--kv-cache-mb: " + gib(memory_.kv_cache_bytes) + " holds no KV page (a page of " +
                  std::to_string(page) + " positions takes " + std::to_string(t + d) + " bytes)");
  } else {
    const int64_t context = cfg_.max_position_embeddings;
    require_memory(sequence_bytes(context, true), "a KV cache of " + std::to_string(context) +
                                                       " positions (the context; set a smaller one with --kv-cache-mb)");
    target_pages = (context + page - 1) / page;
    draft_pages = target_pages * nl;
  }
  target_pool_ = std::make_shared<KVPool>("KV cache", target_widths, page, target_pages);
  draft_pool_ = std::make_shared<KVPool>("MTP draft KV cache", draft_widths, page, draft_pages);
}

bool HYV4Model::can_admit(int64_t capacity, bool drafting) const {
  if (!target_pool_) return could_ever_admit(capacity, drafting);
  const int64_t pages = target_pool_->pages_for(capacity);
  return pages <= target_pool_->unreserved_pages() &&
         (!drafting || num_mtp_layers() == 0 || pages * num_mtp_layers() <= draft_pool_->unreserved_pages());
}

bool HYV4Model::could_ever_admit(int64_t capacity, bool drafting) const {
  if (capacity > cfg_.max_position_embeddings) return false;
  if (!target_pool_) {
    if (memory_.kv_cache_bytes <= 0) return true;
    return sequence_bytes(capacity, drafting) <= memory_.kv_cache_bytes;
  }
  const int64_t pages = target_pool_->pages_for(capacity);
  return pages <= target_pool_->pages() && (!drafting || pages * num_mtp_layers() <= draft_pool_->pages());
}

double HYV4Model::kv_usage() const {
  if (!target_pool_ || target_pool_->pages() == 0) return 0.0;
  return 1.0 - double(target_pool_->unreserved_pages()) / double(target_pool_->pages());
}

std::string HYV4Model::memory_summary() const {
  if (!target_pool_) return "KV pool not allocated yet";
  return target_pool_->describe() + ", " + draft_pool_->describe();
}

std::unique_ptr<SequenceState> HYV4Model::new_sequence(int64_t capacity) {
  require_cache_fits(capacity, true, "KV cache");
  if (!could_ever_admit(capacity, false)) {
    const int64_t need = sequence_bytes(capacity, true);
    throw Error("a sequence of " + std::to_string(capacity) + " positions needs " + gib(need) +
                " of KV cache, more than the KV pool holds (" + gib(memory_.kv_cache_bytes) +
                "; raise --kv-cache-mb or shorten max_tokens)");
  }
  ensure_pools();
  std::vector<LayerPlanes> layers;
  target_plane_widths(&layers);
  return std::make_unique<HYV4Sequence>(this, KVCache(target_pool_, std::move(layers), capacity));
}

KVCache HYV4Model::new_shared_draft_cache(int64_t capacity) {
  ensure_pools();
  return KVCache(draft_pool_, {LayerPlanes{0, 1}}, capacity);
}

std::unique_ptr<DraftSession> HYV4Model::new_draft_session(SequenceState& sequence, const DraftOptions& options) {
  if (num_mtp_layers() == 0) return nullptr;
  auto* seq = dynamic_cast<HYV4Sequence*>(&sequence);
  if (!seq || seq->owner() != this) throw Error("new_draft_session: the sequence does not belong to this model");
  return std::make_unique<ChainedDraftSession<HYV4Model>>(*this, seq->capacity(), options);
}

void HYV4Model::prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) {
  if (num_mtp_layers() == 0) throw Error(dir_ + ": the checkpoint has no MTP layers (num_nextn_predict_layers = 0)");
  if (T < 2) return;
  KVCache dc = new_draft_cache(T);
  draft_forward(0, tokens + 1, hidden, T - 1, 0, dc, logits, nullptr);
}

void HYV4Model::reserve_batch(int64_t rows, int64_t positions) {
  blocks_->reserve(rows, positions, memory_.page_tokens);
  if (shard_) target_blocks().reserve(rows, positions, memory_.page_tokens);
  spans_.reserve(static_cast<size_t>(rows));
}

// The shapes of a batch of up to `rows` rows (prepared_forwards.h) over scratch caches of their own, dropped
// after: the target's over a cache of S_max positions, each MTP layer's over one of S_max + 1 (slot 0 written
// first, for the forced rows).
int64_t HYV4Model::prepare_forwards(int64_t rows, int64_t positions) {
  // (tensor-parallel ranks run their target forwards together: their shapes are left to recur; profiling
  // runs without graphs)
  if (device_ != Device::kCuda || shard_ || profile::enabled()) return 0;
  const int layers = num_mtp_layers();
  const std::vector<int64_t> counts = prepared_row_counts(rows, 1 + 3 * layers);
  if (counts.empty()) return 0;
  const int64_t S_max = counts.back(), H = cfg_.hidden_size;
  reserve_batch(prepared_reservation_rows(S_max, memory_), std::max(positions, S_max + 1));
  KVCache cache = new_cache(S_max);
  std::vector<KVCache> draft_caches;
  for (int l = 0; l < layers; ++l) draft_caches.push_back(new_draft_cache(S_max + 1));
  const std::vector<int32_t> tokens(size_t(S_max), 1);
  const std::vector<float> h_prev(size_t(S_max * H), 0.0f);
  for (int l = 0; l < layers; ++l)
    draft_forward(l, tokens.data(), h_prev.data(), 1, 0, draft_caches[size_t(l)], nullptr, nullptr);
  auto target = [&](int64_t S) {
    forward(tokens.data(), S, cache, nullptr, nullptr, false);
    cache.truncate(0);
  };
  auto draft = [&](int layer, int64_t S, const TopkOverride* forced) {
    KVCache& dc = draft_caches[size_t(layer)];
    draft_forward(layer, tokens.data(), h_prev.data(), S, 1, dc, nullptr, nullptr, forced);
    dc.truncate(1);
  };
  return walk_forward_shapes(counts, layers, target, draft);
}

// ---------------------------------------------------------------------------------------------------
// Forward

void HYV4Model::lm_head(const float* hidden, int64_t rows, float* logits) {
  blocks_->lm_head_rows(w_.lm_head, hidden, rows, logits, nullptr, 0);
}

void HYV4Model::forward(const int32_t* tokens, int64_t S, KVCache& cache, float* logits_out, float* hidden_out,
                        bool all_logits) {
  const CacheSegment seg{&cache, tokens, S, all_logits};
  forward(&seg, 1, logits_out, hidden_out);
}

void HYV4Model::forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) {
  std::vector<CacheSegment>& segs = batch_segments_;  // (capacity kept between forwards)
  segs.clear();
  for (size_t i = 0; i < count; ++i) {
    auto* seq = dynamic_cast<HYV4Sequence*>(segments[i].state);
    if (!seq || seq->owner() != this) throw Error("forward: a sequence does not belong to this model");
    segs.push_back({&seq->cache(), segments[i].tokens, segments[i].rows, segments[i].all_logits, segments[i].argmax});
  }
  forward(segs.data(), segs.size(), logits, hidden);
}

// The target forward, one builder over the backend's blocks (model.h has the data flow).
void HYV4Model::forward(const CacheSegment* segments, size_t count, float* logits_out, float* hidden_out) {
  const int64_t V = cfg_.vocab_size;
  // Rows of all segments, in order; each segment's rows follow its cache.
  int64_t S = 0;
  spans_.clear();
  for (size_t i = 0; i < count; ++i) {
    const CacheSegment& g = segments[i];
    if (g.rows <= 0) continue;
    if (g.cache->num_layers() != w_.layers.size()) throw Error("forward: cache does not belong to this model");
    g.cache->check_room(g.rows);
    check_token_ids(g.tokens, g.rows, V);
    spans_.push_back(
        {g.cache, S, g.rows, g.cache->length(), g.cache->length(), g.tokens, g.all_logits, nullptr, nullptr, g.argmax});
    S += g.rows;
  }
  if (S == 0) return;
  for (const CacheSegment* g = segments; g != segments + count; ++g)
    if (g->rows > 0) g->cache->prepare(g->rows);
  // (tensor parallel: this rank's blocks over its shard; every rank runs this builder with the same rows)
  HYV4Blocks& b = target_blocks();
  const HYV4Weights& w = target_weights();
  b.begin(spans_.data(), spans_.size());  // (after prepare: a backend may read the page tables)

  size_t routed_bytes = 0;
  b.embed_streams(w.embed);  // streams [S, C, H]
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const DecoderLayerWeights& L = w.layers[li];
    b.hyper_pre(L.attn_hc, L.input_norm);  // xn [S, H]
    b.attention(L, li, HYV4Out::kHyperPost);  // into the streams
    b.hyper_pre(L.ffn_hc, L.post_attn_norm);
    routed_bytes += b.ffn(L.ffn, HYV4Out::kHyperPost);
  }
  b.hc_head(w.hc_head_fn, w.hc_head_base, w.hc_head_scale, w.final_norm);  // hidden [S, H]
  b.finish();
  for (const HYV4RowSpan& sp : spans_) sp.cache->advance(sp.rows);
  last_routed_bytes_ = routed_bytes;
  if (hidden_out) b.read_hidden(0, S, hidden_out);
  if (logits_out) b.logits(w.lm_head, logits_out);
}

void HYV4Model::check_draft_request(const DraftRequest& r) const {
  const HYV4Config& c = cfg_;
  if (r.layer < 0 || r.layer >= num_mtp_layers())
    throw Error("draft_forward: MTP layer " + std::to_string(r.layer) + " does not exist (checkpoint has " +
                std::to_string(num_mtp_layers()) + ")");
  if (r.rows <= 0 || !r.cache) throw Error("draft_forward: a request without rows");
  r.cache->check_room(r.rows);
  // Canonical rows extend the layer's chain contiguously; forced (speculative) rows may sit anywhere.
  const int64_t next = r.cache->base_position() + r.cache->length();
  if ((!r.forced || r.forced->first_row > 0) && r.pos0 != next)
    throw Error("draft_forward: position " + std::to_string(r.pos0) + " does not follow the draft cache (next " +
                std::to_string(next) + ")");
  for (int64_t s = 0; s < r.rows; ++s)
    if (r.pos0 + s != 0 && (r.tokens[s] < 0 || r.tokens[s] >= c.vocab_size))
      throw Error("draft token id " + std::to_string(r.tokens[s]) + " outside the vocabulary");
}

void HYV4Model::draft_forward(int layer, const int32_t* tokens, const float* h_prev, int64_t S, int64_t pos0,
                              KVCache& dcache, float* logits_out, float* hidden_out, const TopkOverride* forced,
                              std::vector<int32_t>* last_topk_positions) {
  if (S <= 0) return;
  DraftRequest r = layer_request(layer, tokens, h_prev, S, pos0, &dcache, hidden_out, forced, last_topk_positions);
  DraftRequest* one = &r;
  draft_forward_batch(layer, &one, 1);
  if (logits_out) blocks_->logits(w_.lm_head, logits_out);  // (its one span wants every row's)
}

// The rows of all requests, in request order, through MTP layer `layer`; each request's rows extend its own
// cache (a row's values never depend on the other requests'). ws_.hidden keeps the outputs [S, H].
void HYV4Model::draft_forward_batch(int layer, DraftRequest* const* requests, size_t count) {
  int64_t S = 0;
  for (size_t i = 0; i < count; ++i) {
    check_draft_request(*requests[i]);
    if (requests[i]->layer != layer) throw Error("internal: draft requests of several layers in one forward");
    S += requests[i]->rows;
  }
  if (S == 0) return;
  const MtpLayerWeights& m = w_.mtp[layer];
  spans_.clear();
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    DraftRequest& r = *requests[i];
    spans_.push_back({r.cache, row, r.rows, r.cache->length(), r.pos0, r.tokens, true, r.forced, r.topk_out, nullptr});
    row += r.rows;
  }
  for (size_t i = 0; i < count; ++i) requests[i]->cache->prepare(requests[i]->rows);
  blocks_->begin(spans_.data(), spans_.size());
  blocks_->mtp_input(m, w_.embed, requests, count);  // x [S, H]
  blocks_->rms_norm(HYV4Act::kX, m.block.input_norm, HYV4Act::kXn);
  blocks_->attention(m.block, 0, HYV4Out::kAddToX);  // x += attention; the spans' last_topk filled
  blocks_->rms_norm(HYV4Act::kX, m.block.post_attn_norm, HYV4Act::kXn);
  blocks_->ffn(m.block.ffn, HYV4Out::kAddToX);
  blocks_->rms_norm(HYV4Act::kX, m.final_norm, HYV4Act::kHidden);
  blocks_->finish();
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    r.cache->advance(r.rows);
    if (r.hidden_out) blocks_->read_hidden(spans_[i].first_row, r.rows, r.hidden_out);
  }
}

}  // namespace nextn
