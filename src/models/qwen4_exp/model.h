// Qwen4-Exp: Gated DeltaNet linear-attention layers and QSA sparse-attention layers, GatedResidual
// hyper-connections over C = hc_count streams, MoE with a gated shared expert, PLE hashed n-gram embeddings
// on some linear layers, and an MTP head drafting from the pre-final-mixer streams (vLLM's
// Qwen4ExpMultiTokenPredictor, seed 001).
//
// One token through the target (H = hidden_size, streams X [C, H] = C·H floats):
//   X = C copies of embed(token)
//   per layer: [PLE] X += ple(X, n-gram ids of the token history)
//              x, inj = attn_hyper_connection(X)  [H], [C]    (mix of the per-stream-normed X)
//              y = gdn(x) or qsa_attention(x)      [H]
//              X += inj ⊗ y                         (every stream gets its own share of y)
//              x, inj = mlp_hyper_connection(X); y = moe(x); X += inj ⊗ y
//   hidden = X (what the MTP head reads)  ->  x = hyper_connection_mixer(X) [H]  ->  lm_head -> logits
//
// State of one sequence (Qwen4ExpSequence): the QSA layers' keys and values in KV pages (truncatable), and
// the recurrent state — per GDN layer its conv window and delta-rule matrix, per PLE layer its conv window —
// in `slots` copies: the state after n positions lives in slot n mod slots, so a verify of k+1 rows writes
// the state after each row and a rollback to any of them is a change of length, no copy and no recompute.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "io/safetensors.h"
#include "memory/kv_cache.h"
#include "models/common/chained_drafter.h"
#include "models/model.h"
#include "models/qwen4_exp/config.h"
#include "models/qwen4_exp/cpu_blocks.h"
#include "ops/ops.h"

