// Qwen4-Exp: memory, sequences, and the forwards as builders over the backend's blocks (blocks.h); model.h
// has the data flow.
#include "models/qwen4_exp/model.h"
#include "models/qwen4_exp/sharding.h"
#include "core/communicator.h"
#include "models/qwen4_exp/cuda_blocks.h"
#include "models/common/device_memory.h"
#include "ops/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/finite.h"
#include "core/profile.h"
#include "core/sizes.h"
#include "core/threadpool.h"
#include "models/common/mlp_bytes.h"
#include "models/common/prepared_forwards.h"
#include "models/common/scan.h"

namespace nextn {


// ---------------------------------------------------------------------------------------------------
// Sequences

Qwen4ExpSequence::Qwen4ExpSequence(const Qwen4ExpModel* owner, KVCache kv, int64_t capacity, int64_t slots,
                                   int64_t slot_floats, bool has_kv, std::shared_ptr<int64_t> live, bool host_state)
    : owner_(owner), kv_(std::move(kv)), capacity_(capacity), slots_(slots), slot_floats_(slot_floats),
      has_kv_(has_kv), live_(std::move(live)) {
  tokens_.reserve(static_cast<size_t>(capacity));
  if (host_state) states_.assign(static_cast<size_t>(slots * slot_floats), 0.0f);  // the state of length 0: zeros
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
    : dir_(model_dir), cfg_(load_qwen4_exp_config(model_dir)), store_(WeightStore::open_dir(model_dir)),
      cpu_blocks_(std::make_unique<Qwen4CpuBlocks>(cfg_, layout_, pool)), blocks_(cpu_blocks_.get()) {
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
  int q = 0;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i)
    qsa_index_.push_back(cfg_.kinds[i] == Qwen4LayerKind::Linear ? -1 : q++);
  layout_ = state_layout(cfg_);
}

// Each layer's place in a sequence's memory: QSA layers in KV planes, GDN / PLE state in the slots.
Qwen4StateLayout Qwen4ExpModel::state_layout(const Qwen4ExpConfig& c) const {
  Qwen4StateLayout layout;
  int64_t off = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const bool linear = c.kinds[i] == Qwen4LayerKind::Linear;
    layout.state_off.push_back(linear ? off : -1);
    if (linear)
      off += int64_t(c.linear_conv_kernel_dim - 1) * c.conv_dim() +
             int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
    layout.ple_off.push_back(w_.layers[i].has_ple ? off : -1);
    if (w_.layers[i].has_ple) off += c.ple_conv_state_rows() * c.hc_width();
  }
  layout.slots = std::max<int64_t>(memory_.max_verify_rows, 1);
  return layout;
}