namespace nextn {

class ThreadPool;
class Qwen4CudaBlocks;
namespace cuda {
class DeviceCommunicator;
}
struct Qwen4Shard;

// Gemma-style RMSNorm weights are stored as w and applied as (1 + w): `scale` holds 1 + w.
using NormScale = std::vector<float>;

struct GatedResidualWeights {  // hc_norm over C groups of H, low-rank input mix, block injection
  NormScale hc_norm;           // [C·H]
  Linear mix_down;             // [rank, C·H]
  Linear mix_up;               // [C·H, rank]
  Linear inject;               // [C, C·H]; absent (out = 0) in the final mixers
};

struct GdnWeights {            // Gated DeltaNet
  Linear in_q, in_k, in_v;     // [Kd, H], [Kd, H], [Vd, H]: row slices of the stored in_proj_qkv (tensor
                               // parallel ranks take their heads' rows of each)
  Linear in_z;                 // [Vd, H]
  Linear in_b, in_a;           // [nv, H]
  std::vector<float> conv;     // [conv_dim, K] depthwise causal kernel
  std::vector<float> neg_A;    // [nv] -exp(A_log)
  std::vector<float> dt_bias;  // [nv]
  std::vector<float> norm;     // [dv] gated RMSNorm weight (applied as is, not 1 + w)
  Linear out_proj;             // [H, Vd]
};

struct QsaWeights {            // gated attention with q/k norms, partial RoPE and the QSA indexer
  Linear q_proj;               // [heads·2·hd, H]: per head its query then its output gate
  Linear k_proj, v_proj;       // [kv·hd, H]
  Linear o_proj;               // [H, heads·hd]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // attention_bias only (the Linears' bias points here)
  NormScale q_norm, k_norm;    // [hd]
  Linear index_qk;             // [(ih + 1)·ihd, H]: indexer queries, then the one raw key
  NormScale index_q_norm, index_k_norm;  // [ihd]
};

struct MoeWeights {
  Linear router;                               // [E, H]
  std::vector<Linear> gate, up, down;          // E × [I, H], [I, H], [H, I]
  Linear shared_gate, shared_up, shared_down;  // [Is, H], [Is, H], [H, Is]
  Linear shared_expert_gate;                   // [1, H]
};

struct PleWeights {
  std::vector<Linear> table_shards;  // the n-gram embedding [rows, head_dim] in checkpoint shards (dim 0)
  std::vector<int64_t> shard_starts; // first row of each shard, then the total
  std::vector<int64_t> head_sizes, head_offsets;  // per n-gram head: its prime vocabulary and table offset
  std::vector<int64_t> multipliers;               // [ngram_size] hash multipliers
  Linear key_proj;                   // [C·H, E]
  Linear value_proj;                 // [H, E]
  NormScale norm_key, norm_query, norm_conv;  // [C·H]
  std::vector<float> conv;           // [C·H, K] dilated depthwise kernel (dilation ngram_size)
};

struct Qwen4LayerWeights {
  Qwen4LayerKind kind = Qwen4LayerKind::Linear;
  GatedResidualWeights attn_hc, mlp_hc;
  GdnWeights gdn;
  QsaWeights attn;
  MoeWeights moe;
  bool has_ple = false;
  PleWeights ple;
};

struct Qwen4MtpWeights {
  NormScale pre_fc_norm_embedding;  // [H]
  NormScale pre_fc_norm_hidden;     // [C·H], one norm over all streams
  Linear fc_embedding, fc_hidden;   // [H, H]; fc_hidden is shared by the streams
  std::vector<Qwen4LayerWeights> layers;
  GatedResidualWeights mixer;       // the MTP head's own final mixer (its block_inject_weight is dropped)
};

struct Qwen4ExpWeights {
  Linear embed;  // [V, H]
  std::vector<Qwen4LayerWeights> layers;
  GatedResidualWeights mixer;
  Linear lm_head;  // [V, H]
  Qwen4MtpWeights mtp;  // no layers: no draft
};

class Qwen4ExpModel;

// One sequence: token history, QSA KV pages, and the recurrent state slots.
class Qwen4ExpSequence : public SequenceState {
 public:
  // `live` counts the model's sequences holding recurrent state (this one until it is destroyed).
  // host_state: the slots live in host memory (the CPU backend); else the device backend attaches its own.
  Qwen4ExpSequence(const Qwen4ExpModel* owner, KVCache kv, int64_t capacity, int64_t slots, int64_t slot_floats,
                   bool has_kv, std::shared_ptr<int64_t> live, bool host_state = true);
  ~Qwen4ExpSequence() override;
  const Qwen4ExpModel* owner() const { return owner_; }
  int64_t length() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t capacity() const override { return capacity_; }
  // n > length() - slots: the state of every such length is still in its slot.
  void rollback(int64_t n) override;

  KVCache& kv() { return kv_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  std::vector<int32_t>& tokens() { return tokens_; }
  int64_t slots() const { return slots_; }
  int64_t slot_floats() const { return slot_floats_; }
  // The state after `length` positions (slot length mod slots).
  float* state(int64_t length) { return states_.data() + (length % slots_) * slot_floats_; }
  bool has_kv() const { return has_kv_; }
  // The device address of the state slots a device backend keeps for this sequence (released with it); null on
  // the CPU.
  void* device_state() const { return device_state_.get(); }
  void set_device_state(std::shared_ptr<void> state) { device_state_ = std::move(state); }

 private:
  const Qwen4ExpModel* owner_;
  KVCache kv_;
  std::vector<int32_t> tokens_;  // reserved to capacity: appending never allocates
  int64_t capacity_, slots_, slot_floats_;
  bool has_kv_;
  AlignedFloats states_;         // [slots, slot_floats] (empty when a device backend keeps them)
  std::shared_ptr<void> device_state_;
  std::shared_ptr<int64_t> live_;
};

class Qwen4ExpModel : public Model {
 public:
  Qwen4ExpModel(const std::string& model_dir, ThreadPool* pool);
  ~Qwen4ExpModel() override;

  const Qwen4ExpConfig& config() const { return cfg_; }
  const Qwen4ExpWeights& weights() const { return w_; }
  int num_mtp_layers() const { return static_cast<int>(w_.mtp.layers.size()); }

  // ---- Model
  const ModelFacts& facts() const override { return facts_; }
  ThreadPool* host_pool() const override;
  void prefault(bool progress) const override;
  void configure_memory(const MemoryOptions& options) override;
  bool can_admit(int64_t capacity, bool drafting) const override;
  bool could_ever_admit(int64_t capacity, bool drafting) const override;
  std::string memory_summary() const override;
  double kv_usage() const override;
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override;
  std::unique_ptr<DraftSession> new_draft_session(SequenceState& sequence, const DraftOptions& options) override;
  // Both backends (the CUDA one's end-to-end tests, tests/cuda_qwen4_exp_test.cpp, pass on an H100).
  bool runs_on(Device) const override { return true; }
  // Moves the forwards to `device` (before any sequence exists); the CUDA backend uploads the weights.
  void use_device(Device device) override;
  Device device() const override { return device_; }
  uint64_t one_off_forwards() const override;
  void reserve_batch(int64_t rows, int64_t positions) override;
  int64_t prepare_forwards(int64_t rows, int64_t positions) override;
  void forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) override;
  // This model as rank comm.rank() of a tensor-parallel group (sharding.h): its target forwards compute over
  // its shard (its recurrent state and KV heads only) and meet the other ranks in comm's collectives; MTP
  // forwards stay whole and local (rank 0's). Memory is sized from the whole model's shapes, so that every
  // rank's pools hold the same number of pages and sequences.
  void make_tensor_parallel_rank(Communicator& comm) override;
  void check_tensor_parallel(int ranks) const override;
  bool shards_on(Device) const override { return true; }
  std::string collectives() const override;
  void prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) override;
  size_t checkpoint_bytes() const override;
  size_t weight_bytes_total() const override;
  size_t last_forward_weight_bytes() const override;
  // Target: per QSA layer its key and value rows and its indexer key (raw and block-pooled); drafting adds
  // the same per MTP layer. The recurrent state is per sequence, not per position (state_bytes).
  int64_t kv_bytes_per_position(bool drafting) const override;
  int64_t memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const override;
  // Bytes of one sequence's recurrent state (all slots).
  int64_t state_bytes() const;

  // ---- what ChainedDraftSession needs (models/common/chained_drafter.h)
  int64_t draft_width() const { return cfg_.hc_width(); }
  int64_t draft_selection_max() const { return cfg_.indexer_budget + cfg_.indexer_compress_ratio; }
  KVCache new_shared_draft_cache(int64_t capacity);
  // MTP layer `layer` over positions pos0..pos0+S-1, appended to its cache: row s gets token tokens[s] and
  // the multi-stream hidden h_prev[s] ([S, C·H]: the target's pre-mixer streams, or the previous MTP layer's
  // output); hidden_out [S, C·H] its output streams; logits_out [S, V] (may be null).
  void draft_forward(int layer, const int32_t* tokens, const float* h_prev, int64_t S, int64_t pos0,
                     KVCache& dcache, float* logits_out, float* hidden_out, const TopkOverride* forced = nullptr,
                     std::vector<int32_t>* last_topk_positions = nullptr);
  void check_draft_request(const DraftRequest& r) const;
  // draft_forward for the requests of many sequences (one MTP layer), in one forward.
  void draft_forward_batch(int layer, DraftRequest* const* requests, size_t count);
  // mtp mixer + lm_head
  void draft_logits_rows(const float* hidden, int64_t rows, float* logits, int32_t* argmax, int64_t argmax_rows);
  std::string use_draft_head(DraftHeadKind kind) override;
  void run_draft_rounds(DraftRound* const* rounds, size_t n) override { draft_driver_.run(*this, rounds, n); }