void Qwen4ExpModel::use_device(Device device) {
  if (device == device_) return;
  if (target_pool_) throw Error("use_device: the model already has sequences on its current device");
  if (shard_) return use_device_as_rank(device);
  if (device == Device::kCuda) {
    require_device_room(dir_, checkpoint_bytes());
    device_blocks_ = std::make_unique<Qwen4CudaBlocks>(cfg_, layout_, w_);
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
void Qwen4ExpModel::use_device_as_rank(Device device) {
  shard_device_blocks_.reset();
  device_comm_.reset();
  device_blocks_.reset();
  blocks_ = cpu_blocks_.get();
  device_ = Device::kCpu;
  if (device != Device::kCuda) return;
  device_comm_ = join_gpu_group(*tp_comm_, dir_, checkpoint_bytes() / size_t(tp_comm_->size()));
  shard_device_blocks_ = std::make_unique<Qwen4CudaBlocks>(shard_->config, shard_layout_, shard_->weights);
  shard_device_blocks_->set_tensor_parallel(device_comm_.get(), shard_->vocab);
  if (tp_comm_->rank() == 0) {
    device_blocks_ =
        std::make_unique<Qwen4CudaBlocks>(cfg_, layout_, w_, Qwen4CudaBlocks::Uploads::kAllButTargetLayers);
    blocks_ = device_blocks_.get();
    draft_head_.hold_in(*blocks_);
  }
  device_ = device;
}

std::string Qwen4ExpModel::collectives() const { return device_comm_ ? device_comm_->describe() : ""; }

uint64_t Qwen4ExpModel::one_off_forwards() const {
  const Qwen4ExpBlocks* shard = shard_device_blocks_.get();  // (a rank's target forwards, on its GPU)
  return blocks_->one_off_forwards() + (shard ? shard->one_off_forwards() : 0);
}

void Qwen4ExpModel::make_tensor_parallel_rank(Communicator& comm) {
  if (target_pool_) throw Error("tensor parallel: the model already has sequences");
  if (device_ != Device::kCpu) throw Error("tensor parallel: make the ranks before moving them to a GPU");
  tp_comm_ = &comm;
  shard_ = std::make_unique<Qwen4Shard>(shard_qwen4_target(cfg_, w_, comm.rank(), comm.size()));
  shard_layout_ = state_layout(shard_->config);
  shard_blocks_ = std::make_unique<Qwen4CpuBlocks>(shard_->config, shard_layout_, cpu_blocks_->pool());
  shard_blocks_->set_tensor_parallel(&comm, shard_->vocab);
}

void Qwen4ExpModel::check_tensor_parallel(int ranks) const {
  if (device_ != Device::kCpu) throw Error("tensor parallel: make the ranks before moving them to a GPU");
  for (int r = 0; r < ranks; ++r) shard_qwen4_target(cfg_, w_, r, ranks);
}

const Qwen4ExpConfig& Qwen4ExpModel::target_cfg() const { return shard_ ? shard_->config : cfg_; }
Qwen4ExpBlocks& Qwen4ExpModel::target_blocks() {
  if (!shard_) return *blocks_;
  return shard_device_blocks_ ? static_cast<Qwen4ExpBlocks&>(*shard_device_blocks_) : *shard_blocks_;
}
const Qwen4ExpWeights& Qwen4ExpModel::target_weights() const { return shard_ ? shard_->weights : w_; }

ThreadPool* Qwen4ExpModel::host_pool() const { return cpu_blocks_->pool(); }

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
      total += g.in_q.weight_bytes() + g.in_k.weight_bytes() + g.in_v.weight_bytes() +
               g.in_z.weight_bytes() + g.in_a.weight_bytes() + g.in_b.weight_bytes() +
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

std::vector<int64_t> Qwen4ExpModel::plane_widths(const Qwen4ExpConfig& c) {
  const int64_t kv = int64_t(c.num_key_value_heads) * c.head_dim;
  return {2 * kv, 2 * int64_t(c.indexer_head_dim)};
}

std::vector<LayerPlanes> Qwen4ExpModel::target_planes() const {
  std::vector<LayerPlanes> layers;
  for (int q : qsa_index_)
    if (q >= 0) layers.push_back(LayerPlanes{2 * q, 2 * q + 1});
  return layers;
}

// (the whole model's: what memory is sized by, on every rank alike)
int64_t Qwen4ExpModel::state_slot_floats() const { return slot_floats(cfg_, layout_); }

int64_t Qwen4ExpModel::slot_floats(const Qwen4ExpConfig& c, const Qwen4StateLayout& layout) {
  int64_t floats = 0;
  for (size_t i = 0; i < layout.state_off.size(); ++i) {
    if (layout.state_off[i] >= 0)
      floats = std::max(floats, layout.state_off[i] + int64_t(c.linear_conv_kernel_dim - 1) * c.conv_dim() +
                                    int64_t(c.linear_num_value_heads) * c.linear_key_head_dim *
                                        c.linear_value_head_dim);
    if (layout.ple_off[i] >= 0) floats = std::max(floats, layout.ple_off[i] + c.ple_conv_state_rows() * c.hc_width());
  }
  return floats;
}

int64_t Qwen4ExpModel::state_bytes() const {
  return checked_mul(checked_mul(layout_.slots, state_slot_floats(), "recurrent state"), int64_t(sizeof(float)),
                     "recurrent state");
}

int64_t Qwen4ExpModel::kv_bytes_per_position(bool drafting) const {
  const auto widths = plane_widths(cfg_);
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
  layout_.slots = options.max_verify_rows;
  shard_layout_.slots = options.max_verify_rows;
}

// Pools are made at the first sequence. With --kv-cache-mb the bytes cover the KV pages and the recurrent
// state: a quarter (at most) goes to the state of as many sequences as it holds, the rest to pages. By default
// the pages hold one sequence as long as the context and the state 16 sequences.
void Qwen4ExpModel::ensure_pools() {
  if (target_pool_) return;
  const int64_t page = memory_.page_tokens;
  // Pages and state sets are counted with the whole model's shapes (every tensor-parallel rank counts alike);
  // the target pool's planes are this rank's (its KV heads).
  const auto widths = plane_widths(cfg_), own = plane_widths(target_cfg());
  std::vector<int64_t> whole_widths, target_widths;
  for (size_t i = 0; i < target_planes().size(); ++i) {
    whole_widths.insert(whole_widths.end(), widths.begin(), widths.end());
    target_widths.insert(target_widths.end(), own.begin(), own.end());
  }
  if (target_widths.empty()) {  // no QSA layer: an empty pool the caches never use
    whole_widths.push_back(1);
    target_widths.push_back(1);
  }
  const int64_t nl = num_mtp_layers();
  const int64_t t = KVPool::bytes_per_page(whole_widths, page), d = nl * KVPool::bytes_per_page(widths, page);
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
         " per sequence (" + std::to_string(layout_.slots) + " slots; " + std::to_string(*live_states_) + " of " +
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
  const int64_t floats = shard_ ? slot_floats(shard_->config, shard_layout_) : state_slot_floats();
  return std::make_unique<Qwen4ExpSequence>(this, std::move(kv), capacity, layout_.slots, floats, has_kv, live_states_,
                                            device_ == Device::kCpu);
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
  auto pool = std::make_shared<KVPool>("MTP draft KV cache", plane_widths(cfg_), page, (T + page - 1) / page);
  KVCache dc(pool, {LayerPlanes{0, 1}}, T);
  draft_forward(0, tokens + 1, hidden, T - 1, 0, dc, logits, nullptr, nullptr, nullptr);
}

// The shapes of a batch of up to `rows` rows (prepared_forwards.h): the target's over a scratch sequence of S_max
// positions (a new one each run: its recurrent state rolls back only k + 1 rows), each MTP layer's over a scratch
// cache of the shared draft pool (slot 0 written first, for the forced rows). A KV pool too small for them
// leaves the shapes to be recorded as they recur.
int64_t Qwen4ExpModel::prepare_forwards(int64_t rows, int64_t positions) {
  if (device_ != Device::kCuda || shard_ || profile::enabled()) return 0;  // (as HYV4Model's)
  const int layers = num_mtp_layers();
  const std::vector<int64_t> counts = prepared_row_counts(rows, 1 + 3 * layers);
  if (counts.empty()) return 0;
  const int64_t S_max = counts.back();
  if (!can_admit(S_max + 1, true)) return 0;
  reserve_batch(prepared_reservation_rows(S_max, memory_), std::max(positions, S_max + 1));
  std::vector<KVCache> draft_caches;
  for (int l = 0; l < layers; ++l) draft_caches.push_back(new_shared_draft_cache(S_max + 1));
  const std::vector<int32_t> tokens(size_t(S_max), 1);
  const std::vector<float> h_prev(size_t(S_max * draft_width()), 0.0f);
  for (int l = 0; l < layers; ++l)
    draft_forward(l, tokens.data(), h_prev.data(), 1, 0, draft_caches[size_t(l)], nullptr, nullptr);
  auto target = [&](int64_t S) {
    const std::unique_ptr<SequenceState> seq = new_sequence(S_max);
    const BatchSegment segment{seq.get(), tokens.data(), S, false, nullptr};
    forward(&segment, 1, nullptr, nullptr);
  };
  auto draft = [&](int layer, int64_t S, const TopkOverride* forced) {
    KVCache& dc = draft_caches[size_t(layer)];
    draft_forward(layer, tokens.data(), h_prev.data(), S, 1, dc, nullptr, nullptr, forced);
    dc.truncate(1);
  };
  return walk_forward_shapes(counts, layers, target, draft);
}

void Qwen4ExpModel::reserve_batch(int64_t rows, int64_t positions) {
  blocks_->reserve(rows, positions, memory_.page_tokens);
  if (shard_) target_blocks().reserve(rows, positions, memory_.page_tokens);
  spans_.reserve(static_cast<size_t>(rows));
}

// One decoder layer over the batch's streams X [S, C·H] (in the backend).
size_t Qwen4ExpModel::layer_forward(Qwen4ExpBlocks& b, const Qwen4LayerWeights& L, int layer, int qsa_layer) {
  if (L.has_ple) b.ple_add(L.ple, layer);
  b.gated_residual(L.attn_hc, /*inject=*/true);  // x [S, H], inj [S, C]
  if (L.kind == Qwen4LayerKind::Linear)
    b.gdn(L.gdn, layer);  // y [S, H]
  else
    b.qsa(L.attn, static_cast<size_t>(qsa_layer));
  b.inject();
  b.gated_residual(L.mlp_hc, true);
  const size_t routed = b.moe(L.moe);
  b.inject();
  return routed;
}

// ---------------------------------------------------------------------------------------------------
// Forwards

void Qwen4ExpModel::forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) {
  const int64_t V = cfg_.vocab_size;
  int64_t S = 0;
  spans_.clear();
  for (size_t i = 0; i < count; ++i) {
    const BatchSegment& g = segments[i];
    if (g.rows <= 0) continue;
    auto* seq = dynamic_cast<Qwen4ExpSequence*>(g.state);
    if (!seq || seq->owner() != this) throw Error("forward: a sequence does not belong to this model");
    if (seq->length() + g.rows > seq->capacity())
      throw Error("forward: " + std::to_string(g.rows) + " more positions do not fit the sequence's " +
                  std::to_string(seq->capacity()));
    check_token_ids(g.tokens, g.rows, V);
    spans_.push_back(
        {seq, seq->has_kv() ? &seq->kv() : nullptr, S, g.rows, seq->length(), seq->length(), g.tokens, g.all_logits,
         nullptr, nullptr, g.argmax});
    S += g.rows;
  }
  if (S == 0) return;
  // (tensor parallel: this rank's blocks over its shard; every rank runs this builder with the same rows)
  Qwen4ExpBlocks& b = target_blocks();
  const Qwen4ExpWeights& w = target_weights();
  for (Qwen4RowSpan& sp : spans_)
    if (sp.cache) sp.cache->prepare(sp.rows);
  b.begin(spans_.data(), spans_.size());  // (after prepare: a backend may read the page tables)
  for (Qwen4RowSpan& sp : spans_) sp.seq->tokens().insert(sp.seq->tokens().end(), sp.tokens, sp.tokens + sp.rows);
  size_t routed = 0;
  b.embed_streams(w.embed);  // X [S, C·H]
  for (size_t li = 0; li < w.layers.size(); ++li)
    routed += layer_forward(b, w.layers[li], static_cast<int>(li), qsa_index_[li]);
  b.finish();
  for (const Qwen4RowSpan& sp : spans_)
    if (sp.cache) sp.cache->advance(sp.rows);
  last_routed_bytes_ = routed;
  if (hidden) b.read_streams(0, S, hidden);
  if (!logits) return;
  b.logits(w.mixer, w.lm_head, logits);  // (segments with argmax: their ids, not their rows)
}

void Qwen4ExpModel::check_draft_request(const DraftRequest& r) const {
  const int64_t V = cfg_.vocab_size;
  if (r.layer < 0 || r.layer >= num_mtp_layers()) throw Error("draft_forward: no MTP layer " + std::to_string(r.layer));
  if (r.rows <= 0 || !r.cache) throw Error("draft_forward: a request without rows");
  check_token_ids(r.tokens, r.rows, V);
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
  if (logits_out) blocks_->logits(w_.mtp.mixer, w_.lm_head, logits_out);  // (its one span wants every row's)
}

// The rows of all requests, in request order, through MTP layer `layer`; each request's rows extend its own
// cache (a row's values never depend on the other requests'). b_.X keeps the output streams [S, C·H].
void Qwen4ExpModel::draft_forward_batch(int layer, DraftRequest* const* requests, size_t count) {
  int64_t S = 0;
  for (size_t i = 0; i < count; ++i) {
    check_draft_request(*requests[i]);
    if (requests[i]->layer != layer) throw Error("internal: draft requests of several layers in one forward");
    S += requests[i]->rows;
  }
  if (S == 0) return;
  spans_.clear();
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    DraftRequest& r = *requests[i];
    spans_.push_back({nullptr, r.cache, row, r.rows, r.cache->length(), r.pos0, r.tokens, true, r.forced, r.topk_out,
                      nullptr});
    row += r.rows;
  }
  for (size_t i = 0; i < count; ++i) requests[i]->cache->prepare(requests[i]->rows);
  blocks_->begin(spans_.data(), spans_.size());  // (after prepare: a backend may read the page tables)
  blocks_->mtp_input(w_.mtp, w_.embed, requests, count);  // X [S, C·H]
  layer_forward(*blocks_, w_.mtp.layers[layer], -1, 0);
  blocks_->finish();
  for (size_t i = 0; i < count; ++i) {
    const DraftRequest& r = *requests[i];
    r.cache->advance(r.rows);
    if (r.hidden_out) blocks_->read_streams(spans_[i].first_row, r.rows, r.hidden_out);
  }
}

void Qwen4ExpModel::draft_logits_rows(const float* hidden, int64_t rows, float* logits, int32_t* argmax,
                                      int64_t argmax_rows) {
  blocks_->logits_of(w_.mtp.mixer, draft_head_.for_drafts(w_.lm_head), hidden, rows, logits, argmax, argmax_rows);
}

std::string Qwen4ExpModel::use_draft_head(DraftHeadKind kind) {
  if (num_mtp_layers() == 0) return "";
  draft_head_.build(w_.lm_head, kind, cpu_blocks_->pool());
  draft_head_.hold_in(*blocks_);
  return draft_head_.describe(w_.lm_head);
}

}  // namespace nextn