 private:
  void init_facts();
  size_t weight_bytes_with(size_t routed_bytes) const;
  int64_t state_slot_floats() const;
  // One QSA layer's planes under config c: [k | v], [raw index key | pooled block key].
  static std::vector<int64_t> plane_widths(const Qwen4ExpConfig& c);
  // Where each layer's state sits in a slot under config c (slots: memory_'s), and a slot's floats.
  Qwen4StateLayout state_layout(const Qwen4ExpConfig& c) const;
  static int64_t slot_floats(const Qwen4ExpConfig& c, const Qwen4StateLayout& layout);
  // The target forward's config, state layout, blocks and weights: this rank's shard's when tensor parallel.
  const Qwen4ExpConfig& target_cfg() const;
  Qwen4ExpBlocks& target_blocks();
  const Qwen4ExpWeights& target_weights() const;
  std::vector<LayerPlanes> target_planes() const;
  int64_t sequence_bytes(int64_t capacity, bool drafting) const;
  void ensure_pools();
  // One decoder layer over the streams of the current forward; returns the routed expert bytes it read.
  size_t layer_forward(Qwen4ExpBlocks& b, const Qwen4LayerWeights& L, int layer, int qsa_layer);

  std::string dir_;
  Qwen4ExpConfig cfg_;
  ModelFacts facts_;
  WeightStore store_;
  Qwen4ExpWeights w_;
  std::vector<int> qsa_index_;      // per layer: its index among the QSA layers (-1: linear)
  Qwen4StateLayout layout_;         // where each layer's state sits in a sequence's slots, and how many
  // The backend that computes the blocks (the CPU's, or the GPU's after use_device), and the spans of the
  // current forward.
  std::unique_ptr<Qwen4CpuBlocks> cpu_blocks_;
  std::unique_ptr<Qwen4ExpBlocks> device_blocks_;
  Qwen4ExpBlocks* blocks_ = nullptr;
  Device device_ = Device::kCpu;
  std::unique_ptr<Qwen4Shard> shard_;             // tensor parallel: this rank's part of the target
  Qwen4StateLayout shard_layout_;                 // ... its state layout
  std::unique_ptr<Qwen4CpuBlocks> shard_blocks_;  // ... and the blocks that compute over it
  Communicator* tp_comm_ = nullptr;                // ... the group's host communicator
  // A tensor-parallel rank on a GPU: the shard's CUDA blocks, their collectives, and (rank 0) the MTP layers'
  // blocks over the whole weights in device_blocks_.
  std::unique_ptr<Qwen4CudaBlocks> shard_device_blocks_;
  std::unique_ptr<cuda::DeviceCommunicator> device_comm_;
  void use_device_as_rank(Device device);
  std::vector<Qwen4RowSpan> spans_;
  ChainedDraftDriver<Qwen4ExpModel> draft_driver_;
  MemoryOptions memory_;
  DraftHead draft_head_;  // the draft steps' lm_head (use_draft_head)
  std::shared_ptr<KVPool> target_pool_, draft_pool_;
  int64_t state_sets_ = 0;          // sequences whose recurrent state the memory budget holds (0: unbounded)
  std::shared_ptr<int64_t> live_states_ = std::make_shared<int64_t>(0);  // sequences holding one now
  size_t last_routed_bytes_ = 0;  // routed expert weights the last complete target forward read

};

// transformers' checkpoint -> internal names for qwen4_exp(_text) (conversion_mapping.py): the composite's
// model.language_model.* becomes model.*; other names are kept.
std::string qwen4_exp_canonical_name(const std::string& checkpoint_name);

// Binding (loader.cpp).
struct Qwen4ExpLoadReport;
void bind_qwen4_exp_weights(const Qwen4ExpConfig& c, const WeightStore& store, Qwen4ExpWeights& w,
                            LoadReport& r);

}  // namespace nextn
